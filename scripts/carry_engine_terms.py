"""Carry the engine-level terms fitted on H100 runs to another GPU's calibration (no measured engine runs).

    python scripts/carry_engine_terms.py a100-80gb [--from h100-80gb]

Copies the ``engine`` section: the CPU-side terms (step gap, CPU per step and sequence, eager op cost)
are host properties, the graph-kernel cost and custom all-reduce latency are launch and NVLink
latencies of the same order on both generations, and the attention efficiency is a fraction of the
GPU's own bandwidth. Records where the values came from in ``engine_source``.
"""

from __future__ import annotations

import argparse
import json

from sim.executors.cost_model import shipped_calibration
from sim.executors.validation import calibration_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("hardware")
    ap.add_argument("--from", dest="source", default="h100-80gb")
    args = ap.parse_args()
    src = json.loads(shipped_calibration(args.source).read_text())
    path = shipped_calibration(args.hardware)
    doc = json.loads(path.read_text())
    doc["engine"] = dict(src["engine"])
    doc["engine_source"] = (f"carried from {args.source} (fitted to real vLLM runs there); no measured "
                            f"{args.hardware} engine runs exist to fit it")
    path.write_text(calibration_json(doc))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
