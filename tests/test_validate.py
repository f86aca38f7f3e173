"""The cost model against Vidur's measured operators (sim/data/vidur), scored where it has not looked.

Leave-one-model-out (opmodel.py): each model is held out in turn, and training drops it and every row of
another model whose GEMM shape (N, K) it shares. The goal (issue 11) is at most 5% MAPE on the four
projections of unseen models, and about 3% for a new model from a minute of its own shapes. Bounds are
those goals, or the plain and tile/wave rooflines fitted on the same rows (independent references).
Each GPU's full leave-one-model-out is slow (minutes) and runs on demand, ``pytest -m slow``; the default run
fits one fold per GPU as the shipped correction is.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import main as cli_main
from sim.commands.validate import pooled
from sim.executors.cost_model import load_calibration
from sim.executors.measurements import LINEAR_OPS, read_measurements
from sim.executors.opmodel import loo, loo_fold, loo_split, with_shapes
from sim.executors.validation import shipped_vidur, validate
from sim.specs import HardwareSpec

GOAL_UNSEEN = 0.05     # issue 11: at most 5% on unseen models
GOAL_FEW = 0.03 * 1.15  # "about 3%" from a minute of the model's own shapes: 3% with 15% slack
FEW_POINTS = 64        # token counts per shape: a 4-operator x 4-TP table is 1,024 GEMMs, seconds on a GPU


@pytest.fixture(scope="module")
def tables():
    return {gpu: read_measurements(shipped_vidur(gpu)) for gpu in ("a100", "h100")}


def loo_results(gpu: str) -> list:
    """The leave-one-model-out results of one GPU's shipped tables (two to three minutes on one core: every fold
    fits the shipped correction's six ensembles; run on demand, ``pytest -m slow``, README)."""
    return loo(read_measurements(shipped_vidur(gpu)), HardwareSpec.from_name(f"{gpu}-80gb"), points=FEW_POINTS)


def test_loo_split_removes_the_heldout_shapes(tables):
    df = tables["a100"]
    train, test = loo_split(df, "Llama-2-70b-hf")
    assert set(test.model) == {"Llama-2-70b-hf"} and "Llama-2-70b-hf" not in set(train.model)
    assert len(test) == len(df[(df.model == "Llama-2-70b-hf") & df.operator.isin(LINEAR_OPS)])
    assert not set(zip(train.N, train.K)) & set(zip(test.N, test.K))
    # by hand: Llama-2-70B (hidden 8192, 64 heads of 128, 8 KV heads, intermediate 28672) at TP 2 has a fused
    # QKV of K = 8192 -> N = (32 + 2 x 4) x 128 = 5120 and a down projection of K = 14336 -> N = 8192
    for shape in [(5120, 8192), (8192, 14336)]:
        assert shape in set(zip(test.N, test.K)) and shape not in set(zip(train.N, train.K))
    # CodeLlama-34B has the same hidden size and heads: its attention projections leave training too
    code = train[train.model == "CodeLlama-34b-Instruct-hf"]
    assert not code.operator.isin(["attn_pre_proj", "attn_post_proj"]).any()
    assert code.operator.isin(["mlp_up_proj", "mlp_down_proj"]).any()


def test_llama_2_7b_and_llama_3_8b_leave_each_others_attention_shapes_out(tables):
    """By hand: Llama-3-8B (hidden 4096, 32 heads and 8 KV heads of 128, intermediate 14336, gated) at TP 1 has
    a fused QKV of N = (32 + 2 x 8) x 128 = 6144, K = 4096: Llama-2-7B's at TP 2 (N = 3 x 4096 / 2). Both output
    projections are N = 4096, K = 4096 / t. Their MLPs differ (K = 11008 / t against 14336 / t for the down
    projection), so those stay in training."""
    train, test = loo_split(tables["a100"], "Llama-2-7b-hf")
    llama3 = train[train.model == "Meta-Llama-3-8B"]
    assert (6144, 4096) in set(zip(test.N, test.K)) and (6144, 4096) not in set(zip(train.N, train.K))
    assert not llama3.operator.isin(["attn_post_proj"]).any()
    # the QKV at TP 8 (N = 6 x 128 = 768) is Llama-3-8B's alone: it stays
    qkv = llama3[llama3.operator == "attn_pre_proj"]
    assert set(zip(qkv.N, qkv.K)) == {(768, 4096)}
    assert set(llama3[llama3.operator == "mlp_down_proj"].K) == {14336, 7168, 3584, 1792}


