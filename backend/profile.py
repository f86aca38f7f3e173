"""Step-time grid through the real backend -> the project's profile CSV (input of kvsim calibrate).

One row per (step, operator), columns exactly::

    model,device,kind,batch_size,num_tokens,context_len,operator,time_ms

kind is prefill (batch_size prompts of num_tokens / batch_size new tokens each, context_len cached
before) or decode (batch_size sequences, one new token each over context_len cached tokens).
The operators attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj and attention (KV store +
paged attention) are per-layer times; ``step`` is the whole step scaled to all the model's layers.
Each time is the median of ``repeats`` timed runs after ``warmup`` untimed ones.

Usable without the simulator's dependencies: ``python -m backend.profile --model NAME --device D --out F``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.runner import SeqWork, StepRunner
from backend.shapes import ModelShape, model_preset

COLUMNS = ["model", "device", "kind", "batch_size", "num_tokens", "context_len", "operator", "time_ms"]
OPERATORS = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "attention"]


@dataclass(slots=True)
class ProfileGrid:
    """Prefill points (batch x prompt length, context 0) and decode points (batch x context length)."""

    prefill_batch_sizes: tuple[int, ...] = (1, 4)
    prefill_lens: tuple[int, ...] = (16, 64, 256)
    decode_batch_sizes: tuple[int, ...] = (1, 8, 32)
    decode_context_lens: tuple[int, ...] = (64, 512)
    block_size: int = 16
    warmup: int = 1
    repeats: int = 3

    @classmethod
    def default(cls, device: str) -> ProfileGrid:
        if device == "cpu":
            return cls()
        return cls(prefill_batch_sizes=(1, 4, 16), prefill_lens=(128, 512, 2048),
                   decode_batch_sizes=(1, 8, 32, 128), decode_context_lens=(128, 1024, 4096), warmup=2, repeats=5)

    def points(self) -> list[tuple[str, int, int, int]]:
        """(kind, batch_size, new tokens per sequence, context_len) for every step of the grid."""
        pts = [("prefill", b, n, 0) for b in self.prefill_batch_sizes for n in self.prefill_lens]
        return pts + [("decode", b, 1, c) for b in self.decode_batch_sizes for c in self.decode_context_lens]


def grid_from_args(args: Any) -> ProfileGrid:
    """The default grid for ``args.device`` with the command line's --prefill-batch ... --repeats applied."""
    grid = ProfileGrid.default(args.device)
    for attr, val in (("prefill_batch_sizes", args.prefill_batch), ("prefill_lens", args.prefill_lens),
                      ("decode_batch_sizes", args.decode_batch), ("decode_context_lens", args.decode_context),
                      ("repeats", args.repeats)):
        if val is not None:
            setattr(grid, attr, val)
    return grid


def _blocks_needed(grid: ProfileGrid) -> int:
    bs = grid.block_size
    return max(b * -(-(n + c) // bs) for _, b, n, c in grid.points())


def run_profile(model: Any, device: str, out_path: str | Path, grid: ProfileGrid | None = None,
                num_layers: int | None = None, seed: int = 0) -> list[dict]:
    """Time every grid point and write the CSV to out_path; returns the rows."""
    shape = ModelShape.of(model)
    grid = grid or ProfileGrid.default(device)
    runner = StepRunner(shape, device=device, block_size=grid.block_size, num_gpu_blocks=_blocks_needed(grid),
                        num_layers=num_layers, seed=seed)
    rows: list[dict] = []
    bs = grid.block_size
    for kind, batch, new, ctx in grid.points():
        per_seq = -(-(new + ctx) // bs)
        seqs = [SeqWork(new, ctx, list(range(i * per_seq, (i + 1) * per_seq))) for i in range(batch)]
        if ctx:  # fill the context once, so decode attention reads written KV
            runner.run([SeqWork(ctx, 0, s.block_ids) for s in seqs])
        for _ in range(grid.warmup):
            runner.run(seqs)
        timings = [runner.run(seqs) for _ in range(grid.repeats)]
        times = {op: statistics.median(t.per_layer.get(op, 0.0) for t in timings) for op in OPERATORS}
        times["step"] = statistics.median(t.total_s for t in timings)
        for op, sec in times.items():
            rows.append({"model": shape.name, "device": device, "kind": kind, "batch_size": batch,
                         "num_tokens": batch * new, "context_len": ctx, "operator": op,
                         "time_ms": round(sec * 1e3, 6)})
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.profile", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", required=True)
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--prefill-batch", type=_ints)
    p.add_argument("--prefill-lens", type=_ints)
    p.add_argument("--decode-batch", type=_ints)
    p.add_argument("--decode-context", type=_ints)
    p.add_argument("--repeats", type=int)
    args = p.parse_args(argv)
    grid = grid_from_args(args)
    t0 = time.perf_counter()
    rows = run_profile(model_preset(args.model), args.device, args.out, grid, args.num_layers)
    print(f"wrote {len(rows)} rows ({len(grid.points())} steps) to {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
