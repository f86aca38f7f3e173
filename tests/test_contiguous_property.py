"""ExtentAllocator against a reference bitmap: random allocations and frees keep first fit exact."""

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.contiguous import ExtentAllocator


def first_fit(bitmap: list[bool], n: int) -> int | None:
    run = 0
    for i, used in enumerate(bitmap):
        run = 0 if used else run + 1
        if run == n:
            return i - n + 1
    return None


def largest_run(bitmap: list[bool]) -> int:
    best = run = 0
    for used in bitmap:
        run = 0 if used else run + 1
        best = max(best, run)
    return best


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 40), ops=st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=60))
def test_matches_a_bitmap(size, ops):
    a = ExtentAllocator(size)
    bitmap = [False] * size
    held: list[tuple[int, int]] = []
    for is_alloc, x in ops:
        if is_alloc or not held:
            want = first_fit(bitmap, x)
            got = a.allocate(x)
            assert got == want
            if got is not None:
                bitmap[got:got + x] = [True] * x
                held.append((got, x))
        else:
            start, n = held.pop(x % len(held))
            a.free(start, n)
            bitmap[start:start + n] = [False] * n
        assert a.num_free == bitmap.count(False)
        assert a.largest_free() == largest_run(bitmap)
        a.check_integrity(held)