def test_one_shape_timed_as_two_operators_keeps_a_curve_per_operator(tables):
    """Qwen-72B (hidden 8192, 64 heads and 64 KV heads of 128, intermediate 24576, gated): its QKV projection at
    TP t (N = 3 x 8192 / t) has the shape of its MLP up projection at TP 2t (N = 2 x 24576 / 2t), K = 8192."""
    from sim.executors.opmodel import fit_correction
    from sim.executors.roofline import CostParams

    df = tables["h100"]
    corr = fit_correction(df, HardwareSpec.from_name("h100-80gb"), CostParams(num_sms=132))
    shared = {(24576, 8192), (12288, 8192), (6144, 8192)}
    assert set(corr["op_curves"]) == {f"{op},{n},{k}" for op in ("attn_pre_proj", "mlp_up_proj") for n, k in shared}
    pooled_ops = {tuple(s): o for s, o in zip(corr["shapes"], corr["ops"])}
    assert all(pooled_ops[s] == "" for s in shared)
    assert sum(o == "" for o in corr["ops"]) == 3
    # the two operators' times of one shape differ by more than the 5% goal (mean |log ratio| over token counts)
    q = with_shapes(df[df.model == "Qwen-72B"])
    for n, k in shared:
        t = q[(q.N == n) & (q.K == k)].pivot_table(index="M", columns="operator", values="time_s")
        assert np.mean(np.abs(np.log(t.attn_pre_proj / t.mlp_up_proj))) > GOAL_UNSEEN


def test_a_shape_timed_as_two_operators_on_a_coarser_grid_keeps_the_common_grid(tables):
    """Qwen-72B's two-operator shapes (above) timed at every other token count only, beside a table with all
    of them: each per-operator curve has a point per token count of the whole grid, as the pooled ones do,
    and the correction prices those shapes at every count (on a grid of its own it could not be read)."""
    from sim.executors.opmodel import fit_correction
    from sim.executors.roofline import CostParams
    from sim.executors.shape_correction import ShapeCorrection

    df = tables["h100"]
    qwen = df[df.model == "Qwen-72B"]
    coarse = qwen[qwen.num_tokens.isin(sorted(qwen.num_tokens.unique())[::2])]
    both = pd.concat([coarse, df[df.model == "Llama-2-7b-hf"]])
    corr = fit_correction(both, HardwareSpec.from_name("h100-80gb"), CostParams(num_sms=132))
    grid = corr["grid_m"]
    assert grid == sorted(df[df.model == "Llama-2-7b-hf"].num_tokens.unique())
    assert len(corr["op_curves"]) == 6 and all(len(c) == len(grid) for c in corr["op_curves"].values())
    bank = ShapeCorrection(corr)
    assert all(np.isfinite(bank.curve(24576, 8192, op)).all() for op in ("attn_pre_proj", "mlp_up_proj"))


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_one_unseen_model_fitted_as_shipped_beats_the_rooflines(tables, gpu):
    """phi-2 held out (the narrowest model, TP 1 only: the fastest fold), the correction fitted as the shipped
    one is: the plain trees averaged over four seeds, the stacked trees and the cross-GPU trees, a third each
    with the blend, none of which saw phi-2 or its shapes on either GPU."""
    from sim.executors.calibrate import mape
    from sim.executors.opmodel import predict_gemm
    from sim.executors.tree_ensemble import AVERAGED_SEEDS, AVERAGED_SETTINGS

    hw = HardwareSpec.from_name(f"{gpu}-80gb")
    _, test, fits = loo_fold(tables[gpu], hw, "phi-2")
    corr = fits["corrected"].gemm_correction
    assert corr["stacked_weight"] == corr["cross_weight"] == pytest.approx(1 / 3)
    assert len(corr["trees"]["feature"]) == len(AVERAGED_SEEDS) * AVERAGED_SETTINGS["max_iter"]
    assert corr["cross_trees"]["features"][-1] == "num_sms"
    err = {k: mape(predict_gemm(test, hw, p), test.time_s.to_numpy()) for k, p in fits.items()}
    assert err["corrected"] < err["roofline"] < err["plain"], err


