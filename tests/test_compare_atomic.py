"""kvsim compare: its results folder is replaced whole (like kvsim run's), and its grid is bounded."""

from __future__ import annotations

from pathlib import Path

from sim.cli import main
from sim.commands.compare import MAX_COMPARE_RUNS

SEED = str(Path(__file__).resolve().parents[1] / "scenarios" / "seed_four_requests.yaml")


def test_too_many_combinations_are_refused_before_running(tmp_path, capsys):
    values = ",".join(str(i) for i in range(MAX_COMPARE_RUNS + 1))
    out = tmp_path / "cmp"
    assert main(["compare", SEED, "--vary", f"seed={values}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --vary:") and f"{MAX_COMPARE_RUNS + 1:,} combinations" in err[0]
    assert not out.exists()


def test_compare_replaces_its_folder_whole(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", SEED, "--vary", "scheduler.batching=static,continuous", "--out", str(out)]
    assert main(argv + ["--no-plots"]) == 0
    first = sorted(p.name for p in out.iterdir())
    assert "compare.csv" in first and not any(n.endswith(".png") for n in first)
    assert main(argv) == 0            # with figures: a new folder, swapped in
    second = sorted(p.name for p in out.iterdir())
    assert {"compare.csv", "latency_cdf.png", "kv_usage.png", "memory_over_time.png"} <= set(second)
    assert [p.name for p in tmp_path.iterdir()] == ["cmp"]   # no staging or backup folders left


def test_compare_refuses_a_folder_of_other_files(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["compare", SEED, "--vary", "scheduler.batching=static,continuous", "--out", str(out)]) == 2
    assert "notes.txt" in capsys.readouterr().err and (out / "notes.txt").read_text() == "keep me"
