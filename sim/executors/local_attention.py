"""What a step's attention reads on a layer that sees only part of the context (``ModelSpec.local_attention``):
a sliding window (Mistral-7B-v0.1, Gemma 2 and 3, gpt-oss) or a chunk (Llama 4's chunked local attention),
from the same per-sequence numbers the full layers' attention is priced from.

A query at position p (0-based) sees the keys from ``first_visible(p)`` to its own:

    sliding window W:  max(0, p - W + 1)        (flash-attention's window of (W - 1, 0), as vLLM passes it)
    chunk C:           (p // C) x C             (the chunk it is in: Llama 4's attention_chunk_size)

so for a sequence computing n new tokens over c cached ones:

    pairs   = sum over p = c .. c + n - 1 of (p + 1 - first_visible(p))   (full: n c + n (n + 1) / 2)
    cached  = c - first_visible(c)        cached tokens read: those the first new query sees
    decode  = c + 1 - first_visible(c)    keys a decode reads, its own new token's included (full: c + 1)
    verify  = c + n - first_visible(c)    a decode of n = 1 + d queries: the union of what they see

Invariant: where ``first_visible`` is 0 (a window or chunk no position reaches) every figure is the full
layers'. The KV cache frees what no later query can see the same way (sim/kv/window_pages.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class LocalAttention:
    """A layer kind that sees a sliding window of ``span`` tokens (``chunked`` False) or the chunk of ``span``
    tokens its query is in (``chunked`` True)."""

    span: int
    chunked: bool = False

    def first_visible(self, p: int) -> int:
        """The first token a query at position ``p`` sees."""
        return (p // self.span) * self.span if self.chunked else max(0, p - self.span + 1)

    def pairs(self, n: int, c: int) -> int:
        """(query, key) pairs of ``n`` new tokens after ``c`` cached ones."""
        if self.chunked:
            return chunk_pairs(n, c, self.span)
        return window_pairs(n, c, self.span)

    def lane_decode_keys(self, ctx: np.ndarray) -> int:
        """Keys a decode lane's requests read in all (their computed tokens ``ctx``, each decoding one more)."""
        if self.chunked:
            return int((ctx % self.span).sum()) + len(ctx)
        return int(np.minimum(ctx + 1, self.span).sum())

    def step_stats(self, entries: Iterable) -> tuple[int, int, int]:
        """(decode keys, prefill new tokens' pairs, prefill cached tokens read) of a step's explicit entries
        (ScheduledRequests), summed as the cost model sums the full layers' (a decode: one new token over a
        context; a verification: drafts to check; else a prefill)."""
        dec = pairs = cached = 0
        for s in entries:
            n, c = s.num_new_tokens, s.num_context_tokens
            first = self.first_visible(c)
            if n == 1 and c > 0:
                dec += c + 1 - first
            elif s.num_draft_tokens:
                dec += c + n - first
            else:
                pairs += self.pairs(n, c)
                cached += c - first
        return dec, pairs, cached


def window_pairs(n: int, c: int, window: int) -> int:
    """Pairs of ``n`` new tokens after ``c`` cached ones under a sliding ``window``: the sum of min(x, window)
    over x = c + 1 .. c + n."""
    lo, hi = c + 1, c + n
    if hi <= window:
        return (lo + hi) * n // 2
    if lo >= window:
        return n * window
    return (lo + window) * (window - lo + 1) // 2 + (hi - window) * window


def chunk_pairs(n: int, c: int, chunk: int) -> int:
    """Pairs of ``n`` new tokens after ``c`` cached ones under chunks of ``chunk``: the sum of p % chunk + 1
    over p = c .. c + n - 1, summed a chunk at a time."""
    total, p, end = 0, c, c + n
    while p < end:
        stop = min(end, (p // chunk + 1) * chunk)
        lo, hi = p % chunk + 1, stop - 1 - (p // chunk) * chunk + 1
        total += (lo + hi) * (stop - p) // 2
        p = stop
    return total