def test_the_other_gpus_rows_leave_the_heldout_model_and_its_shapes(tables):
    from sim.executors.cross_gpu import shipped_rows, without

    (h100,) = shipped_rows("a100-80gb")
    assert h100.hardware.name == "h100-80gb" and set(h100.rows.model) >= {"phi-2", "Llama-2-7b-hf"}
    _, test = loo_split(tables["a100"], "Llama-2-7b-hf")
    shapes = pd.MultiIndex.from_frame(test[["N", "K"]].drop_duplicates())
    (left,) = without([h100], "Llama-2-7b-hf", shapes)
    assert "Llama-2-7b-hf" not in set(left.rows.model)
    assert not set(zip(left.rows.N, left.rows.K)) & set(zip(test.N, test.K))
    # by hand: Llama-2-7B's output projection at TP 1 is N = K = 4096, as InternLM-20B's is not (5120): every
    # other model's rows of other shapes stay
    assert (4096, 4096) in set(zip(test.N, test.K))
    assert len(left.rows[left.rows.model == "internlm-20b"]) == len(h100.rows[h100.rows.model == "internlm-20b"])


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_leave_one_model_out_of_the_shipped_tables(gpu):
    """Every model of a GPU's shipped tables held out in turn, fitted once for all four checks (one test a GPU:
    pytest-xdist 3.8's ``loadgroup`` does not keep tests marked ``xdist_group`` on one worker under pytest 9,
    so tests that shared the fit fitted it once a worker)."""
    results = loo_results(gpu)
    assert len(results) == {"a100": 7, "h100": 6}[gpu]
    # the correction beats the tile/wave roofline, which beats the plain one, on every unseen model, and a
    # minute of the model's own shapes beats the correction
    for r in results:
        assert r.corrected < r.roofline < r.plain, r
        assert r.few < r.corrected, r
    total = pooled(results)
    # issue 11's goals: at most 5% on unseen models; about 3% from 64 own token counts per shape
    assert total["corrected"] <= GOAL_UNSEEN, total
    assert total["few"] <= GOAL_FEW, total
    # the blend averaged with the stacked and the cross-GPU trees, against the blend alone (the same fit): better
    # over all held-out rows, and no model more than a tenth of a point worse (measured: H100 better for five
    # of six, Llama-2-7B 5.24% against 5.17%; A100 for four of seven, phi-2 6.07% against 6.04%, Llama-2-70B
    # and Qwen-72B within 0.03 point)
    assert total["corrected"] < total["unstacked"], total
    assert all(r.corrected < r.unstacked + 0.001 for r in results), results


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_shipped_calibration_fits_every_table(tables, gpu):
    _, doc = load_calibration(f"{gpu}-80gb")
    assert doc["fitted_on"] == [p.name for p in shipped_vidur(gpu, "mlp") + shipped_vidur(gpu, "all_reduce")]
    df = tables[gpu]
    tokens = sorted(df.num_tokens.unique())[::3]  # a third of the token counts keeps this fast
    v = validate(doc, df[df.num_tokens.isin(tokens) | (df.operator == "all_reduce")])
    # seen shapes use their own measured curve: well inside the goal for unseen ones
    assert v.model["linear"] < GOAL_UNSEEN
    for op in v.model:
        if op in v.baseline and op != "all_reduce":
            assert v.model[op] < v.baseline[op], op


