"""notebooks/prefix_caching.ipynb: stored with fresh outputs; with the whole distinct KV cached, kvsim's hit
rate meets the ideal computed here from the traces' hash ids."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from notebook_util import execute_fresh, stream_text  # noqa: E402

TRACES = Path(__file__).resolve().parents[1] / "scenarios" / "traces"


def ideal(path: Path, limit: int = 200) -> float:
    """Prompt tokens whose 512-token chunk prefix (the tuple of ids up to it) appeared before, over all."""
    rows = sorted((json.loads(line) for line in path.read_text().splitlines()[:limit]), key=lambda r: r["timestamp"])
    prefixes: set[tuple] = set()
    hit = total = 0
    for r in rows:
        ids = tuple(r["hash_ids"])
        reused = next((k for k in range(len(ids), 0, -1) if ids[:k] in prefixes), 0)
        hit += min(512 * reused, r["input_length"])
        total += r["input_length"]
        prefixes.update(ids[:k] for k in range(1, len(ids) + 1))
    return hit / total


def test_prefix_notebook():
    text = stream_text(execute_fresh("prefix_caching.ipynb"))
    for name in ("conversation", "synthetic"):
        m = re.search(rf"{name}: hit rate with all distinct KV cached ([\d.]+), ideal ([\d.]+)", text)
        hit, shown = float(m.group(1)), float(m.group(2))
        expected = ideal(TRACES / f"mooncake_{name}.jsonl")
        assert shown == pytest.approx(expected, abs=1e-5)
        assert expected - 5e-4 <= hit <= expected + 1e-5
    # a sliding-window model with its window pages in the cache: with room for everything, nothing a hit
    # needs is evicted, so it meets the ideal too
    m = re.search(r"gemma-3-12b window pages: hit rate with all distinct KV cached ([\d.]+)", text)
    expected = ideal(TRACES / "mooncake_conversation.jsonl")
    assert expected - 5e-4 <= float(m.group(1)) <= expected + 1e-5
