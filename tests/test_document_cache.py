"""Calibration documents are read once per process while their file is unchanged
(sim/executors/document_cache.py)."""

from __future__ import annotations

import json
import os

import pytest

from sim.executors import document_cache
from sim.executors.cost_model import load_calibration, shipped_calibration
from sim.executors.document_cache import read_document
from sim.executors.shape_correction import evaluator


def test_an_unchanged_file_gives_the_same_objects_and_curves():
    first, _ = load_calibration("h100-80gb")
    second, _ = load_calibration("h100-80gb")
    assert first is not second   # each caller gets parameters of its own ...
    assert first.gemm_correction is second.gemm_correction   # ... over the same read document,
    assert evaluator(first.gemm_correction) is evaluator(second.gemm_correction)   # so one memo of curves


def test_a_rewritten_file_is_read_again_even_with_its_size_and_time_unchanged(tmp_path):
    doc = json.loads(shipped_calibration("a100-80gb").read_text())
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    assert load_calibration(str(path))[0].step_overhead_s == doc["params"]["step_overhead_s"]
    new = 0.003 if doc["params"]["step_overhead_s"] != 0.003 else 0.004
    doc["params"]["step_overhead_s"] = new   # (as long as the old value, 0.002: the same size)
    stat = path.stat()
    path.write_text(json.dumps(doc))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))   # (a coarse clock may not tick between writes)
    assert path.stat().st_size == stat.st_size
    assert load_calibration(str(path))[0].step_overhead_s == new


def test_what_a_caller_sets_does_not_reach_the_next_reader():
    params, doc = load_calibration("a100-80gb")
    params.step_overhead_s = 1.0
    doc["engine"] = "changed"
    again, doc_again = load_calibration("a100-80gb")
    assert again.step_overhead_s != 1.0 and doc_again["engine"] != "changed"


def test_a_bounded_number_of_documents_is_kept(tmp_path):
    for i in range(document_cache.MAX_DOCUMENTS + 3):
        (tmp_path / f"{i}.json").write_text(json.dumps({"i": i}))
        assert read_document(tmp_path / f"{i}.json") == {"i": i}
    assert len(document_cache._documents) == document_cache.MAX_DOCUMENTS


def test_a_broken_file_still_fails_where_it_is_read(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError):
        read_document(path)
    with pytest.raises(Exception, match="not a kvsim calibration file"):
        load_calibration(str(path))
