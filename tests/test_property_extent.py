"""Property test (hypothesis stateful) for the contiguous baselines' extent allocator, against a bitmap:

- allocate(n) returns the lowest start of a run of n free blocks (first fit), or None when no run fits;
- after any sequence of allocate / free, the free extents are exactly the maximal free runs of the
  bitmap (freed runs coalesce with their neighbours); free + used = total; the largest free extent is
  the longest free run, and external fragmentation is every free block outside it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.kv.contiguous import ExtentAllocator

N = 24


def _runs(bitmap: list[bool]) -> dict[int, int]:
    """Maximal runs of free (False) blocks: start -> length."""
    runs: dict[int, int] = {}
    start = None
    for i, used in enumerate(bitmap + [True]):
        if not used and start is None:
            start = i
        elif used and start is not None:
            runs[start] = i - start
            start = None
    return runs


class ExtentMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = ExtentAllocator(N)
        self.used = [False] * N
        self.regions: list[tuple[int, int]] = []

    @rule(n=st.integers(1, 8))
    def allocate(self, n: int) -> None:
        fits = [s for s, length in sorted(_runs(self.used).items()) if length >= n]
        got = self.alloc.allocate(n)
        assert got == (fits[0] if fits else None)
        if got is not None:
            for b in range(got, got + n):
                self.used[b] = True
            self.regions.append((got, n))

    @precondition(lambda self: self.regions)
    @rule(data=st.data())
    def free(self, data) -> None:
        start, n = self.regions.pop(data.draw(st.integers(0, len(self.regions) - 1)))
        self.alloc.free(start, n)
        for b in range(start, start + n):
            self.used[b] = False

    @invariant()
    def matches_the_bitmap(self) -> None:
        runs = _runs(self.used)
        assert self.alloc.starts == sorted(runs)
        assert self.alloc.lengths == runs
        assert self.alloc.num_free == self.used.count(False)
        assert self.alloc.num_free + sum(n for _, n in self.regions) == N
        assert self.alloc.largest_free() == max(runs.values(), default=0)
        self.alloc.check_integrity(self.regions)


ExtentMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestExtentAllocator = ExtentMachine.TestCase
