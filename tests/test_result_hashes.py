"""benchmarks/result_hashes.py: a run's fingerprint is the same for the same scenario and seed, and
changes with any value of its summary or tables."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import result_hashes  # noqa: E402

from sim.runner import run_scenario  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402


def _run():
    return run_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                      ["workload.limit=60", "output.plots=false"]), check_integrity=False)


def test_the_same_scenario_gives_the_same_fingerprint_and_any_change_another(tmp_path):
    a, b = _run(), _run()
    fa = result_hashes.fingerprint(a)   # (their wall_time_s differ: it is left out)
    assert fa == result_hashes.fingerprint(b) and len(fa) == 16
    steps = b.steps.copy()
    steps.loc[steps.index[-1], "duration_s"] += 1e-12          # one step, one float's last bits
    assert result_hashes.fingerprint(dataclasses.replace(b, steps=steps)) != fa
    summary = dict(b.summary, num_preemptions=b.summary["num_preemptions"] + 1)
    assert result_hashes.fingerprint(dataclasses.replace(b, summary=summary)) != fa
    saved = tmp_path / "before.txt"
    saved.write_text(f"qs60 {fa}\n\nother 0123456789abcdef\n")
    assert result_hashes.read_fingerprints(str(saved)) == {"qs60": fa, "other": "0123456789abcdef"}
