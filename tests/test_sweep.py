"""kvsim sweep: grid expansion, validation before running, the results table, resuming, workers, Ray."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim.sweep as sweep_mod
from sim.cli import main as kvsim_main
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.sweep import check_key_path, load_sweep, run_sweep

BASE = {
    "name": "sweep-base", "seed": 5, "model": "tiny-llama", "hardware": "a100-80gb",
    "kv_cache": {"block_size": 4, "num_gpu_blocks": 40, "swap_space_gb": 0.001},
    "scheduler": {"max_num_seqs": 4},
    "output": {"plots": False},
    "workload": {"synthetic": {"num_requests": 6, "arrival": {"process": "poisson", "rate": 50.0},
                               "prompt_len": {"dist": "uniform", "min": 4, "max": 30},
                               "output_len": {"dist": "uniform", "min": 1, "max": 12}}},
}


def _files(tmp_path: Path, grid: dict, repeats: int = 1, **extra) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE, sort_keys=False))
    doc = {"base": "base.yaml", "grid": grid, "repeats": repeats, "out": "res", **extra}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _kvsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=120)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (fast); one test below runs it in a real process."""
    try:
        code = kvsim_main(list(args))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_grid_is_the_cross_product_with_seeds_per_repeat(tmp_path):
    sw = load_sweep(_files(tmp_path, {"kv_cache.block_size": [4, 8], "scheduler.max_num_seqs": [1, 2, 4]}, 2))
    assert len(sw.tasks) == 2 * 3 * 2
    assert [dict(t.params) for t in sw.tasks[:4]] == [
        {"kv_cache.block_size": 4, "scheduler.max_num_seqs": 1}, {"kv_cache.block_size": 4, "scheduler.max_num_seqs": 1},
        {"kv_cache.block_size": 4, "scheduler.max_num_seqs": 2}, {"kv_cache.block_size": 4, "scheduler.max_num_seqs": 2}]
    assert [t.seed for t in sw.tasks[:2]] == [5, 6]  # base seed + repeat
    assert len({t.task_id for t in sw.tasks}) == 12
    assert sw.out_dir == tmp_path / "res"


def test_results_table_matches_independent_runs(tmp_path):
    path = _files(tmp_path, {"kv_cache.block_size": [4, 8], "scheduler.policy": ["fcfs", "priority"]})
    outcome = run_sweep(load_sweep(path), workers=1, progress=False)
    assert (outcome.total, outcome.ran, outcome.failed, outcome.skipped) == (4, 4, 0, 0)
    df = pd.read_csv(tmp_path / "res" / "results.csv")
    assert len(df) == 4 and (df["status"] == "ok").all()
    row = df[(df["kv_cache.block_size"] == 8) & (df["scheduler.policy"] == "priority")].iloc[0]
    direct = run_scenario(load_scenario(tmp_path / "base.yaml",
                                        ["kv_cache.block_size=8", "scheduler.policy=priority"])).summary
    assert row["num_steps"] == direct["num_steps"]
    assert row["makespan_s"] == pytest.approx(direct["makespan_s"], rel=1e-12)
    assert row["ttft_s.p99"] == pytest.approx(direct["ttft_s"]["p99"], rel=1e-12)
    if importlib.util.find_spec("pyarrow"):
        pq = pd.read_parquet(tmp_path / "res" / "results.parquet")
        assert list(pq["task_id"]) == list(df["task_id"].astype(str))


def test_resume_skips_done_points_and_runs_new_ones(tmp_path):
    grid = {"kv_cache.block_size": [4, 8]}
    run_sweep(load_sweep(_files(tmp_path, grid, 2)), workers=1, progress=False)
    again = run_sweep(load_sweep(_files(tmp_path, grid, 2)), workers=1, progress=False)
    assert (again.ran, again.skipped) == (0, 4)
    grown = run_sweep(load_sweep(_files(tmp_path, {"kv_cache.block_size": [4, 8, 16]}, 2)), workers=1,
                      progress=False)
    assert (grown.ran, grown.skipped) == (2, 4)
    df = pd.read_csv(tmp_path / "res" / "results.csv")
    assert len(df) == 6 and df["task_id"].is_unique


def test_interrupted_sweep_keeps_finished_rows_and_resumes(tmp_path, monkeypatch):
    path = _files(tmp_path, {"scheduler.max_num_seqs": [1, 2, 3, 4]})
    real = sweep_mod.run_task
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sweep_mod, "run_task", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_sweep(path), workers=1, progress=False)
    assert len(pd.read_csv(tmp_path / "res" / "results.csv")) == 2
    assert not [p for p in (tmp_path / "res").iterdir() if p.name.startswith(".")]  # no temp files left
    monkeypatch.setattr(sweep_mod, "run_task", real)
    rest = run_sweep(load_sweep(path), workers=1, progress=False)
    assert (rest.ran, rest.skipped) == (2, 2)


def test_process_workers_give_the_same_rows(tmp_path):
    grid = {"kv_cache.block_size": [4, 8], "scheduler.chunked_prefill": [False, True]}
    for sub, workers in (("a", 1), ("b", 2)):
        (tmp_path / sub).mkdir()
        run_sweep(load_sweep(_files(tmp_path / sub, grid)), workers=workers, progress=False)
    a = pd.read_csv(tmp_path / "a" / "res" / "results.csv").drop(columns="wall_time_s")
    b = pd.read_csv(tmp_path / "b" / "res" / "results.csv").drop(columns="wall_time_s")
    pd.testing.assert_frame_equal(a, b)  # same rows, in grid order whichever worker finished first
    assert list(a["task_id"]) == [t.task_id for t in load_sweep(tmp_path / "a" / "sweep.yaml").tasks]


