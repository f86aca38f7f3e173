"""What a step's attention reads on a sliding-window layer (``ModelSpec.sliding_window``), from the same
per-sequence numbers the full layers' attention is priced from.

A query at position p (0-based) attends the ``window`` keys ending at its own: positions max(0, p - window + 1)
.. p, min(p + 1, window) of them (flash-attention's window of (window - 1, 0), as vLLM passes it). So for a
sequence computing n new tokens over c cached ones:

    pairs   = sum over p = c .. c + n - 1 of min(p + 1, window)   (the full layers': n c + n (n + 1) / 2)
    cached  = min(c, window - 1)     cached tokens read: those the first new query still sees
    decode  = min(c + 1, window)     keys a decode reads, its own new token's included (full: c + 1)
    verify  = min(c + n, window + n - 1)   a decode of n = 1 + d queries: the union of their windows

Invariant: with a window of at least c + n every figure equals the full layers'.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def window_pairs(n: int, c: int, window: int) -> int:
    """(query, key) pairs of n new tokens after c cached ones under a ``window``: the sum of min(x, window)
    over x = c + 1 .. c + n."""
    lo, hi = c + 1, c + n
    if hi <= window:
        return (lo + hi) * n // 2
    if lo >= window:
        return n * window
    return (lo + window) * (window - lo + 1) // 2 + (hi - window) * window


def lane_decode_keys(ctx: np.ndarray, window: int) -> int:
    """Keys a decode lane's requests read in all (their computed tokens ``ctx``, each decoding one more)."""
    return int(np.minimum(ctx + 1, window).sum())


def window_stats(entries: Iterable, window: int) -> tuple[int, int, int]:
    """(decode keys, prefill new tokens' pairs, prefill cached tokens read) of a step's
    explicit entries (ScheduledRequests) on a sliding-window layer, summed as the cost model sums the full
    layers' (a decode: one new token over a context; a verification: drafts to check; else a prefill)."""
    dec = pairs = cached = 0
    for s in entries:
        n, c = s.num_new_tokens, s.num_context_tokens
        if n == 1 and c > 0:
            dec += min(c + 1, window)
        elif s.num_draft_tokens:
            dec += min(c + n, window + n - 1)
        else:
            pairs += window_pairs(n, c, window)
            cached += min(c, window - 1)
    return dec, pairs, cached
