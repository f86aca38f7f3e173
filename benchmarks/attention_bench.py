"""Paged attention speed: decode (batch x context) and prefill (batch x prompt), against plain torch.

Decode: time of backend.kernels.paged_decode_attention on shuffled physical blocks; achieved HBM
bandwidth = bytes of K and V read (+ q, out, tables) / time, and its fraction of the device's peak
(sim.specs hardware preset guessed from the device name); baseline = gather the blocks into dense
K/V + torch scaled_dot_product_attention (what one would write without a paged kernel).
Prefill: causal TFLOP/s (4 * H * D * n(n+1)/2 per sequence) of paged_prefill_attention, against
dense causal SDPA (no gather) as a reference point.

    python benchmarks/attention_bench.py --out results/attention.csv          # on a GPU
    python benchmarks/attention_bench.py --quick --out /tmp/attention.csv     # anywhere (interpreter)
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch.nn.functional as F  # noqa: E402

from backend.kernels import paged_decode_attention, paged_prefill_attention  # noqa: E402
from backend.shapes import hardware_for_device  # noqa: E402

COLUMNS = ["kind", "batch", "context_len", "num_heads", "num_kv_heads", "head_dim", "dtype", "time_ms",
           "baseline_ms", "speedup", "gbps", "frac_peak_bw", "tflops", "frac_peak_flops", "max_err"]


def _time(fn, device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of fn()."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _paged(batch: int, ctx: int, kvh: int, d: int, dtype, device, block_size: int = 16, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    per = -(-ctx // block_size)
    nblocks = batch * per
    tables = torch.randperm(nblocks, generator=gen).view(batch, per).to(torch.int32).to(device)
    k = torch.randn(nblocks, block_size, kvh, d, device=device, dtype=dtype)
    v = torch.randn(nblocks, block_size, kvh, d, device=device, dtype=dtype)
    return k, v, tables


def _gather_dense(cache, tables, ctx):
    b = tables.shape[0]
    return cache[tables.long()].view(b, -1, cache.shape[2], cache.shape[3])[:, :ctx].transpose(1, 2)


def bench_decode(batch, ctx, heads, kvh, d, dtype, device, peak_bw, warmup, repeats) -> dict:
    k, v, tables = _paged(batch, ctx, kvh, d, dtype, device)
    q = torch.randn(batch, heads, d, device=device, dtype=dtype)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    scale = d ** -0.5
    out = paged_decode_attention(q, k, v, tables, lens, scale)

    def baseline():
        kk, vv = _gather_dense(k, tables, ctx), _gather_dense(v, tables, ctx)
        g = heads // kvh
        kk, vv = kk.repeat_interleave(g, dim=1), vv.repeat_interleave(g, dim=1)
        return F.scaled_dot_product_attention(q[:, :, None, :], kk, vv, scale=scale)[:, :, 0]

    err = (out.float() - baseline().float()).abs().max().item()
    t = _time(lambda: paged_decode_attention(q, k, v, tables, lens, scale), device, warmup, repeats)
    tb = _time(baseline, device, warmup, repeats)
    nbytes = 2 * batch * ctx * kvh * d * k.element_size() + 2 * q.numel() * q.element_size() + tables.numel() * 4
    gbps = nbytes / t / 1e9
    return {"kind": "decode", "batch": batch, "context_len": ctx, "time_ms": t * 1e3, "baseline_ms": tb * 1e3,
            "speedup": tb / t, "gbps": gbps, "frac_peak_bw": gbps * 1e9 / peak_bw if peak_bw else "",
            "tflops": 4 * batch * heads * ctx * d / t / 1e12, "frac_peak_flops": "", "max_err": err}


def bench_prefill(batch, n, heads, kvh, d, dtype, device, peak_flops, warmup, repeats) -> dict:
    k, v, tables = _paged(batch, n, kvh, d, dtype, device, seed=1)
    q = torch.randn(batch * n, heads, d, device=device, dtype=dtype)
    cu = torch.arange(0, batch * n + 1, n, dtype=torch.int32, device=device)
    ctx = torch.zeros(batch, dtype=torch.int32, device=device)
    scale = d ** -0.5

    def run():
        return paged_prefill_attention(q, k, v, tables, cu, ctx, scale, max_new_tokens=n)

    g = heads // kvh
    qd = q.view(batch, n, heads, d).transpose(1, 2)
    kd = _gather_dense(k, tables, n).repeat_interleave(g, dim=1)
    vd = _gather_dense(v, tables, n).repeat_interleave(g, dim=1)

    def baseline():
        return F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale)

    err = (run().float().view(batch, n, heads, d).transpose(1, 2) - baseline().float()).abs().max().item()
    t = _time(run, device, warmup, repeats)
    tb = _time(baseline, device, warmup, repeats)
    flops = 4 * batch * heads * d * n * (n + 1) / 2
    return {"kind": "prefill", "batch": batch, "context_len": n, "time_ms": t * 1e3, "baseline_ms": tb * 1e3,
            "speedup": tb / t, "gbps": "", "frac_peak_bw": "", "tflops": flops / t / 1e12,
            "frac_peak_flops": flops / t / peak_flops if peak_flops else "", "max_err": err}


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV path")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU interpreter, CI)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    guess = hardware_for_device(name)
    peak_bw = guess[1].hbm_bandwidth if guess and guess[1] is not None else 0.0
    peak_flops = guess[1].peak_flops if guess and guess[1] is not None else 0.0
    if args.quick or not cuda:
        heads, kvh, d, dtype = 4, 2, 64, torch.float32
        decode_grid = [(1, 32), (2, 100)]
        prefill_grid = [(1, 32)]
        warmup, repeats = 0, 1
    else:
        heads, kvh, d, dtype = args.heads, args.kv_heads, args.head_dim, getattr(torch, args.dtype)
        decode_grid = [(b, c) for b in (1, 8, 32, 64, 128) for c in (512, 1024, 4096, 16384) if b * c <= 64 * 16384]
        prefill_grid = [(b, n) for b in (1, 4) for n in (512, 2048, 8192) if b * n <= 16384]
        warmup, repeats = 3, 20
    rows = []
    for b, c in decode_grid:
        rows.append(bench_decode(b, c, heads, kvh, d, dtype, device, peak_bw, warmup, repeats))
    for b, n in prefill_grid:
        rows.append(bench_prefill(b, n, heads, kvh, d, dtype, device, peak_flops, warmup, repeats))
    for r in rows:
        r.update(num_heads=heads, num_kv_heads=kvh, head_dim=d, dtype=str(dtype).replace("torch.", ""))
    print(f"device: {name}  preset: {guess[0] if guess else 'unknown'}  heads {heads}/{kvh} kv, head_dim {d}, "
          f"{str(dtype).replace('torch.', '')}")
    shown = ["kind", "batch", "context_len", "time_ms", "baseline_ms", "speedup", "gbps", "frac_peak_bw", "tflops",
             "frac_peak_flops", "max_err"]
    print("  ".join(f"{c:>12}" for c in shown))
    for r in rows:
        print("  ".join(f"{_fmt(r[c]):>12}" for c in shown))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
