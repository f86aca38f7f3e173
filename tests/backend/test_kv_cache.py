"""Copy-on-write and swap round trips leave block contents bit-identical."""

import pytest

torch = pytest.importorskip("torch")

from backend.kv_cache import PagedKVCache  # noqa: E402


def _filled(num_layers=2, blocks=6, cpu_blocks=4, dtype=torch.float16):
    kv = PagedKVCache(num_layers, blocks, 16, 2, 64, dtype, "cpu", num_cpu_blocks=cpu_blocks)
    gen = torch.Generator().manual_seed(0)
    for t in kv.k + kv.v:
        t.copy_(torch.randn(t.shape, generator=gen).to(dtype))
    return kv


def test_copy_on_write_copies_every_layer_exactly():
    kv = _filled()
    before = [t.clone() for t in kv.k + kv.v]
    kv.copy([(1, 4), (3, 5)])
    for old, new in zip(before, kv.k + kv.v):
        assert torch.equal(new[4], old[1]) and torch.equal(new[5], old[3])
        assert torch.equal(new[:4], old[:4])                   # sources and others untouched


def test_swap_round_trip_is_bit_identical():
    kv = _filled(dtype=torch.bfloat16)
    before = [t.clone() for t in kv.k + kv.v]
    kv.swap_out([(2, 0), (5, 3)])
    for t in kv.k + kv.v:
        t[2].fill_(float("nan"))                               # the device blocks get reused meanwhile
        t[5].zero_()
    kv.swap_in([(0, 1), (3, 4)])                               # back into different device blocks
    for old, new in zip(before, kv.k + kv.v):
        assert torch.equal(new[1].view(torch.int16), old[2].view(torch.int16))
        assert torch.equal(new[4].view(torch.int16), old[5].view(torch.int16))


def test_out_of_range_pairs_are_refused():
    kv = _filled()
    with pytest.raises(IndexError):
        kv.swap_out([(0, 4)])
    with pytest.raises(IndexError):
        kv.copy([(6, 0)])


def test_block_bytes():
    kv = _filled(num_layers=2)
    assert kv.block_nbytes() == 2 * 2 * 16 * 2 * 64 * 2        # K,V x layers x tokens x heads x dim x fp16
