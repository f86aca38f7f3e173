"""kvsim profile --model M [--device cuda|cpu] --out FILE: time a grid of steps on the real backend.

Writes the project's profile CSV (model,device,kind,batch_size,num_tokens,context_len,operator,time_ms),
the input of ``kvsim calibrate``. The backend (torch) is imported only when this command runs.
"""

from __future__ import annotations

import argparse
import time

from sim.errors import KvsimError
from sim.specs import ModelSpec


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="measure step and operator times on the GPU backend (or the CPU path)")
    p.add_argument("--model", required=True, help="model preset name")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", required=True, help="profile CSV to write")
    p.add_argument("--num-layers", type=int, default=None, help="run fewer layers (times are scaled)")
    p.add_argument("--prefill-batch", type=_ints, help="prefill batch sizes, e.g. 1,4")
    p.add_argument("--prefill-lens", type=_ints, help="prompt lengths, e.g. 16,64,256")
    p.add_argument("--decode-batch", type=_ints, help="decode batch sizes, e.g. 1,8,32")
    p.add_argument("--decode-context", type=_ints, help="decode context lengths, e.g. 64,512")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per point (the median is kept)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        spec = ModelSpec.from_name(args.model)
    except KeyError as exc:
        raise KvsimError("--model", exc.args[0]) from None
    if args.num_layers is not None and args.num_layers <= 0:
        raise KvsimError("--num-layers", f"must be positive, got {args.num_layers}")
    try:
        from backend.profile import grid_from_args, run_profile
    except ImportError as exc:
        raise KvsimError("kvsim profile", f"the backend needs torch (pip install kvsim[gpu]): {exc}") from None
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise KvsimError("--device", "cuda is not available here; use --device cpu")
    from sim.executors.validation import check_out_path

    check_out_path(args.out)
    grid = grid_from_args(args)
    t0 = time.perf_counter()
    rows = run_profile(spec, args.device, args.out, grid=grid, num_layers=args.num_layers)
    print(f"wrote {len(rows)} rows ({len(grid.points())} steps) to {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0
