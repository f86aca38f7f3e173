"""Calibration documents read once per process while their file is unchanged.

A sweep, a capacity search or a test session builds an executor for every run, and each read a
calibration's JSON again (8-9 ms for a shipped one) and so started an empty memo of its per-shape GEMM
curves (shape_correction.py keys its evaluators by the correction dict's identity: 10-30 ms of tree
predictions a model). Here the parsed document is kept, keyed by the resolved path and the file's
size and modification time, so that the same file unchanged gives the same objects.

Invariant: callers treat a returned document as read-only, nested values included (they build new
dicts and ``CostParams`` over it, never assign into it); the cache holds at most ``MAX_DOCUMENTS``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

MAX_DOCUMENTS = 16

_documents: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
_lock = threading.Lock()


def read_document(path: Path) -> Any:
    """``json.loads`` of the file at ``path``, shared with earlier reads of the same unchanged file
    (OSError and ValueError as reading it raises them)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _documents.get(key)
        if hit is not None:
            _documents.move_to_end(key)
            return hit
    doc = json.loads(path.read_text())
    with _lock:
        _documents[key] = doc
        while len(_documents) > MAX_DOCUMENTS:
            _documents.popitem(last=False)
    return doc
