"""Write the calibration of a GPU with no measurements of its own, derived from a measured GPU on the same chip.

    PYTHONPATH=. python scripts/derive_calibration.py h200-141gb --from h100-80gb
    PYTHONPATH=. python scripts/derive_calibration.py a100-40gb --from a100-80gb

The file (sim/data/calibration/TARGET.json) holds no parameters: it names its source, and kvsim reads the
source's fitted per-operator model and engine terms for it (``cost_model.derived_document``), priced against
the target's own HBM bandwidth and memory. That holds where both run the same kernels at the same rates: the
same SM count (the correction's wave features read it), the same dense fp16 and fp8 tensor rates and the same
NVLink bandwidth; the script refuses any other pair. Only memory differs (the H200 is the H100's GH100 with
141 GB of HBM3e at 4.8 TB/s; the A100 40GB the 80GB part's GA100 with HBM2 at 1.555 TB/s), and the model's
memory terms are fractions of the target's own bandwidth. Nothing measured on the target checks it.
"""

from __future__ import annotations

import argparse
import json
import sys

from sim.executors.cost_model import DATA_DIR, shipped_calibration
from sim.executors.roofline import DEFAULT_NUM_SMS
from sim.specs import HARDWARE_PRESETS

SAME_CHIP = ("peak_flops", "peak_flops_fp8", "interconnect_bandwidth")


def derivation(target: str, source: str) -> str:
    """Why ``target`` may borrow ``source``'s calibration, from the presets; raises ValueError where it may not."""
    t, s = HARDWARE_PRESETS[target], HARDWARE_PRESETS[source]
    differ = [k for k in SAME_CHIP if getattr(t, k) != getattr(s, k)]
    if DEFAULT_NUM_SMS.get(target) != DEFAULT_NUM_SMS.get(source):
        differ.append("num_sms")
    if differ:
        raise ValueError(f"{target} and {source} are not the same chip: {', '.join(differ)} differ")
    return (f"no {target} measurements: {source}'s calibration (its fitted per-operator model and engine terms) "
            f"on the same chip ({DEFAULT_NUM_SMS[source]} SMs, {s.peak_flops / 1e12:g} TFLOP/s dense fp16, "
            f"NVLink {s.interconnect_bandwidth / 1e9:g} GB/s a direction), priced against {target}'s own "
            f"{t.hbm_bandwidth / 1e12:g} TB/s and {_size(t.hbm_bytes)}")


def _size(nbytes: int) -> str:
    """Memory as its datasheet states it: whole GiB where it is (the A100's 40 and 80), else GB."""
    return f"{nbytes // 2**30} GiB" if nbytes % 2**30 == 0 else f"{nbytes / 1e9:g} GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", choices=sorted(HARDWARE_PRESETS))
    ap.add_argument("--from", dest="source", required=True, choices=sorted(HARDWARE_PRESETS))
    args = ap.parse_args()
    src = shipped_calibration(args.source)
    if src is None or "derived_from" in json.loads(src.read_text()):
        sys.exit(f"error: --from: {args.source} has no measured calibration of its own")
    try:
        why = derivation(args.target, args.source)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    doc = {"format": "kvsim-calibration/1", "hardware": args.target, "derived_from": args.source,
           "derivation": why}
    path = DATA_DIR / "calibration" / f"{args.target}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
