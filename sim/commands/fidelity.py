"""kvsim fidelity RUNS.csv [--out DIR] [--json] [--seeds N] [--run NAME ...] [--duration S] [--set k=v ...]
                         [--model ID=CONFIG.json ...]

Replays measured serving runs (the format of sim/data/ground_truth/vllm_h100_runs.csv, docs/fidelity.md)
as kvsim scenarios, several seeds each, and prints per run and stage the measured and predicted TTFT and
E2E (mean, p50, p90, p99), mean decode time per token and completed req/s, with signed errors, the seeds'
spread and the goals. A row without measured figures is a benchmark not yet run: predicted, not checked.
``--out DIR`` writes fidelity.csv, fidelity.json and parity.png.
"""

from __future__ import annotations

import argparse
import json
import math

from sim.errors import KvsimError
from sim.fidelity.evaluate import evaluate
from sim.fidelity.goals import check_goals
from sim.fidelity.report import parity_figure, results_frame, text_table
from sim.fidelity.runs import read_runs
from sim.hf_config import load_hf_config
from sim.output import prepare_out_dir, write_together
from sim.specs import ModelSpec


def add_parser(sub) -> None:
    p = sub.add_parser("fidelity", help="replay measured serving runs and compare kvsim's predictions")
    p.add_argument("runs", help="measured runs CSV (e.g. sim/data/ground_truth/vllm_h100_runs.csv)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per run (default 3): the spread is reported")
    p.add_argument("--run", action="append", default=[], metavar="NAME", help="only this run (repeatable)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="cut every stage to at most S seconds at the same rate (a quick look, not the study)")
    p.add_argument("--model", dest="models", action="append", default=[], metavar="ID=CONFIG.json",
                   help="a model of the runs file with no kvsim preset, from its Hugging Face config.json "
                        "(repeatable)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario key in every replay (e.g. frontend.enabled=false)")
    p.add_argument("--workers", type=int, default=1,
                   help="replay runs and seeds in this many processes (default 1; same results for any number)")
    p.add_argument("--out", help="folder for fidelity.csv, fidelity.json and parity.png")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=main)


def _models(items: list[str]) -> dict[str, ModelSpec]:
    """``--model ID=PATH`` options as {ID: the spec of the config.json at PATH}."""
    out = {}
    for item in items:
        model_id, sep, path = item.partition("=")
        if not sep or not model_id.strip() or not path.strip():
            raise KvsimError("--model", f"expected MODEL_ID=path/to/config.json, got {item!r}")
        out[model_id.strip()] = load_hf_config(path.strip(), name=model_id.strip())
    return out


def main(args: argparse.Namespace) -> int:
    if not 1 <= args.seeds <= 100:
        raise KvsimError("--seeds", f"must be between 1 and 100, got {args.seeds}")
    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        raise KvsimError("--duration", f"must be a positive number of seconds, got {args.duration}")
    if not 1 <= args.workers <= 256:
        raise KvsimError("--workers", f"must be between 1 and 256, got {args.workers}")
    out = prepare_out_dir(args.out) if args.out else None
    stages = read_runs(args.runs, models=_models(args.models))
    unknown = sorted(set(args.run) - {s.run for s in stages})
    if unknown:
        raise KvsimError("--run", f"no run named {', '.join(unknown)} in {args.runs}")
    results = evaluate(stages, list(range(args.seeds)), overrides=args.overrides, max_duration_s=args.duration,
                       runs=args.run or None, workers=args.workers)
    goals = check_goals(results)
    doc = {"runs_file": str(args.runs), "seeds": args.seeds, "duration_cut_s": args.duration,
           "overrides": args.overrides, "stages": [r.to_json() for r in results], "goals": goals,
           "goals_met": sum(g["ok"] for g in goals), "goals_total": len(goals)}
    if out is not None:
        frame = results_frame(results)
        text = json.dumps(_finite(doc), indent=2) + "\n"
        write_together(out, {"parity.png": lambda p: parity_figure(results, p, f"kvsim vs {args.runs}"),
                             "fidelity.csv": lambda p: frame.to_csv(p, index=False),
                             "fidelity.json": lambda p: p.write_text(text)})
    if args.json:
        print(json.dumps(_finite(doc), indent=2))
        return 0
    print(text_table(results))
    failed = [g for g in goals if not g["ok"]]
    if any(s.has_measurements for s in stages):
        print(f"\ngoals met: {doc['goals_met']} of {doc['goals_total']}")
    else:
        print("\nno measured figures: predictions only, no goal checked")
    for g in failed:
        print(f"  missed: {g['run']} stage {g['stage']}: {g['goal']} ({g['value']:+.1%})"
              if "within" in g["goal"] else f"  missed: {g['run']} stage {g['stage']}: {g['goal']}")
    if out is not None:
        print(f"wrote {out / 'fidelity.csv'}, fidelity.json, parity.png")
    return 0


def _finite(x):
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x
