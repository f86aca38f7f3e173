"""Each Triton kernel against the reference (TRITON_INTERPRET=1 on a CPU; CUDA when present).

Cases: physical blocks in random order, out-of-range garbage in unused table columns, ragged lengths
(1, 15, 16, 17 and a few hundred), GQA ratios 1/4/8, head_dim 64/128, fp16 and fp32. Every value
of each axis appears; the cross product would be too slow for the interpreter.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from backend_cases import paged_case  # noqa: E402

from backend import kernels  # noqa: E402
from backend import reference as ref  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float16: 2e-2, torch.float32: 1e-4}
CASES = [  # (gqa ratio, head_dim, dtype)
    (1, 64, torch.float32),
    (4, 128, torch.float16),
    (8, 64, torch.float16),
    (4, 64, torch.float32),
    (8, 128, torch.float32),
    (1, 128, torch.float16),
]
LENS = [1, 15, 16, 17, 300]


def _err(a, b):
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("group,head_dim,dtype", CASES)
def test_decode_matches_reference(group, head_dim, dtype):
    kvh = 2 if group < 8 else 1
    k, v, tables, heads = paged_case(LENS, kvh, group, head_dim, dtype, device=DEV, seed=group + head_dim)
    lens = torch.tensor(LENS, dtype=torch.int32, device=DEV)
    q = torch.randn(len(LENS), heads, head_dim, device=DEV).to(dtype)
    scale = head_dim ** -0.5
    want = ref.paged_decode_attention(q, k, v, tables, lens, scale)
    got = kernels.paged_decode_attention(q, k, v, tables, lens, scale)
    assert got.dtype == dtype and got.shape == q.shape
    assert _err(got, want) <= TOL[dtype]


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_split_counts_agree(splits):
    """One split (direct write) and three splits (log-sum-exp merge, some splits empty) give the same output."""
    k, v, tables, heads = paged_case([1, 17, 300], 2, 4, 64, torch.float32, device=DEV, seed=7)
    lens = torch.tensor([1, 17, 300], dtype=torch.int32, device=DEV)
    q = torch.randn(3, heads, 64, device=DEV)
    want = ref.paged_decode_attention(q, k, v, tables, lens, 0.125)
    got = kernels.paged_decode_attention(q, k, v, tables, lens, 0.125, num_splits=splits)
    assert _err(got, want) <= 1e-4


@pytest.mark.parametrize("group,head_dim,dtype", CASES[:4])
def test_prefill_extend_matches_reference(group, head_dim, dtype):
    # plain prefill (17 new), chunked prefill (15 cached + 1), prefix hit crossing blocks (16 + 16),
    # a single token on an empty cache, a long context with a chunk of 40
    ctx, new = [0, 15, 16, 0, 260], [17, 1, 16, 1, 40]
    kvh = 2 if group < 8 else 1
    k, v, tables, heads = paged_case([c + n for c, n in zip(ctx, new)], kvh, group, head_dim, dtype,
                                     device=DEV, seed=group * 3 + head_dim)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    q = torch.randn(sum(new), heads, head_dim, device=DEV).to(dtype)
    ctx_t = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    scale = head_dim ** -0.5
    want = ref.paged_prefill_attention(q, k, v, tables, cu, ctx_t, scale)
    got = kernels.paged_prefill_attention(q, k, v, tables, cu, ctx_t, scale)
    assert _err(got, want) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_store_kv_and_copy_blocks_bit_identical_to_reference(dtype):
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(8, 16, 2, 64, generator=gen).to(dtype).to(DEV)
    v = torch.randn(8, 16, 2, 64, generator=gen).to(dtype).to(DEV)
    k2, v2 = k.clone(), v.clone()
    key = torch.randn(5, 2, 64, generator=gen).to(dtype).to(DEV)
    val = torch.randn(5, 2, 64, generator=gen).to(dtype).to(DEV)
    slots = torch.tensor([3, -1, 17, 127, 64], device=DEV)
    kernels.store_kv(key, val, k, v, slots)
    ref.store_kv(key, val, k2, v2, slots)
    assert torch.equal(k, k2) and torch.equal(v, v2)
    pairs = torch.tensor([[1, 5], [2, 7]], device=DEV)
    kernels.copy_blocks([k, v], pairs)
    ref.copy_blocks([k2, v2], pairs)
    assert torch.equal(k, k2) and torch.equal(v, v2) and torch.equal(k[5], k[1]) and torch.equal(v[7], v[2])
