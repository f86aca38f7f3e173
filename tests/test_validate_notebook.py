"""The cost-model validation notebook executes top to bottom (nbclient) in well under a minute, and is stored
with fresh outputs."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from notebook_util import execute_fresh  # noqa: E402


def test_notebook_executes():
    t0 = time.perf_counter()
    execute_fresh("cost_model_validation.ipynb")
    assert time.perf_counter() - t0 < 90
