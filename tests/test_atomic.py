"""Outputs are written atomically: an interrupted run (KeyboardInterrupt or an exception, during the
simulation or while writing) leaves the previous results exactly as they were, with no temp files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import sim.runner
from sim.cli import main as kvsim_main
from sim.output import write_atomic

SCENARIO = {
    "name": "atomic", "seed": 1, "model": "tiny-llama", "hardware": "a100-80gb",
    "kv_cache": {"block_size": 4, "num_gpu_blocks": 64, "swap_space_gb": 0.001},
    "output": {"plots": False},
    "workload": {"synthetic": {"num_requests": 20, "arrival": {"process": "poisson", "rate": 20.0},
                               "prompt_len": {"dist": "uniform", "min": 4, "max": 40},
                               "output_len": {"dist": "uniform", "min": 1, "max": 30}}},
}


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture()
def previous(tmp_path):
    """A scenario file and a folder holding the results of a complete earlier run."""
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "out"
    assert kvsim_main(["run", str(path), "--out", str(out)]) == 0
    snap = _snapshot(out)
    assert {"summary.json", "requests.csv", "steps.parquet"} <= set(snap)
    return path, out, snap


class _InterruptingExecutor:
    """Wraps the real executor and raises ``exc`` at step ``at`` (mid-run)."""

    def __init__(self, inner, exc: BaseException, at: int) -> None:
        self.inner, self.exc, self.at, self.n = inner, exc, at, 0

    def execute(self, plan):
        self.n += 1
        if self.n == self.at:
            raise self.exc
        return self.inner.execute(plan)


def _interrupt_at_step(monkeypatch, exc: BaseException, at: int = 5) -> None:
    real = sim.runner.make_executor
    monkeypatch.setattr(sim.runner, "make_executor", lambda *a, **k: _InterruptingExecutor(real(*a, **k), exc, at))


def test_keyboard_interrupt_mid_run_keeps_previous_results(previous, monkeypatch, capsys):
    path, out, snap = previous
    _interrupt_at_step(monkeypatch, KeyboardInterrupt())
    assert kvsim_main(["run", str(path), "--out", str(out), "--set", "seed=2"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert _snapshot(out) == snap


def test_exception_mid_run_keeps_previous_results(previous, monkeypatch):
    path, out, snap = previous
    _interrupt_at_step(monkeypatch, RuntimeError("injected"))
    with pytest.raises(RuntimeError, match="injected"):
        kvsim_main(["run", str(path), "--out", str(out), "--set", "seed=2"])
    assert _snapshot(out) == snap


@pytest.mark.parametrize("plots", [False, True])
@pytest.mark.parametrize("exc", [KeyboardInterrupt(), OSError("disk full")])
def test_failure_while_writing_keeps_previous_results(previous, monkeypatch, exc, plots):
    # summary.json is made last: failing there, after the tables (and figures) are done, must not leave
    # new tables beside an old summary (a mixed set of files would look like one consistent run)
    import sim.commands.run as run_cmd

    path, out, snap = previous
    if plots:
        assert kvsim_main(["run", str(path), "--out", str(out), "--set", "output.plots=true"]) == 0
        snap = _snapshot(out)
        assert "kv_usage.png" in snap

    def broken(*a, **k):
        raise exc

    monkeypatch.setattr(run_cmd, "summary_json", broken)
    argv = ["run", str(path), "--out", str(out), "--set", "seed=2", "--set", f"output.plots={str(plots).lower()}"]
    if isinstance(exc, KeyboardInterrupt):
        assert kvsim_main(argv) == 130
    else:
        with pytest.raises(type(exc)):
            kvsim_main(argv)
    assert _snapshot(out) == snap


def test_failed_first_run_leaves_no_folder(tmp_path, monkeypatch):
    import sim.commands.run as run_cmd

    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    monkeypatch.setattr(run_cmd, "summary_json", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        kvsim_main(["run", str(path), "--out", str(tmp_path / "new")])
    assert not (tmp_path / "new").exists()


def test_write_atomic_leaves_old_file_and_no_temp_on_failure(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")

    def half(p: Path) -> None:
        p.write_text("new, half writ")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, half)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_finished_run_replaces_every_file(previous):
    path, out, snap = previous
    assert kvsim_main(["run", str(path), "--out", str(out), "--set", "seed=2"]) == 0
    new = _snapshot(out)
    assert set(new) == set(snap)
    assert new["requests.csv"] != snap["requests.csv"] and new["summary.json"] != snap["summary.json"]
