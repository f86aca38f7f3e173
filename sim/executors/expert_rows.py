"""How many row tiles a fused mixture-of-experts launch computes, with each expert's rows random.

Under uniform routing each of a step's ``n`` tokens picks an expert with probability ``p = k / E`` (its k
choices distinct), so one expert's rows are X ~ Binomial(n, p). vLLM's fused kernel pads each expert's rows
to its tile height T (``moe_align_block_size``) and runs ceil(X / T) row tiles for it. Priced from the mean
alone (ceil(n p / P(X > 0) / T) for every active expert), every expert would cross a tile boundary at the
same token count and the price would jump by a whole tile row at once (Mixtral-8x7B: +35-46% from one token
to the next at 257, 513, 1,025 tokens); the expectation grows smoothly, as the kernel's measured times do.

    row_tiles(n, p, T) = E[ceil(X / T) | X > 0] = sum_x pmf(x) ceil(x / T) / P(X > 0)

the row tiles of one active expert. The pmf is summed over the window mean +- 12 standard deviations
(outside it the mass is below 1e-30), in logs, with the ratio pmf(x + 1) / pmf(x) = (n - x) / (x + 1) x
p / (1 - p): O(sqrt(n)) work, and each (n, p, T) once a process (memoized): pricing stays microseconds.
Invariants: 1 <= row_tiles <= ceil(n / T); it never falls as n grows; row_tiles -> ceil(n p / T) as the
spread vanishes (p = 1: every token's rows on the one expert).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=65536)
def row_tiles(n: int, p: float, tile: int) -> float:
    """Expected row tiles of one active expert (X > 0) of Binomial(``n``, ``p``) rows, tiles of ``tile`` rows."""
    if n <= 0:
        return 1.0
    if p >= 1.0:
        return float(math.ceil(n / tile))
    mean, sd = n * p, math.sqrt(n * p * (1.0 - p))
    lo, hi = max(1, math.floor(mean - 12 * sd)), min(n, math.ceil(mean + 12 * sd))
    x = np.arange(lo, hi + 1, dtype=np.float64)
    log_first = (math.lgamma(n + 1) - math.lgamma(lo + 1) - math.lgamma(n - lo + 1)
                 + lo * math.log(p) + (n - lo) * math.log1p(-p))
    steps = np.log(n - x[:-1]) - np.log(x[:-1] + 1.0) + math.log(p / (1.0 - p))
    pmf = np.exp(log_first + np.concatenate(([0.0], np.cumsum(steps))))
    hit = -math.expm1(n * math.log1p(-p))   # P(X > 0)
    return max(1.0, float(np.dot(pmf, np.ceil(x / tile))) / hit)   # (>= 1: rounding in the sum)
