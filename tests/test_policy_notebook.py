"""notebooks/policy_comparison.ipynb executes top to bottom, shows its figures, and is stored with fresh outputs."""

from __future__ import annotations

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from notebook_util import execute_fresh, stream_text  # noqa: E402


def test_policy_notebook_executes():
    nb = execute_fresh("policy_comparison.ipynb", min_figures=3)
    text = stream_text(nb)
    ratio = float(text.split("continuous / static output throughput:")[1].split()[0])
    assert ratio >= 2.0
