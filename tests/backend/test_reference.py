"""The reference kernels against per-sequence dense attention (torch SDPA on the gathered K/V)."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from backend_cases import gather_dense, paged_case  # noqa: E402

from backend import reference as ref  # noqa: E402


def _sdpa(q, k, v, scale, causal_offset=None):
    """q [n, H, D], k/v [T, KVH, D] -> [n, H, D] in fp64, GQA by repeating K/V heads."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1).transpose(0, 1)
    v = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    mask = None
    if causal_offset is not None:
        qpos = causal_offset + torch.arange(q.shape[0])
        mask = torch.arange(k.shape[1])[None, :] <= qpos[:, None]
    out = F.scaled_dot_product_attention(q.double().transpose(0, 1), k, v, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


@pytest.mark.parametrize("group", [1, 4])
def test_decode_reference_matches_dense(group):
    lens = [1, 15, 16, 17, 200]
    k, v, tables, heads = paged_case(lens, 2, group, 64, torch.float32, seed=group)
    q = torch.randn(len(lens), heads, 64)
    out = ref.paged_decode_attention(q, k, v, tables, torch.tensor(lens, dtype=torch.int32), 0.125)
    for i, n in enumerate(lens):
        want = _sdpa(q[i:i + 1], gather_dense(k, tables[i], n), gather_dense(v, tables[i], n), 0.125)[0]
        assert (out[i].double() - want).abs().max() < 1e-5


def test_decode_reference_ignores_nan_in_unused_slots():
    k, v, tables, heads = paged_case([5, 20], 1, 2, 64, torch.float32)
    kn, vn = k.clone(), v.clone()
    blk0 = int(tables[0, 0])
    kn[blk0, 5:] = float("nan")
    vn[blk0, 5:] = float("nan")
    lens = torch.tensor([5, 20], dtype=torch.int32)
    q = torch.randn(2, heads, 64)
    a = ref.paged_decode_attention(q, k, v, tables, lens, 0.1)
    b = ref.paged_decode_attention(q, kn, vn, tables, lens, 0.1)
    assert torch.isfinite(b[0]).all() and torch.equal(a[0], b[0])


def test_prefill_reference_matches_dense_causal():
    ctx, new = [0, 15, 16, 100], [7, 3, 16, 20]
    k, v, tables, heads = paged_case([c + n for c, n in zip(ctx, new)], 2, 4, 64, torch.float32)
    cu = torch.tensor([0, 7, 10, 26, 46], dtype=torch.int32)
    q = torch.randn(46, heads, 64)
    out = ref.paged_prefill_attention(q, k, v, tables, cu, torch.tensor(ctx, dtype=torch.int32), 0.125)
    for i, (c, n) in enumerate(zip(ctx, new)):
        s, e = int(cu[i]), int(cu[i + 1])
        kk, vv = gather_dense(k, tables[i], c + n), gather_dense(v, tables[i], c + n)
        want = _sdpa(q[s:e], kk, vv, 0.125, causal_offset=c)
        assert (out[s:e].double() - want).abs().max() < 1e-5


def test_store_kv_and_copy_blocks_by_hand():
    k = torch.zeros(4, 2, 1, 3)
    v = torch.zeros(4, 2, 1, 3)
    key = torch.arange(9.0).view(3, 1, 3)
    ref.store_kv(key, -key, k, v, torch.tensor([5, -1, 0]))
    assert k[2, 1, 0].tolist() == [0.0, 1.0, 2.0]     # slot 5 = block 2, offset 1
    assert k[0, 0, 0].tolist() == [6.0, 7.0, 8.0]     # slot 0
    assert v[2, 1, 0].tolist() == [0.0, -1.0, -2.0]
    assert k.count_nonzero() == 5                     # token 1 (slot -1) skipped; 0.0 entry stays zero
    ref.copy_blocks([k, v], torch.tensor([[2, 3]]))
    assert torch.equal(k[3], k[2]) and torch.equal(v[3], v[2])
