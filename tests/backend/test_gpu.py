"""CUDA only: bf16, realistic shapes, int64 offsets past 2**31 elements (skipped without a GPU)."""

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from backend_cases import paged_case  # noqa: E402

from backend import kernels  # noqa: E402
from backend import reference as ref  # noqa: E402


def _err(a, b):
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 3e-2), (torch.float16, 2e-2)])
def test_decode_llama3_shape(dtype, tol):
    lens = [1, 15, 16, 17, 300, 1000, 4096, 33]
    k, v, tables, heads = paged_case(lens, 8, 4, 128, dtype, device="cuda")
    q = torch.randn(len(lens), heads, 128, device="cuda").to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
    assert _err(kernels.paged_decode_attention(q, k, v, tables, ctx, 128 ** -0.5),
                ref.paged_decode_attention(q, k, v, tables, ctx, 128 ** -0.5)) <= tol


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 3e-2), (torch.float16, 2e-2)])
def test_prefill_long_chunks(dtype, tol):
    ctx, new = [0, 100, 1000, 16], [300, 129, 64, 1]
    k, v, tables, heads = paged_case([c + n for c, n in zip(ctx, new)], 8, 4, 128, dtype, device="cuda")
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(new), heads, 128, device="cuda").to(dtype)
    c = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    assert _err(kernels.paged_prefill_attention(q, k, v, tables, cu, c, 128 ** -0.5),
                ref.paged_prefill_attention(q, k, v, tables, cu, c, 128 ** -0.5)) <= tol


def test_int64_offsets_past_2_pow_31_elements():
    """Blocks at the far end of a K cache with more than 2**31 elements (4 GiB of fp16 each for K and V)."""
    bs, kvh, d = 16, 8, 128
    num_blocks = 2**31 // (bs * kvh * d) + 64
    k = torch.empty(num_blocks, bs, kvh, d, device="cuda", dtype=torch.float16)
    v = torch.empty_like(k)
    tail = torch.arange(num_blocks - 40, num_blocks, device="cuda", dtype=torch.int32)
    k[tail.long()] = torch.randn(40, bs, kvh, d, device="cuda", dtype=torch.float16)
    v[tail.long()] = torch.randn(40, bs, kvh, d, device="cuda", dtype=torch.float16)
    tables = tail.view(2, 20)
    lens = torch.tensor([320, 250], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 32, d, device="cuda", dtype=torch.float16)
    want = ref.paged_decode_attention(q, k, v, tables, lens, 0.1)
    assert _err(kernels.paged_decode_attention(q, k, v, tables, lens, 0.1), want) <= 2e-2
    key = torch.randn(3, kvh, d, device="cuda", dtype=torch.float16)
    slots = (tail[-1].long() * bs + torch.arange(3, device="cuda"))
    kernels.store_kv(key, key, k, v, slots)
    assert torch.equal(k[num_blocks - 1, :3], key)
    kernels.copy_blocks([k], torch.tensor([[num_blocks - 1, 0]], device="cuda"))
    assert torch.equal(k[0], k[num_blocks - 1])
    del k, v
    torch.cuda.empty_cache()


def test_executor_cuda_step():
    from backend.runner import SeqWork, StepRunner
    from backend.shapes import model_preset

    r = StepRunner(model_preset("llama-3-8b"), device="cuda", num_gpu_blocks=512, num_cpu_blocks=16, num_layers=2)
    t1 = r.run([SeqWork(100, 0, list(range(7))), SeqWork(37, 0, [20, 21, 22])])
    t2 = r.run([SeqWork(1, 100, list(range(7))), SeqWork(1, 37, [20, 21, 22])], copies=[(22, 30)],
               swap_out=[(5, 1)])
    assert t1.total_s > 0 and t2.breakdown["attention"] > 0 and t2.breakdown["swap"] > 0
    assert r.layer_scale == 16.0
