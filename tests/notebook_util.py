"""Execute a notebook once and check that its stored outputs are fresh (scripts/refresh_notebooks.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("refresh_notebooks", ROOT / "scripts" / "refresh_notebooks.py")
refresh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refresh)


def execute_fresh(name: str, min_figures: int = 1, timeout: int = 180):
    """The freshly executed notebook ``notebooks/NAME``, after checking it raised nothing and that the stored
    file shows the same numbers of figures and tables, at least ``min_figures`` figures."""
    import nbformat

    path = ROOT / "notebooks" / name
    stored = nbformat.read(path, as_version=4)
    fresh = refresh.execute(path, timeout=timeout)
    why = refresh.stale(stored, fresh)
    assert not why, f"{name}: {why}"
    assert refresh.output_counts(stored)["figures"] >= min_figures
    return fresh


def stream_text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")
