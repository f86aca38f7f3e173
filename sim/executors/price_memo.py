"""Prices shared by every cost-model executor of one pricing setup in a process.

A capacity search, a sweep or a fidelity replay builds a new executor for each run of the same model
on the same hardware, and each priced the same token counts again: a step's GEMM, all-reduce and LM-head
times depend on the model, the hardware, the fitted parameters and the engine terms, never on the run.
Filling those memos was a third of a small run's time (12 runs of 300 requests in a concurrency search).
Executors whose setups are equal share one ``PriceMemo``.

The setup's key is the model's, the hardware's and the engine terms' reprs and every fitted parameter
but the GEMM correction, which is matched by identity (calibrations of the same content share it:
document_cache.py; an empty one matches any empty one).

Invariants: a memo's entries are pure functions of its key (executors never change their parameters once
built); at most ``MAX_SETUPS`` setups are kept, the least recently built dropped first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from typing import Any

MAX_SETUPS = 16


@dataclass(slots=True)
class PriceMemo:
    """Memoised prices: all layers' (linear, all-reduce) by token count, the LM head by batch size; with
    the engine terms, (linear, all-reduce) by (padded tokens, in a graph) and the fixed step terms by
    (tokens, sequences, has a prefill)."""

    linear: dict[int, tuple[float, float]] = field(default_factory=dict)
    head: dict[int, float] = field(default_factory=dict)
    engine_linear: dict[tuple[int, bool], tuple[float, float]] = field(default_factory=dict)
    engine_fixed: dict[tuple[int, int, bool], tuple[float, float, float, float, float]] = field(default_factory=dict)


_memos: OrderedDict[tuple, tuple[dict[str, Any], PriceMemo]] = OrderedDict()
_lock = threading.Lock()


def price_memo(model: Any, hardware: Any, params: Any, engine: Any) -> PriceMemo:
    """The memo shared by executors of this setup (a new one for a setup not seen, or whose GEMM
    correction is another object than the one remembered)."""
    rest = tuple(repr(getattr(params, f.name)) for f in fields(params) if f.name != "gemm_correction")
    key = (repr(model), repr(hardware), rest, repr(engine))
    correction = params.gemm_correction
    with _lock:
        hit = _memos.get(key)
        if hit is not None and (hit[0] is correction or (not hit[0] and not correction)):
            _memos.move_to_end(key)
            return hit[1]
        memo = PriceMemo()
        _memos[key] = (correction, memo)
        _memos.move_to_end(key)
        while len(_memos) > MAX_SETUPS:
            _memos.popitem(last=False)
        return memo
