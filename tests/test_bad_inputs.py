"""The bad-input corpus (tests/bad_inputs/manifest.yaml): each case exits 2 with one line naming the file
and the key or line, prints no traceback, and leaves no output files behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.cli import main as kvsim_main

CORPUS = Path(__file__).parent / "bad_inputs"
CASES = yaml.safe_load((CORPUS / "manifest.yaml").read_text())["cases"]


def _case_id(case: dict) -> str:
    return case["file"].removesuffix(".yaml") + ("-" + "_".join(case["args"]) if case.get("args") else "")


def _argv(case: dict, root: Path) -> list[str]:
    command = case.get("command", "run")
    argv = [command, str(root / case["file"]), *case.get("args", [])]
    if command == "run":
        argv += ["--out", str(root / "out")]
    return argv


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _check(case: dict, root: Path, code: int, err: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, f"exit {code}, stderr: {err}"
    assert len(lines) == 1, f"expected one line, got: {err}"
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in err
    names = case.get("names", case["file"])
    assert (names if names.startswith("-") else str(root / names)) in line, line
    assert case["expect"] in line, line


def test_corpus_is_large_and_every_file_is_used():
    assert len(CASES) >= 30
    used = {c["file"] for c in CASES} | {c.get("names") for c in CASES}
    files = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.yaml")} - {"manifest.yaml"}
    assert files <= used, f"corpus files without a case: {sorted(files - used)}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_bad_input_exits_2_with_one_line(case, tmp_path, capsys):
    root = tmp_path / "corpus"
    shutil.copytree(CORPUS, root)
    before = _listing(root)
    try:
        code = kvsim_main(_argv(case, root))
    except SystemExit as e:  # argparse-level errors
        code = e.code
    _check(case, root, code, capsys.readouterr().err)
    assert _listing(root) == before, f"files left behind: {sorted(_listing(root) - before)}"


@pytest.mark.parametrize("name", ["unknown_kv_key.yaml", "trace_malformed_row.yaml", "sweep_unknown_grid_key.yaml",
                                  "weights_do_not_fit.yaml"])
def test_bad_input_in_a_real_process(name, tmp_path):
    case = next(c for c in CASES if c["file"] == name)
    root = tmp_path / "corpus"
    shutil.copytree(CORPUS, root)
    before = _listing(root)
    r = subprocess.run([sys.executable, "-m", "sim.cli", *_argv(case, root)], capture_output=True, text=True,
                       timeout=120)
    _check(case, root, r.returncode, r.stderr)
    assert r.stdout == "" and _listing(root) == before
