"""Synthetic workloads: arrival processes, length distributions, shared prefixes, priorities.

All randomness comes from one ``np.random.Generator`` drawn in a fixed order (arrivals, prompt
lengths, output lengths, prefix groups, priorities), so a seed gives the same workload bit for bit.

Arrival processes (first request at t=0; ``rate`` in requests per second):
    poisson(rate)       exponential gaps, mean 1/rate
    gamma(rate, cv)     gamma gaps, mean 1/rate, coefficient of variation cv (cv=1 is poisson)
    constant(rate)      gaps of exactly 1/rate
    burst               every request at t=0
Length distributions (integers, clipped to [min, max]):
    fixed(value) | uniform(min, max) | lognormal(mean, std) with mean and std of the lengths themselves
    | zipf(a, min, max): P(min + k - 1) ~ k^-a for k = 1, 2, ... | empirical(trace): resampled lengths
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.errors import KvsimError
from sim.workload.config import ArrivalConfig, LengthConfig, PriorityConfig, SyntheticConfig
from sim.workload.table import Columns, LoadStats

ZIPF_DEFAULT_SPAN = 1 << 17  # zipf without max: support min .. min + 131071


def arrival_times(cfg: ArrivalConfig, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` non-decreasing arrival times in seconds, the first at 0."""
    if cfg.process == "burst" or count == 0:
        return np.zeros(count)
    assert cfg.rate is not None
    mean_gap = 1.0 / cfg.rate
    if cfg.process == "constant":
        gaps = np.full(count - 1, mean_gap)
    elif cfg.process == "poisson":
        gaps = rng.exponential(mean_gap, size=count - 1)
    else:  # gamma: shape k = 1/cv^2, scale = mean/k
        shape = 1.0 / cfg.cv**2
        gaps = rng.gamma(shape, mean_gap / shape, size=count - 1)
    return np.concatenate(([0.0], np.cumsum(gaps)))


def lognormal_params(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the underlying normal for a lognormal with this mean and std."""
    sigma2 = np.log1p((std / mean) ** 2)
    return float(np.log(mean) - sigma2 / 2), float(np.sqrt(sigma2))


def sample_lengths(cfg: LengthConfig, count: int, rng: np.random.Generator, *, role: str,
                   base_dir: Path, where: str) -> np.ndarray:
    """``count`` integer lengths >= 1. ``role`` is "prompt" or "output" (which side empirical reads)."""
    hi = cfg.max if cfg.max is not None else np.iinfo(np.int64).max
    if cfg.dist == "fixed":
        assert cfg.value is not None
        return np.full(count, cfg.value, dtype=np.int64)
    if cfg.dist == "uniform":
        assert cfg.max is not None
        return rng.integers(cfg.min, cfg.max + 1, size=count, dtype=np.int64)
    if cfg.dist == "lognormal":
        assert cfg.mean is not None and cfg.std is not None
        mu, sigma = lognormal_params(cfg.mean, cfg.std)
        raw = rng.lognormal(mu, sigma, size=count)
        return np.clip(np.rint(raw), cfg.min, hi).astype(np.int64)
    if cfg.dist == "zipf":
        assert cfg.a is not None
        span = (cfg.max - cfg.min + 1) if cfg.max is not None else ZIPF_DEFAULT_SPAN
        cdf = np.cumsum(np.arange(1, span + 1, dtype=np.float64) ** -cfg.a)
        ranks = np.searchsorted(cdf, rng.random(count) * cdf[-1], side="right")
        return cfg.min + np.minimum(ranks, span - 1).astype(np.int64)
    # empirical
    pool = empirical_pool(cfg, role=role, base_dir=base_dir, where=where)
    return np.clip(rng.choice(pool, size=count, replace=True), cfg.min, hi).astype(np.int64)


def empirical_pool(cfg: LengthConfig, *, role: str, base_dir: Path, where: str) -> np.ndarray:
    """The prompt (or output) lengths of the trace named by ``cfg.trace``, in file order."""
    from sim.workload.traces import FORMATS, guess_format, load_trace

    assert cfg.trace is not None
    path = Path(cfg.trace)
    path = path if path.is_absolute() else base_dir / path
    source = str(path)
    if not path.exists():
        raise KvsimError(where, f"empirical lengths: no such trace {source}")
    fmt = cfg.format or guess_format(path, source)
    if fmt not in FORMATS:
        raise KvsimError(where, f"empirical lengths: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    cols = load_trace(path, fmt, source, LoadStats())
    pool = cols.prompt_len if role == "prompt" else cols.output_len
    pool = pool[pool > 0]
    if len(pool) == 0:
        raise KvsimError(source, "empirical lengths: the trace has no usable lengths")
    return pool


def sample_priorities(cfg: PriorityConfig, count: int, rng: np.random.Generator) -> np.ndarray:
    if cfg.dist == "fixed":
        return np.full(count, cfg.value, dtype=np.int64)
    if cfg.max < cfg.min:
        raise KvsimError("workload.synthetic.priority", f"max ({cfg.max}) is below min ({cfg.min})")
    return rng.integers(cfg.min, cfg.max + 1, size=count, dtype=np.int64)


def generate(cfg: SyntheticConfig, rng: np.random.Generator, base_dir: Path,
             where: str = "workload.synthetic") -> Columns:
    """The synthetic workload, in arrival order."""
    count = cfg.num_requests
    arrival = arrival_times(cfg.arrival, count, rng)
    prompt = sample_lengths(cfg.prompt_len, count, rng, role="prompt", base_dir=base_dir, where=f"{where}.prompt_len")
    output = sample_lengths(cfg.output_len, count, rng, role="output", base_dir=base_dir, where=f"{where}.output_len")
    group = plen = None
    if cfg.shared_prefix is not None:
        group = rng.integers(0, cfg.shared_prefix.groups, size=count, dtype=np.int64)
        plen = np.full(count, cfg.shared_prefix.length, dtype=np.int64)
        prompt = np.maximum(prompt, plen + 1)  # every prompt has at least one token of its own
    priority = sample_priorities(cfg.priority, count, rng) if cfg.priority is not None else None
    n = np.full(count, max(cfg.n, 1), dtype=np.int64) if cfg.n != 1 else None
    beam = np.full(count, cfg.beam_width, dtype=np.int64) if cfg.beam_width != 1 else None
    return Columns(arrival=arrival, prompt_len=prompt, output_len=output, priority=priority, n=n,
                   prefix_group=group, prefix_len=plen, beam_width=beam)
