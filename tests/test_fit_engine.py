"""scripts/fit_engine.py: the engine-term fit recovers terms it is given, and leaves a run out on request.

The recovery test makes its own "measurements": each shipped stage's decode time per token priced at
its steady state under step terms chosen here (not the shipped ones), then asks the fit to find them
again from the priors. What is checked is the fit, against values known by construction.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import pytest

from sim.executors.engine_params import EngineParams
from sim.fidelity.runs import read_runs
from sim.fidelity.steady import steady_step

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "sim" / "data" / "ground_truth" / "vllm_h100_runs.csv"
_spec = importlib.util.spec_from_file_location("fit_engine", ROOT / "scripts" / "fit_engine.py")
fit_engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fit_engine)

# step terms unlike both the priors and the shipped fit: a slower graph, a larger gap, a slower
# paged-attention read, a dearer all-reduce
TRUTH = {"graph_kernel_s": 2.4e-6, "step_gap_s": 4.0e-4, "attn_kv_read_eff": 0.78,
         "custom_ar_latency_s": 1.2e-5, "custom_ar_peer_s": 3.0e-6, "custom_ar_eff": 0.45}


def _base() -> EngineParams:
    base = EngineParams()
    for name, (prior, *_rest) in fit_engine.PRIORS.items():
        setattr(base, name, prior)
    return base


def test_the_fit_finds_decode_times_made_by_known_terms():
    base = _base()
    truth = fit_engine.with_values(base, TRUTH)
    stages = []
    for s in read_runs(RUNS):
        made = steady_step(fit_engine.executor_for(s, "h100-80gb", truth), s)[0]
        stages.append(dataclasses.replace(s, measured=dict(s.measured, decode_per_token=made)))
    before = fit_engine.decode_errors(stages, "h100-80gb", base)
    assert max(abs(e) for e in before) > 0.05          # the priors are far from the made-up truth
    fitted = fit_engine.fit_step_terms(stages, "h100-80gb", base)
    after = fit_engine.decode_errors(stages, "h100-80gb", fit_engine.with_values(base, fitted))
    # six stages, six terms, some of them alike (a per-step gap and a per-kernel cost): the decode times
    # come back within 1% each, far closer than the priors put them
    assert max(abs(e) for e in after) < 0.01, [f"{e:+.2%}" for e in after]
    # the paged-attention read efficiency is the one term only long contexts at large batches move: close
    assert math.isclose(fitted["attn_kv_read_eff"], TRUTH["attn_kv_read_eff"], rel_tol=0.1)


def test_cross_validation_scores_the_run_left_out(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["fit_engine.py", "--cross-validate", "--hold-out", "llama-2-7b-tp1-codegen",
                                      "--refine", "0", "--duration", "20", "--seeds", "1"])
    fit_engine.main()
    out = capsys.readouterr().out
    assert "== llama-2-7b-tp1-codegen left out: fitting on 4 stages of 2 runs" in out
    table = out.split("left-out runs, signed error of each prediction:")[1].strip().splitlines()
    assert [row.split()[:2] for row in table[1:]] == [["llama-2-7b-tp1-codegen", "0"], ["llama-2-7b-tp1-codegen", "1"]]
    assert "goals met on the left-out run:" in out
    # nothing was written beside the shipped calibration
    assert not list((ROOT / "sim" / "data" / "calibration").glob(".*.fit.json"))


def test_an_unknown_run_to_leave_out_is_named(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fit_engine.py", "--cross-validate", "--hold-out", "llama-9b"])
    with pytest.raises(SystemExit, match="--hold-out: no run 'llama-9b'"):
        fit_engine.main()
