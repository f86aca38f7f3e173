"""The results folder is replaced as a whole: a kill at any moment (even SIGKILL at the final rename)
leaves the old or the new results whole, SIGTERM exits 143 with one line, and debris is cleaned."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import sim.atomic_dir as atomic_dir
from sim.cli import main as kvsim_main

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = {
    "name": "atomic", "seed": 1, "model": "tiny-llama", "hardware": "a100-80gb",
    "kv_cache": {"block_size": 4, "num_gpu_blocks": 64, "swap_space_gb": 0.001},
    "output": {"plots": False},
    "workload": {"synthetic": {"num_requests": 8, "prompt_len": {"dist": "uniform", "min": 4, "max": 40},
                               "output_len": {"dist": "uniform", "min": 1, "max": 30}}},
}
# runs kvsim in a child that SIGKILLs itself at the n-th folder rename (1: exchange/first rename)
DRIVER = """
import os, signal, sys
import sim.atomic_dir as ad
mode, at = sys.argv[1], int(sys.argv[2])
if mode == "fallback":
    ad._exchange = lambda a, b: False
calls = {"n": 0}
real_rename, real_exchange = os.rename, ad._exchange
def counted(fn):
    def inner(*a):
        calls["n"] += 1
        if calls["n"] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*a)
    return inner
ad.os.rename = counted(real_rename)
ad._exchange = counted(real_exchange)
from sim.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _snapshot(out: Path) -> dict[str, bytes]:
    """The folder's files; summary.json without wall_time_s (the one value that differs between reruns)."""
    snap = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    if "summary.json" in snap:
        summary = json.loads(snap["summary.json"])
        summary.pop("wall_time_s", None)
        snap["summary.json"] = json.dumps(summary, sort_keys=True).encode()
    if "report.html" in snap:   # the report's summary table shows wall_time_s too
        snap["report.html"] = re.sub(rb"(wall_time_s</td><td[^>]*>)[^<]*", rb"\1", snap["report.html"])
    return snap


@pytest.fixture()
def previous(tmp_path):
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "out"
    assert kvsim_main(["run", str(path), "--out", str(out)]) == 0
    return path, out, _snapshot(out)


def _new_run(tmp_path: Path, path: Path) -> dict[str, bytes]:
    """The files a run with seed=2 makes (in a folder of its own)."""
    other = tmp_path / "reference-new"
    assert kvsim_main(["run", str(path), "--out", str(other), "--set", "seed=2"]) == 0
    return _snapshot(other)


def _debris(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if "kvsim-staging" in p.name or "kvsim-old" in p.name)