def test_cli_loo_prints_every_model(capsys):
    tables = [p for p in shipped_vidur("a100", "mlp") if any(m in p.name for m in ("phi-2", "7b", "Qwen"))]
    assert cli_main(["validate", "--loo", "--hardware", "a100-80gb", "--points", "8", "--json",
                     "--measurements", *map(str, tables)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["model"] for m in out["models"]] == ["Llama-2-7b-hf", "Qwen-72B", "phi-2"]
    rows = sum(m["rows"] for m in out["models"])
    # every raw CSV row is one (token count, TP) point with four projections
    assert out["all"]["rows"] == rows == sum(4 * len(pd.read_csv(p)) for p in tables)


def test_loo_folds_in_worker_processes_give_the_same_results(tables):
    # each fold is fitted alone: two processes give what one does, bit for bit, in model order
    df = tables["a100"]
    small = df[df.model.isin(["phi-2", "Llama-2-7b-hf", "Qwen-72B"]) & (df.tp == 1)]
    hw = HardwareSpec.from_name("a100-80gb")
    alone = loo(small, hw, points=8)
    assert [r.model for r in alone] == ["Llama-2-7b-hf", "Qwen-72B", "phi-2"]
    assert loo(small, hw, points=8, workers=2) == alone


def test_cli_loo_rejects_a_bad_worker_count(capsys):
    assert cli_main(["validate", "--loo", "--hardware", "a100-80gb", "--workers", "0"]) == 2
    assert "--workers: must be between 1 and 256, got 0" in capsys.readouterr().err


def test_cli_loo_defaults_to_every_shipped_table_of_the_gpu(monkeypatch, capsys):
    import sim.commands.validate as command
    from sim.executors.opmodel import LooResult

    seen = []

    def scored(df, hardware, points, workers):   # the fit itself is checked above: here which tables it gets
        seen.append((sorted(df.model.unique()), hardware.name, points, workers))
        return [LooResult(m, 1, 1, 0.1, 0.08, 0.05, 0.06, 0.03, 1) for m in seen[0][0]]

    monkeypatch.setattr(command, "loo", scored)
    assert cli_main(["validate", "--loo", "--hardware", "a100-80gb", "--points", "8", "--workers", "3"]) == 0
    assert seen == [(["CodeLlama-34b-Instruct-hf", "Llama-2-70b-hf", "Llama-2-7b-hf", "Meta-Llama-3-8B", "Qwen-72B",
                      "internlm-20b", "phi-2"], "a100-80gb", 8, 3)]
    assert "all held-out rows" in capsys.readouterr().out


def test_cli_calibrate_then_validate_json_and_plot(tmp_path: Path, capsys):
    calib = tmp_path / "a100.json"
    train = [str(p) for p in shipped_vidur("a100") if "7b" in p.name]
    assert cli_main(["calibrate", "--hardware", "a100-80gb", "--tp", "1", "--out", str(calib),
                     "--measurements", *train]) == 0
    doc = json.loads(calib.read_text())
    assert doc["hardware"] == "a100-80gb" and doc["train_mape"]["linear"] < GOAL_UNSEEN
    capsys.readouterr()
    plot = tmp_path / "parity.png"
    held = [str(p) for p in shipped_vidur("a100") if "70b" in p.name]
    assert cli_main(["validate", "--calibration", str(calib), "--measurements", *held, "--json",
                     "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0 < out["overall_mape"] < out["baseline"]["overall_mape"]
    assert out["baseline"]["linear_mape"] > out["linear_mape"]
    assert plot.stat().st_size > 10_000


def test_cli_calibrate_from_base_with_a_few_points_of_a_new_model(tmp_path: Path, capsys):
    """Base: fitted without Llama-2-70B; then 16 token counts of 70B adapt it; scored on all 70B rows."""
    base = tmp_path / "base.json"
    train = [str(p) for p in shipped_vidur("a100") if "70b" not in p.name]
    assert cli_main(["calibrate", "--hardware", "a100-80gb", "--out", str(base), "--measurements", *train]) == 0
    full = next(p for p in shipped_vidur("a100") if "70b" in p.name)
    raw = pd.read_csv(full)
    tokens = sorted(raw.num_tokens.unique())
    few = tmp_path / "a100_Llama-2-70b-hf_mlp.csv"
    raw[raw.num_tokens.isin(tokens[:: len(tokens) // 16])].to_csv(few, index=False)
    new = tmp_path / "new.json"
    assert cli_main(["calibrate", "--base", str(base), "--measurements", str(few), "--out", str(new)]) == 0
    doc, base_doc = json.loads(new.read_text()), json.loads(base.read_text())
    assert doc["base"] == str(base) and doc["fitted_on"] == base_doc["fitted_on"] + [few.name]
    assert doc["baseline"] == base_doc["baseline"]
    # by hand: 4 projections x TP 1, 2, 4, 8 of 70B are 16 distinct (N, K) shapes
    assert len(doc["params"]["gemm_correction"]["local"]) == 16
    df = read_measurements([full])
    df = df[df.operator.isin(LINEAR_OPS)]
    before, after = validate(base_doc, df).model["linear"], validate(doc, df).model["linear"]
    assert after < before
    assert np.isfinite(after)


def test_beyond_the_trained_token_counts_the_trees_beat_a_flat_correction(tables):
    """Fitted on H100 token counts up to 2,048 and scored on 2,049-4,096 (shapes measured below the cut): the
    correction carried on by the trees must beat the correction held flat (flat: the reference, no trees)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from beyond_grid import errors_above

    df = tables["h100"]
    rows = with_shapes(df)
    errors = errors_above(df[df.num_tokens <= 2048], rows[rows.M > 2048], HardwareSpec.from_name("h100-80gb"))
    assert errors["trees"].mean() < errors["flat"].mean() - 0.005


def test_a_fold_can_train_on_a_subset_of_the_other_models(tables):
    df = tables["h100"]
    train, test, fits = loo_fold(df, HardwareSpec.from_name("h100-80gb"), "Qwen-72B", ["Llama-2-7b-hf"])
    assert set(train.model) == {"Llama-2-7b-hf"} and set(test.model) == {"Qwen-72B"}
    assert not set(zip(train.N, train.K)) & set(zip(test.N, test.K))
    # one training model: no other model's curves to stack on
    assert "stacked_trees" not in fits["corrected"].gemm_correction and fits["corrected"].gemm_correction["trees"]


@pytest.mark.parametrize("argv, flag", [
    (["validate", "--calibration", "no-such-gpu"], "--calibration"),
    (["calibrate", "--base", "no-such-gpu", "--out", "unused.json"], "--base"),
])
def test_unknown_calibration_names_the_flag(argv, flag, capsys):
    table = str(Path(__file__).parents[1] / "sim/data/vidur/h100_Qwen-72B_mlp.csv")
    assert cli_main([*argv, "--measurements", table]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {flag}: no calibration file 'no-such-gpu' and no shipped one named 'no-such-gpu'")
