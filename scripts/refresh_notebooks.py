"""Re-execute the notebooks and store their outputs, so figures and tables show on a repository page.

    python scripts/refresh_notebooks.py              # every notebooks/*.ipynb, saved in place with outputs
    python scripts/refresh_notebooks.py --check      # execute, compare with the stored outputs, save nothing
    python scripts/refresh_notebooks.py notebooks/fragmentation.ipynb

Run it before each release (and after changing a notebook's generator in scripts/make_*_notebook.py).
``--check`` exits 1 when a notebook's stored figures or tables no longer match a fresh execution's count,
or when a fresh execution raises; tests/test_*_notebook.py make the same check.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def output_counts(nb) -> dict[str, int]:
    """Figures (image/png outputs), tables (HTML outputs holding a <table>) and errors of a notebook."""
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    data = [o.get("data", {}) for o in outs]
    return {"figures": sum("image/png" in d for d in data),
            "tables": sum("<table" in "".join(d.get("text/html", "")) for d in data),
            "errors": sum(o.get("output_type") == "error" for o in outs)}


def execute(path: Path, timeout: int = 900):
    """A freshly executed copy of the notebook at ``path`` (the file is not changed). The kernel runs without
    KVSIM_CHECK_INTEGRITY (the test suite sets it; the notebooks are demonstrations, checked elsewhere)."""
    nb = nbformat.read(path, as_version=4)
    saved = os.environ.pop("KVSIM_CHECK_INTEGRITY", None)  # the kernel inherits this process's environment
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        if saved is not None:
            os.environ["KVSIM_CHECK_INTEGRITY"] = saved
    for cell in nb.cells:  # no volatile ids or execution metadata: a re-run changes only what changed
        cell.get("metadata", {}).pop("execution", None)
    return nb


def stale(stored, fresh) -> str:
    """'' when the stored outputs match a fresh execution's counts, else what differs."""
    a, b = output_counts(stored), output_counts(fresh)
    if b["errors"]:
        return f"a fresh execution raised ({b['errors']} error outputs)"
    if a != b:
        return f"stored {a}, fresh execution {b}: run python scripts/refresh_notebooks.py"
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: every notebooks/*.ipynb)")
    p.add_argument("--check", action="store_true", help="compare with the stored outputs; write nothing")
    args = p.parse_args(argv)
    failed = 0
    for path in args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb")):
        fresh = execute(path)
        if args.check:
            why = stale(nbformat.read(path, as_version=4), fresh)
            print(f"{path.name}: {why or 'up to date'}")
            failed += bool(why)
        else:
            counts = output_counts(fresh)
            if counts["errors"]:
                print(f"{path.name}: not saved, a cell raised", file=sys.stderr)
                failed += 1
                continue
            nbformat.write(fresh, path)
            print(f"{path.name}: saved with {counts['figures']} figures and {counts['tables']} tables")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
