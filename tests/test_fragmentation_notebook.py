"""notebooks/fragmentation.ipynb: stored with fresh outputs; its findings hold."""

from __future__ import annotations

import ast

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from notebook_util import execute_fresh, stream_text  # noqa: E402


def _printed(text: str, label: str):
    return ast.literal_eval(text.split(label)[1].splitlines()[0].strip())


def test_fragmentation_notebook():
    text = stream_text(execute_fresh("fragmentation.ipynb", min_figures=3))
    swap = _printed(text, "swap time (s) by block size:")
    slack = _printed(text, "reserved + internal fragmentation (%) by block size:")
    assert len(swap) == len(slack) == 5
    assert all(a > b for a, b in zip(swap, swap[1:]))      # fewer, larger copies as blocks grow
    assert all(a < b for a, b in zip(slack, slack[1:]))    # more of the last block empty
    peaks = _printed(text, "external fragmentation peak (%):")
    assert peaks["paged"] == 0 and min(peaks[a] for a in peaks if a != "paged") > 10
