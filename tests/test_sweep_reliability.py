"""Sweeps never lose or mislabel rows: one row per grid point and repeat, a lock per folder, edited bases
refused, bounded grids, true Ctrl-C / SIGTERM messages, and no worker left behind after any signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim.sweep as sweep_mod
from sim.cli import main as kvsim_main
from sim.scenario import load_scenario
from sim.sweep import load_sweep, run_sweep, scenario_hash
from sim.sweep_lock import SweepLock

BASE = {
    "name": "sweep-base", "seed": 5, "model": "tiny-llama", "hardware": "a100-80gb",
    "kv_cache": {"block_size": 4, "num_gpu_blocks": 40, "swap_space_gb": 0.001},
    "scheduler": {"max_num_seqs": 4},
    "output": {"plots": False},
    "workload": {"synthetic": {"num_requests": 6, "arrival": {"process": "poisson", "rate": 50.0},
                               "prompt_len": {"dist": "uniform", "min": 4, "max": 30},
                               "output_len": {"dist": "uniform", "min": 1, "max": 12}}},
}
ROOT = Path(__file__).resolve().parent.parent


def _files(tmp: Path, grid: dict, repeats: int = 1, name: str = "sweep.yaml", base: dict | None = None) -> Path:
    (tmp / "base.yaml").write_text(yaml.safe_dump(base or BASE, sort_keys=False))
    path = tmp / name
    path.write_text(yaml.safe_dump({"base": "base.yaml", "grid": grid, "repeats": repeats, "out": "res"},
                                   sort_keys=False))
    return path


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = kvsim_main(list(args))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _line(path: Path, fragment: str) -> int:
    return 1 + next(i for i, line in enumerate(path.read_text().splitlines()) if fragment in line)


def test_second_sweep_on_a_locked_folder_refuses(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache.block_size": [4, 8]})
    with SweepLock(tmp_path / "res"):
        code, _, err = _cli(capsys, "sweep", str(path), "--no-progress")
    assert code == 2 and err.strip().startswith(f"error: {tmp_path / 'res'}: another kvsim sweep (pid {os.getpid()})")
    assert not (tmp_path / "res" / "results.csv").exists()
    code, out, _ = _cli(capsys, "sweep", str(path), "--no-progress")  # the lock went with its holder
    assert code == 0 and "2 ran" in out and not (tmp_path / "res" / ".kvsim-sweep.lock").exists()


def test_two_concurrent_sweeps_one_folder_never_mix(tmp_path):
    a = _files(tmp_path, {"scheduler.max_num_seqs": [1, 2, 3, 4]}, name="a.yaml")
    b = _files(tmp_path, {"scheduler.max_num_seqs": [5, 6, 7, 8]}, name="b.yaml")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-m", "sim.cli", "sweep", str(p), "--workers", "1", "--no-progress"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for p in (a, b)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    df = pd.read_csv(tmp_path / "res" / "results.csv")
    assert len(df) == 4 and df["task_id"].is_unique  # one sweep's table, whole
    winner = {t.task_id for t in load_sweep(a if results[0][0] == 0 else b).tasks}
    assert set(df["task_id"]) == winner
    assert codes == [0, 2], results  # the other refused (the lock, or rows that are not its own)
    refused = next(err for code, err in results if code == 2)
    assert len(refused.strip().splitlines()) == 1 and ("another kvsim sweep" in refused or "not runs of this sweep"
                                                        in refused)


def test_edited_base_is_refused_not_appended(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache.block_size": [4, 8]})
    assert _cli(capsys, "sweep", str(path), "--no-progress")[0] == 0
    before = (tmp_path / "res" / "results.csv").read_bytes()
    edited = dict(BASE, scheduler={"max_num_seqs": 3})
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(edited))
    code, _, err = _cli(capsys, "sweep", str(path), "--no-progress")
    assert code == 2 and err.strip().startswith(
        f"error: {tmp_path / 'res' / 'results.csv'}: 2 of its 2 rows are not runs of this sweep")
    assert (tmp_path / "res" / "results.csv").read_bytes() == before


def test_rows_record_the_hash_of_what_ran(tmp_path):
    path = _files(tmp_path, {"kv_cache.block_size": [4, 8]}, repeats=2)
    run_sweep(load_sweep(path), workers=1, progress=False)
    df = pd.read_csv(tmp_path / "res" / "results.csv")
    assert len(df) == 4
    for _, row in df.iterrows():
        bs, seed = int(row["kv_cache.block_size"]), int(row["seed"])
        scn = load_scenario(tmp_path / "base.yaml", [f"kv_cache.block_size={bs}", f"seed={seed}"])
        assert row["scenario_hash"] == scenario_hash(scn)
    assert df["scenario_hash"].is_unique


def test_trace_content_is_part_of_the_hash(tmp_path):
    (tmp_path / "t.csv").write_text("arrival,prompt_len,output_len\n0,8,4\n1,9,4\n")
    base = {k: v for k, v in BASE.items() if k != "workload"}
    base["workload"] = {"trace": "t.csv", "format": "csv"}
    path = _files(tmp_path, {"kv_cache.block_size": [4]}, base=base)
    first = load_sweep(path).tasks[0].task_id
    (tmp_path / "t.csv").write_text("arrival,prompt_len,output_len\n0,8,4\n1,10,4\n")
    assert load_sweep(path).tasks[0].task_id != first


def test_repeated_grid_value_is_refused(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache.block_size": [4, 8, 4]})
    code, _, err = _cli(capsys, "sweep", str(path), "--dry-run")
    line = _line(path, "kv_cache.block_size:")
    assert code == 2 and err.strip() == (f"error: {path}:{line}: grid.kv_cache.block_size: value 4 is given twice "
                                         "(each point runs once; use repeats for more runs)")


def test_overlapping_grid_keys_are_refused(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache": [{"block_size": 16, "num_gpu_blocks": 40}], "kv_cache.block_size": [8]})
    code, _, err = _cli(capsys, "sweep", str(path), "--dry-run")
    line = _line(path, "kv_cache.block_size:")
    assert code == 2 and err.strip().startswith(f"error: {path}:{line}: grid.kv_cache.block_size: overlaps grid.kv_cache")


def test_huge_grid_is_refused_before_expanding_even_in_dry_run(tmp_path, capsys):
    grid = {"scheduler.max_num_seqs": list(range(1, 301)), "scheduler.rr_quantum_steps": list(range(1, 301)),
            "scheduler.max_steps_without_progress": list(range(1, 301)),
            "kv_cache.num_gpu_blocks": list(range(1, 101))}
    path = _files(tmp_path, grid)
    t0 = time.monotonic()
    code, _, err = _cli(capsys, "sweep", str(path), "--dry-run")
    assert time.monotonic() - t0 < 10
    assert code == 2 and f"grid: {300 * 300 * 300 * 100:,} runs (points x repeats) exceed the limit of 10,000" in err


def test_huge_repeats_are_refused(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache.block_size": [4]}, repeats=1_000_000_000)
    code, _, err = _cli(capsys, "sweep", str(path), "--dry-run")
    assert code == 2 and f"{path}:{_line(path, 'repeats')}: repeats: Input should be less than or equal to 10000" in err


def test_ctrl_c_message_says_what_was_kept(tmp_path, monkeypatch, capsys):
    path = _files(tmp_path, {"scheduler.max_num_seqs": [1, 2, 3, 4]})
    real, calls = sweep_mod.run_task, {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sweep_mod, "run_task", flaky)
    code, _, err = _cli(capsys, "sweep", str(path), "--workers", "1", "--no-progress")
    table = tmp_path / "res" / "results.csv"
    assert code == 130 and err.strip() == (f"error: interrupted; 2 of 4 runs finished; 2 rows are in {table}; run the "
                                           "sweep again to resume")
    assert len(pd.read_csv(table)) == 2


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _slow_sweep(tmp_path: Path) -> Path:
    slow = dict(BASE, workload={"synthetic": {"num_requests": 200_000, "prompt_len": {"dist": "fixed", "value": 8},
                                              "output_len": {"dist": "fixed", "value": 4}}},
                kv_cache={"block_size": 4, "num_gpu_blocks": 4000})
    return _files(tmp_path, {"scheduler.max_num_seqs": [1, 2, 3, 4]}, base=slow)


def _start_workers(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    path = _slow_sweep(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "sweep", str(path), "--workers", "2", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, wait_for_workers(proc)


def wait_for_workers(proc: subprocess.Popen, count: int = 2) -> list[int]:
    """The pids of ``proc``'s first ``count`` live children (its pool's workers), a second after they started."""
    deadline = time.monotonic() + 60
    kids: list[int] = []
    while time.monotonic() < deadline and len(kids) < count:
        time.sleep(0.2)
        kids = [k for k in _children(proc.pid) if _alive(k)]
    assert len(kids) >= count, "the workers did not start"
    time.sleep(1.0)
    return kids


def _all_gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_signal_stops_the_workers_with_one_line(tmp_path, sig, code, word):
    proc, kids = _start_workers(tmp_path)
    proc.send_signal(sig)
    rc = proc.wait(timeout=30)
    err = proc.stderr.read()
    assert rc == code and err.strip().splitlines() == [err.strip()] and err.startswith(f"error: {word}; "), err
    assert _all_gone(kids, 10), "workers outlived the sweep"
    assert not [p.name for p in (tmp_path / "res").glob(".*")] if (tmp_path / "res").exists() else True


def test_killed_parent_takes_its_workers_with_it(tmp_path):
    proc, kids = _start_workers(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    assert _all_gone(kids, 10), "workers outlived a SIGKILLed sweep"


def test_temp_files_of_a_killed_sweep_are_cleaned(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache.block_size": [4]})
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / ".results.csv.k1ll3d.tmp").write_text("task_id,status\nhalf")
    code, out, _ = _cli(capsys, "sweep", str(path), "--no-progress")
    assert code == 0 and sorted(p.name for p in (tmp_path / "res").iterdir() if p.name.startswith(".")) == []


def test_absurd_worker_counts_are_refused(tmp_path, capsys):
    path = _files(tmp_path, {"kv_cache.block_size": [4]})
    code, _, err = _cli(capsys, "sweep", str(path), "--workers", "1000000")
    assert code == 2 and err.strip() == "error: --workers: must be 1 .. 1024, got 1000000"


def test_parquet_never_disagrees_with_the_csv(tmp_path, monkeypatch, capsys):
    pytest.importorskip("pyarrow")
    path = _files(tmp_path, {"scheduler.max_num_seqs": [1, 2, 3]})
    assert _cli(capsys, "sweep", str(path), "--no-progress")[0] == 0
    assert len(pd.read_parquet(tmp_path / "res" / "results.parquet")) == 3
    grown = _files(tmp_path, {"scheduler.max_num_seqs": [1, 2, 3, 4, 5]})
    real, calls = sweep_mod.run_task, {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sweep_mod, "run_task", flaky)
    assert _cli(capsys, "sweep", str(grown), "--workers", "1", "--no-progress")[0] == 130
    csv = pd.read_csv(tmp_path / "res" / "results.csv")
    assert len(csv) == 4
    pq = tmp_path / "res" / "results.parquet"
    assert not pq.exists() or list(pd.read_parquet(pq)["task_id"]) == list(csv["task_id"].astype(str))
