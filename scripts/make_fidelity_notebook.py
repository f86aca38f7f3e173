"""Writes notebooks/fidelity.ipynb (the source of truth for its cells is this script), then runs it.

    python scripts/make_fidelity_notebook.py            # write and execute (outputs stored)
    KVSIM_FIDELITY_QUICK=1 python ...                   # 60 s a stage, one seed: a quick look
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat as nbf

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "fidelity.ipynb"

CELLS = [
    ("md", """# How close is kvsim to a real engine?

Three real serving runs of vLLM 0.15.1 on H100-80GB (Llama-2-7B at TP 1, Llama-2-70B at TP 4,
CodeLlama-34B at TP 2; two load stages each, shipped in `sim/data/ground_truth`) replayed by
`kvsim fidelity` with the **default** H100 calibration: the scenario names only the model, the hardware
with its tensor parallelism, the scheduler limits, prefix caching and chunked prefill. How the client's
load is rebuilt and how each part of the step model was fitted: `docs/fidelity.md`.

Goals, per stage at light load (measured mean TTFT under 1 s): mean E2E and decode time per token within
±10%, mean TTFT within ±25%, completed req/s within ±2%, p90 E2E within ±15%; every stage: no false
saturation (predicted mean TTFT at most 3x measured + 50 ms)."""),
    ("code", """%matplotlib inline
import os
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, display

from sim.executors.cost_model import make_cost_model_executor
from sim.fidelity.evaluate import evaluate
from sim.fidelity.goals import check_goals
from sim.fidelity.rebuild import run_scenario_for
from sim.fidelity.report import parity_figure, results_frame
from sim.fidelity.runs import group_runs, read_runs
from sim.fidelity.steady import steady_step

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "sim").is_dir())
RUNS = ROOT / "sim" / "data" / "ground_truth" / "vllm_h100_runs.csv"
QUICK = os.environ.get("KVSIM_FIDELITY_QUICK", "") not in ("", "0")   # tests: 60 s a stage, one seed
SEEDS, CUT = ([0], 60.0) if QUICK else ([0, 1, 2], None)
stages = read_runs(RUNS)
results = evaluate(stages, SEEDS, max_duration_s=CUT)
print(f"{len(results)} stages, seeds {SEEDS}, stage cut {CUT or 'none'}")"""),
    ("md", "## Errors per run and stage (prediction averaged over the seeds; spread = the seeds' min..max)"),
    ("code", """frame = results_frame(results)
keep = ["ttft_mean", "ttft_p90", "e2e_mean", "e2e_p90", "decode_per_token", "req_per_s"]
errors = frame[frame.metric.isin(keep)].pivot_table(index=["run", "stage"], columns="metric", values="error")
errors[keep].style.format("{:+.1%}")"""),
    ("code", """goals = pd.DataFrame(check_goals(results))
print(f"goals met: {goals.ok.sum()} of {len(goals)}")
goals[~goals.ok]"""),
    ("md", "## Parity: predicted against measured"),
    ("code", """fig_path = Path(os.environ.get("TMPDIR", "/tmp")) / "kvsim_fidelity_parity.png"
parity_figure(results, fig_path, "kvsim (default H100 calibration) vs real vLLM runs")
Image(str(fig_path))"""),
    ("md", """## Beside the other simulators

Published predictions of other simulators for the same 7B codegen run (signed error of mean E2E at
5 and 10 req/s): BLIS with coefficients fitted to real vLLM, BLIS's plain roofline, and Vidur."""),
    ("code", """seven = [r for r in results if r.stage.run == "llama-2-7b-tp1-codegen"]
others = pd.DataFrame({"BLIS (fitted)": [0.26, 0.15], "BLIS (roofline)": [-0.11, 0.15], "Vidur": [-0.14, 0.03],
                       "kvsim": [r.error("e2e_mean") for r in seven]}, index=["5 req/s", "10 req/s"])
fig, ax = plt.subplots(figsize=(7, 3.5))
others.abs().T.plot.bar(ax=ax, rot=0)
ax.set_ylabel("|error| of mean E2E")
ax.set_title("Llama-2-7B codegen on H100: mean E2E error by simulator")
display(fig)
plt.close(fig)
others.style.format("{:+.1%}")"""),
    ("md", """## Where the step time goes

Each stage's steady state (Little's law: N = rate x measured E2E requests in the engine, contexts spread
over the decode) priced by the default executor, term by term, beside the measured decode time per
token. A miss shows which term carries it."""),
    ("code", """rows = []
for name, run_stages in group_runs(stages).items():
    for s in run_stages:
        scn, *_ = run_scenario_for([s], 0)
        exe = make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=scn.executor,
                                       scheduler=scn.scheduler)
        mean_step, decode = steady_step(exe, s)
        rows.append({"run": name, "stage": s.stage, "batch N": round(s.rate_req_s * s.measured["e2e_mean"], 1),
                     **{f"{k} ms": v * 1e3 for k, v in decode.breakdown.items() if k not in ("swap", "copy")},
                     "model step ms": mean_step * 1e3, "measured ms": s.measured["decode_per_token"] * 1e3})
steps = pd.DataFrame(rows).set_index(["run", "stage"])
steps.style.format("{:.2f}")"""),
    ("code", """parts = [c for c in steps.columns if c.endswith(" ms") and c not in ("model step ms", "measured ms")]
fig, ax = plt.subplots(figsize=(8, 4))
steps[parts].plot.barh(stacked=True, ax=ax)
ax.scatter(steps["measured ms"], range(len(steps)), color="k", zorder=3, label="measured")
ax.set_xlabel("ms per decode step (decode-only step at the steady-state batch)")
ax.legend(fontsize=7)
display(fig)
plt.close(fig)"""),
    ("md", """Reading the misses: the GEMM term (`linear`) comes from the per-operator model, fitted to isolated
measurements (Vidur's tables). Where a stage's error survives the engine-level fit, compare the measured
growth of decode time between the two stages of a run with the model's: for CodeLlama-34B the model's
GEMMs grow faster with the batch than the isolated measurements do (between 32 and 88 tokens), which
shows as an over-prediction at 20 req/s. The engine-level terms are shared by all runs and were not bent
to any one of them.

## Engine only

The frontend (API server, tokenisation, streaming) is a scenario key; switched off, the same replay gives
the engine's own latencies."""),
    ("code", """seven_stages = group_runs(stages)["llama-2-7b-tp1-codegen"]
engine_only = evaluate(seven_stages, [0], overrides=["frontend.enabled=false"], max_duration_s=CUT or 120.0)
pd.DataFrame({"with frontend": [r.predicted("ttft_mean") * 1e3 for r in seven],
              "engine only": [r.predicted("ttft_mean") * 1e3 for r in engine_only],
              "measured": [r.stage.measured["ttft_mean"] * 1e3 for r in seven]},
             index=["5 req/s", "10 req/s"]).style.format("{:.1f} ms")"""),
]


def build() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def main() -> None:
    import nbclient

    nb = build()
    nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    nbf.write(nb, NOTEBOOK)
    print(f"wrote {NOTEBOOK} ({'quick' if os.environ.get('KVSIM_FIDELITY_QUICK') else 'full'} run)")


if __name__ == "__main__":
    main()
