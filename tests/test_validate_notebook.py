"""The cost-model validation notebook executes top to bottom (nbclient) and is stored with fresh outputs
(about two minutes here with two cores, as it fits every GPU's leave-one-model-out folds: run on demand,
``pytest -m slow``; no time limit is asserted: this machine is shared, and speed is a benchmark's business)."""

from __future__ import annotations

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from notebook_util import execute_fresh  # noqa: E402


@pytest.mark.slow   # fits every GPU's leave-one-model-out folds: minutes (pytest -m slow)
def test_notebook_executes():
    execute_fresh("cost_model_validation.ipynb", timeout=900)