@pytest.mark.parametrize("mode, at", [("exchange", 1), ("fallback", 1), ("fallback", 2)])
def test_sigkill_at_the_final_rename_leaves_one_whole_run(previous, tmp_path, mode, at, capsys):
    path, out, old = previous
    new = _new_run(tmp_path, path)
    assert new != old
    r = subprocess.run([sys.executable, "-c", DRIVER, mode, str(at), "run", str(path), "--out", str(out),
                        "--set", "seed=2"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == -signal.SIGKILL
    if out.exists():  # never a mix: the old run or the new one
        assert _snapshot(out) in (old, new)
    atomic_dir.recover(out)  # what the next run does first
    assert _snapshot(out) in (old, new) and not _debris(tmp_path)
    assert kvsim_main(["run", str(path), "--out", str(out), "--set", "seed=2"]) == 0
    assert _snapshot(out) == new and not _debris(tmp_path)


def test_sigterm_while_writing_exits_143_and_keeps_the_old_run(previous, tmp_path, monkeypatch, capsys):
    path, out, old = previous
    import sim.commands.run as run_cmd

    real = run_cmd.summary_json

    def slow(summary):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the staging folder is half written
        return real(summary)

    monkeypatch.setattr(run_cmd, "summary_json", slow)
    code = kvsim_main(["run", str(path), "--out", str(out), "--set", "seed=2"])
    err = capsys.readouterr().err
    assert code == 143 and err.strip() == "error: terminated (SIGTERM); no results were written"
    assert _snapshot(out) == old and not _debris(tmp_path)


def test_sigterm_in_a_real_process(previous, tmp_path):
    path, out, old = previous
    slow = dict(SCENARIO, workload={"synthetic": {"num_requests": 300_000, "prompt_len": {"dist": "fixed",
                                                                                             "value": 8},
                                                  "output_len": {"dist": "fixed", "value": 4}}})
    path.write_text(yaml.safe_dump(slow))
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "run", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    import time
    time.sleep(3)
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    assert proc.stderr.read().strip() == "error: terminated (SIGTERM); no results were written"
    assert _snapshot(out) == old and not _debris(tmp_path)


def test_stale_staging_of_a_dead_process_is_cleaned(previous, tmp_path):
    path, out, old = previous
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f".out.kvsim-staging-{dead}-abc").mkdir()
    (tmp_path / f".out.kvsim-staging-{dead}-abc" / "summary.json").write_text("{}")
    (out / ".kvsim-staging-legacy").mkdir()  # what older versions left inside the folder
    assert kvsim_main(["run", str(path), "--out", str(out), "--set", "seed=2"]) == 0
    assert not _debris(tmp_path) and not (out / ".kvsim-staging-legacy").exists()


def test_a_lost_folder_is_restored_from_its_backup(previous, tmp_path):
    path, out, old = previous
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    os.rename(out, tmp_path / f".out.kvsim-old-{dead}")  # killed between the two renames of the fallback
    atomic_dir.recover(out)
    assert _snapshot(out) == old and not _debris(tmp_path)


@pytest.mark.parametrize("make, fragment", [
    (lambda t: (t / "afile").write_text("x") and t / "afile" / "sub", "is a file, so no folder can be made"),
    (lambda t: (t / "afile").write_text("x") and t / "afile", "--out must be a folder"),
    (lambda t: (t / "mine").mkdir() or (t / "mine" / "notes.txt").write_text("x") and t / "mine",
     "holds files kvsim did not write ('notes.txt')"),
])
def test_bad_out_is_refused_before_simulating(tmp_path, capsys, make, fragment):
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = make(tmp_path)
    code = kvsim_main(["run", str(path), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and fragment in captured.err  # no summary table: nothing ran
    assert len(captured.err.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_out_is_refused_before_simulating(tmp_path, capsys):
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code = kvsim_main(["run", str(path), "--out", str(locked / "out")])
    finally:
        locked.chmod(0o755)
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "cannot make files in" in captured.err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be made")
@pytest.mark.parametrize("args", [
    ["run", "{scn}", "--out", "/proc/kvsim-out"],
    ["run", "{scn}", "--out", "/proc/a/b/kvsim-out"],
    ["run", "{scn}", "--out", "{tmp}/out", "--trace-events", "/proc/kvsim-trace.json"],
    ["compare", "{scn}", "--vary", "seed=1,2", "--out", "/proc/kvsim-out"],
    ["capacity", "{scn}", "--slo", "ttft_p99=1", "--out", "/proc/kvsim-out"],
    ["sweep", "{sweep}", "--trace-events", "/proc/kvsim-traces", "--dry-run"],
])
def test_a_folder_that_takes_no_file_is_refused_before_simulating(tmp_path, capsys, args):
    """Where files cannot be made whatever the permission bits say (root passes them all), the probe
    finds out before anything runs: one line, exit 2, nothing written."""
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    sweep = Path(__file__).resolve().parents[1] / "scenarios" / "sweep_example.yaml"
    code = kvsim_main([a.format(scn=path, tmp=tmp_path, sweep=sweep) for a in args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "cannot make files in /proc" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scn.yaml"]


def test_results_of_an_older_kvsim_without_the_marker_are_replaced(previous, tmp_path):
    path, out, old = previous
    (out / atomic_dir.MARKER).unlink()  # as an older kvsim left it: summary.json, requests.csv, steps.csv
    assert kvsim_main(["run", str(path), "--out", str(out), "--set", "seed=2"]) == 0
    assert (out / atomic_dir.MARKER).exists() and _snapshot(out) != old


def test_a_folder_with_other_files_is_never_replaced(previous, tmp_path, capsys):
    path, out, old = previous
    (out / atomic_dir.MARKER).unlink()
    (out / "notes.md").write_text("mine")
    assert kvsim_main(["run", str(path), "--out", str(out)]) == 2
    assert "holds files kvsim did not write ('notes.md')" in capsys.readouterr().err
    assert (out / "notes.md").read_text() == "mine"
