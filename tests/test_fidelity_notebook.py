"""notebooks/fidelity.ipynb executes top to bottom (quick mode: 60 s a stage, one seed) with its figures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "fidelity.ipynb"


def test_fidelity_notebook_executes(monkeypatch):
    monkeypatch.setenv("KVSIM_FIDELITY_QUICK", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    stored_images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = sum("image/png" in o.get("data", {}) for o in outputs)
    assert images == 3                    # parity, the simulators beside each other, the step breakdown
    assert stored_images == images        # the stored notebook shows the same figures
    assert os.environ["KVSIM_FIDELITY_QUICK"] == "1"
