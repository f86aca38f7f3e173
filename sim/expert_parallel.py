"""Expert parallelism: a mixture of experts' routed experts placed whole on the GPUs of a tensor-parallel
group (vLLM's ``--enable-expert-parallel`` without data parallelism; ``hardware.expert_parallel``).

vLLM then shards the experts by expert instead of splitting each one's intermediate width over the GPUs
(its ``FusedMoEParallelConfig``: TP 2 with EP is EP 2, the MoE layer's own TP 1). Attention, shared experts
and dense layers stay tensor-parallel, and the experts' outputs are summed by the same all-reduce that ends
a tensor-parallel MLP (no all-to-all: that needs data parallelism). Placement follows vLLM's
``determine_expert_map`` ("linear"): E experts over N GPUs, floor(E / N) each and one more on the first
E mod N.

Each GPU runs one fused launch per projection over its own active experts at their full width, and the
step waits for the busiest GPU. For a step of T tokens, each choosing k of E experts at random (uniform
routing, no load balancer), kvsim prices that GPU by two expected maxima over the N GPUs:

    active   max over GPUs of Binomial(L_g, 1 - (1 - k/E)^T)   its experts hit by at least one token
    rows     max over GPUs of Binomial(T x k, L_g / E)          the (token, expert) pairs routed to it

(L_g: the experts GPU g holds), each the exact expected maximum of independent binomials (``expected_max``),
at least one active expert and the busiest GPU's mean share of the rows. The GPUs' counts are in truth
anti-correlated (their rows sum to T x k), which raises the maximum, and a token's k choices are distinct,
which lowers it: against a simulated router these run 0-5% low (tests/test_expert_parallel.py). Real
routing is less uniform than this (the reason for vLLM's expert load balancer, EPLB): the imbalance priced
is a floor.

Memory: vLLM sizes every GPU's cache by the fullest one, so a group whose GPUs hold unequal expert counts
gives up, on each lighter GPU, the bytes of the experts it lacks (``weight_excess_bytes``).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

import numpy as np

from sim.specs import ModelSpec


def local_expert_counts(num_experts: int, gpus: int) -> list[int]:
    """Experts each GPU holds (vLLM's linear placement): floor(E / N), one more on the first E mod N GPUs."""
    base, extra = divmod(num_experts, gpus)
    return [base + 1] * extra + [base] * (gpus - extra)


def expert_parallel_problem(model: ModelSpec, gpus: int) -> str | None:
    """Why ``gpus`` GPUs cannot share ``model``'s experts by expert (None: they can)."""
    if not model.num_experts:
        return f"{model.name} has no experts to place (expert parallelism is for a mixture of experts)"
    if model.num_experts < gpus:
        return (f"{model.name}'s {model.num_experts} experts over {gpus} GPUs would leave "
                f"{gpus - model.num_experts} of them without an expert")
    return None


def expert_bytes(model: ModelSpec) -> float:
    """One routed expert's weights in one layer, as stored (gate and up, or up; down)."""
    h, inter = model.hidden_size, model.intermediate_size
    gate = 2 if model.gated_mlp else 1
    return (h * gate * inter * model.weight_bytes_per_element(h)
            + inter * h * model.weight_bytes_per_element(inter))


def weight_excess_bytes(model: ModelSpec, gpus: int) -> int:
    """Bytes a group of ``gpus`` GPUs loses to an uneven placement: every GPU keeps room for the fullest one's
    experts, (N x ceil(E / N) - E) experts a layer over the expert layers (0 when N divides E)."""
    counts = local_expert_counts(model.num_experts, gpus)
    missing = gpus * counts[0] - model.num_experts
    return round(missing * expert_bytes(model) * (model.num_layers - model.dense_layers))


WINDOW_SD = 12.0   # a binomial's CDF is taken as 0 below its mean - this many standard deviations, 1 above + this


def _binomial_window(n: int, p: float) -> tuple[int, np.ndarray]:
    """(lo, P(X <= x) for x = lo .. hi) for X ~ Binomial(n, p), over the window where that is neither nil nor 1
    in float64 (the mean -+ WINDOW_SD standard deviations; log-space from lgamma at ``lo``, so that a large n
    neither underflows nor costs more than the window)."""
    if p <= 0.0:
        return 0, np.ones(1)
    if p >= 1.0:
        return n, np.ones(1)
    mean, sd = n * p, math.sqrt(n * p * (1.0 - p))
    lo, hi = max(0, math.floor(mean - WINDOW_SD * sd)), min(n, math.ceil(mean + WINDOW_SD * sd) + 1)
    x = np.arange(lo, hi + 1, dtype=np.float64)
    start = math.lgamma(n + 1) - math.lgamma(lo + 1) - math.lgamma(n - lo + 1)
    log_choose = start + np.concatenate(([0.0], np.cumsum(np.log(n - x[:-1]) - np.log(x[:-1] + 1.0))))
    pmf = np.exp(log_choose + x * math.log(p) + (n - x) * math.log1p(-p))
    cdf = np.minimum(np.cumsum(pmf), 1.0)
    cdf[-1] = 1.0 if hi == n else cdf[-1]
    return lo, cdf


def expected_max(trials: list[int], probs: list[float]) -> float:
    """E[max_g X_g] for independent X_g ~ Binomial(trials[g], probs[g]): the sum over x >= 0 of
    P(max > x) = 1 - prod_g P(X_g <= x), each CDF nil below its window and 1 above it (GPUs alike share
    one CDF, raised to their count)."""
    alike = Counter(zip(trials, probs))
    windows = [(*_binomial_window(n, p), count) for (n, p), count in alike.items()]
    lo = max(w_lo for w_lo, _, _ in windows)   # below it some X_g is never <= x: P(max > x) = 1
    hi = max(w_lo + len(cdf) - 1 for w_lo, cdf, _ in windows)   # from it on, every X_g <= x
    below = np.ones(hi - lo + 1)
    for w_lo, cdf, count in windows:
        part = cdf[max(0, lo - w_lo):]            # (x from max(lo, w_lo); the window starts at lo or later)
        start = max(0, w_lo - lo)
        below[:start] = 0.0
        below[start:start + len(part)] *= part[:hi - lo + 1 - start] ** count
    return float(lo + np.sum(1.0 - below[:hi - lo]))


@lru_cache(maxsize=1 << 14)
def busiest_gpu(num_experts: int, experts_per_token: int, gpus: int, tokens: int) -> tuple[float, float]:
    """(active experts, routed rows) of the busiest of ``gpus`` GPUs in a step of ``tokens`` tokens: the
    expected maxima of the module docstring."""
    counts = local_expert_counts(num_experts, gpus)
    hit = 1.0 - (1.0 - experts_per_token / num_experts) ** tokens
    # (some GPU holds an active expert, and the busiest its share of the rows at least)
    active = max(1.0, expected_max(counts, [hit] * gpus))
    rows = max(tokens * experts_per_token * counts[0] / num_experts,
               expected_max([tokens * experts_per_token] * gpus, [c / num_experts for c in counts]))
    return active, rows