def test_a_failing_point_is_a_row_not_a_crash(tmp_path):
    # one point fails only when it runs: its time window holds no request
    path = _files(tmp_path, {"scheduler.max_num_seqs": [2]})
    data = dict(BASE, workload={**BASE["workload"], "start_s": 1000.0})
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(data))
    outcome = run_sweep(load_sweep(path), workers=1, progress=False)
    df = pd.read_csv(tmp_path / "res" / "results.csv")
    assert outcome.failed == 1 and df.loc[0, "status"] == "error" and "no requests" in df.loc[0, "error"]


@pytest.mark.parametrize("key, fragment", [
    ("scheduler.polcy", "unknown key 'polcy' in scheduler"),
    ("kv_cache.block_size.x", "unknown key 'x' in kv_cache.block_size"),
    ("nonsense", "unknown key 'nonsense' in the scenario"),
])
def test_unknown_grid_key_exits_2_naming_file_and_key(tmp_path, key, fragment, capsys):
    path = _files(tmp_path, {"scheduler.max_num_seqs": [1], key: [1, 2]})
    code, _, err = _cli(capsys, "sweep", str(path))
    assert code == 2, err
    line = 1 + path.read_text().splitlines().index(f"  {key}:")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:{line}: grid.{key}: ") and fragment in lines[0]
    assert not (tmp_path / "res").exists()


def test_bad_grid_value_names_key_and_value(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache.block_size": [4, 6]})
    code, _, err = _cli(capsys, "sweep", str(path))
    assert code == 2 and "grid.kv_cache.block_size: value 6" in err and "power of two" in err
    assert not (tmp_path / "res").exists()


def test_key_paths_walk_the_schema():
    assert check_key_path(["workload", "synthetic", "arrival", "rate"]) == ""
    assert check_key_path(["workload", "requests", "0", "prompt_len"]) == ""
    assert check_key_path(["model", "num_layers"]) == ""  # model: preset name or a ModelSpec mapping
    assert "unknown key 'rates'" in check_key_path(["workload", "synthetic", "arrival", "rates"])


def test_ray_missing_is_a_clear_error_before_any_output(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    code, _, err = _cli(capsys, "sweep", str(_files(tmp_path, {"kv_cache.block_size": [4]})), "--ray")
    assert code == 2 and err.strip() == (
        "error: --ray: Ray is not installed; install it with: pip install 'kvsim[ray]'")
    assert not (tmp_path / "res").exists()   # (the sweep's out folder: nothing made)


def test_cli_runs_and_resumes(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache.block_size": [4, 8]})
    r = _kvsim("sweep", str(path), "--workers", "1", "--no-progress")
    assert r.returncode == 0 and "2 ran (0 failed), 0 already done" in r.stdout
    code, out, _ = _cli(capsys, "sweep", str(path), "--no-progress")
    assert code == 0 and "0 ran (0 failed), 2 already done" in out


def test_reordering_grid_keys_keeps_task_ids(tmp_path):
    a = load_sweep(_files(tmp_path, {"kv_cache.block_size": [4, 8], "scheduler.max_num_seqs": [1, 2]}))
    b = load_sweep(_files(tmp_path, {"scheduler.max_num_seqs": [1, 2], "kv_cache.block_size": [4, 8]}))
    assert {t.task_id for t in a.tasks} == {t.task_id for t in b.tasks}
    (tmp_path / "base.yaml").write_text((tmp_path / "base.yaml").read_text() + "# a comment\n")
    c = load_sweep(tmp_path / "sweep.yaml")
    assert {t.task_id for t in c.tasks} == {t.task_id for t in b.tasks}  # the content hash ignores comments
    (tmp_path / "base.yaml").write_text((tmp_path / "base.yaml").read_text().replace("rate: 50.0", "rate: 51.0"))
    d = load_sweep(tmp_path / "sweep.yaml")
    assert not {t.task_id for t in d.tasks} & {t.task_id for t in b.tasks}  # a changed value reruns everything


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[test]')")
def test_ray_path_runs_every_task_on_a_real_local_cluster(tmp_path):
    # real Ray: a local cluster started by the sweep (no address), tasks run in Ray worker processes
    path = _files(tmp_path, {"kv_cache.block_size": [4, 8]}, 2)
    r = _kvsim("sweep", str(path), "--ray", "--no-progress")
    assert r.returncode == 0 and "4 ran (0 failed)" in r.stdout, r.stderr[-2000:]
    df = pd.read_csv(tmp_path / "res" / "results.csv")
    assert len(df) == 4 and (df["status"] == "ok").all()
    for _, row in df.iterrows():  # the same numbers as running each point here
        scn = load_scenario(tmp_path / "base.yaml", [f"kv_cache.block_size={int(row['kv_cache.block_size'])}",
                                                     f"seed={int(row['seed'])}"])
        assert row["num_steps"] == run_scenario(scn).summary["num_steps"]
