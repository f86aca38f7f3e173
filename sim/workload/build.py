"""``build_workload``: a scenario's ``workload:`` section -> Requests sorted by arrival.

    source (trace | synthetic | inline) -> drop empty rows -> arrivals from workload.arrival (traces)
    -> stable sort by arrival -> shift traces to t=0 -> limit -> window -> time_scale -> rate
    -> max_model_len clipping -> Request objects, req_id = 0..N-1 in arrival order
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from sim.errors import KvsimError
from sim.limits import MAX_REQUESTS, MAX_TIME_S
from sim.request import Request
from sim.workload import reshape
from sim.workload.config import InlineRequest, WorkloadConfig
from sim.workload.fanout import extra_samples, fan_out
from sim.workload.jsonl import MOONCAKE_BLOCK_TOKENS
from sim.workload.synthetic import arrival_times, generate, sample_lengths
from sim.workload.table import Columns, LoadStats
from sim.workload.traces import load_trace


@dataclass(slots=True)
class Workload:
    """The requests of one run (sorted by arrival, req_id = index) and what building them saw."""

    requests: list[Request]
    stats: dict = field(default_factory=dict)
    origin: np.ndarray | None = None   # fanned out (sim/workload/fanout.py): the workload request each serves

    def fan_out(self, lengths: np.ndarray | None = None) -> None:
        """Each request of n samples becomes n requests (``scheduler.parallel_sampling: fanout``; ``lengths``:
        sim/workload/fanout.py's)."""
        self.requests, self.origin = fan_out(self.requests, lengths)
        if self.origin is not None:
            self.stats["engine_requests"] = len(self.requests)


def sample_output_lengths(cfg: WorkloadConfig, requests: list[Request], base_dir: Path, seed: int) -> np.ndarray | None:
    """Output lengths of the samples past each request's first (``extra_samples``), drawn from the synthetic
    output_len where ``sample_lengths: independent`` (from a stream of the seed's own, so the requests' draws
    stay as they were), cut as the workload's max_model_len cuts outputs; None: each its request's."""
    syn = cfg.synthetic
    if syn is None or syn.sample_lengths != "independent":
        return None
    count = extra_samples(requests)
    rng = np.random.default_rng([seed, 0x5A3])
    out = sample_lengths(syn.output_len, count, rng, role="output", base_dir=Path(base_dir),
                         where="workload.synthetic.output_len")
    if cfg.max_model_len is not None:
        prompt = np.repeat(np.array([r.prompt_len for r in requests], dtype=np.int64),
                           np.array([r.n - 1 for r in requests], dtype=np.int64))
        out = np.maximum(1, np.minimum(out, cfg.max_model_len - prompt))
    return out


def build_workload(cfg: WorkloadConfig, base_dir: Path, seed: int, source: str = "<scenario>") -> Workload:
    """Load or generate the workload; raise KvsimError on bad input (naming file and line)."""
    rng = np.random.default_rng(seed)
    stats = LoadStats()
    info: dict = {}
    if cfg.trace is not None:
        cols, where = _from_trace(cfg, Path(base_dir), source, stats, rng, info)
    elif cfg.synthetic is not None:
        cols, where = generate(cfg.synthetic, rng, Path(base_dir), where=source), source
        stats.rows_read = len(cols)
        info["kind"] = "synthetic"
    else:
        cols, where = _from_inline(cfg.requests or [], source, cfg.hash_block_tokens or MOONCAKE_BLOCK_TOKENS), source
        stats.rows_read = len(cols)
        info["kind"] = "inline"
    cols = reshape.sort_by_arrival(cols, stats, where)
    if cfg.trace is not None:
        cols = reshape.shift_to_zero(cols)
    cols = reshape.limit(cols, cfg.limit)
    cols = reshape.window(cols, cfg.start_s, cfg.duration_s)
    cols = reshape.time_scale(cols, cfg.time_scale)
    cols = reshape.rescale_rate(cols, cfg.rate, source)
    cols = reshape.clip_to_model_len(cols, cfg.max_model_len, stats)
    if len(cols) == 0:
        raise KvsimError(where, "the workload has no requests (after limit and time window)")
    if len(cols) > MAX_REQUESTS:
        raise KvsimError(where, f"{len(cols):,} requests exceed the limit of {MAX_REQUESTS:,} for one run; "
                         "set workload.limit or workload.duration_s")
    if not np.isfinite(cols.arrival).all() or float(cols.arrival.max()) > MAX_TIME_S:
        raise KvsimError(where, f"arrival times beyond {MAX_TIME_S:g} s; check workload.rate and time_scale")
    requests = to_requests(cols)
    out = stats.as_dict()
    out.update(info)
    out["num_requests"] = len(requests)
    out["time_span_s"] = float(cols.arrival[-1] - cols.arrival[0])
    out["mean_rate"] = reshape.mean_rate(cols.arrival)
    return Workload(requests=requests, stats=out)


def _from_trace(cfg: WorkloadConfig, base_dir: Path, source: str, stats: LoadStats,
                rng: np.random.Generator, info: dict) -> tuple[Columns, str]:
    assert cfg.trace is not None and cfg.format is not None
    path = Path(cfg.trace)
    path = path if path.is_absolute() else base_dir / path
    where = str(path)
    if not path.exists():
        raise KvsimError(source, f"workload.trace: no such file {where}")
    # reading stops early only when no row can be dropped and times stay the file's own
    early = cfg.limit if (cfg.arrival is None and cfg.format in ("azure", "mooncake")) else None
    cols = load_trace(path, cfg.format, where, stats, columns=cfg.columns, model_filter=cfg.model_filter,
                      time_unit=cfg.time_unit,
                      max_rows=early)
    cols = drop_empty(cols, stats)
    if len(cols) == 0:
        raise KvsimError(where, "no requests left after skipping rows with zero tokens")
    if cfg.arrival is not None:
        cols.arrival = arrival_times(cfg.arrival, len(cols), rng)
    elif np.isnan(cols.arrival).any():
        raise KvsimError(source, f"workload.arrival: the trace {where} has no arrival times; give an arrival "
                         "process, e.g. arrival: {process: poisson, rate: 2.0}")
    info.update(kind="trace", trace=where, format=cfg.format)
    return cols, where


def drop_empty(cols: Columns, stats: LoadStats) -> Columns:
    """Skip rows with a zero prompt or zero output length (counted in stats)."""
    no_prompt = cols.prompt_len == 0
    no_output = (cols.output_len == 0) & ~no_prompt
    stats.skip("zero prompt tokens", int(no_prompt.sum()))
    stats.skip("zero output tokens", int(no_output.sum()))
    bad = no_prompt | no_output
    return cols.take(~bad) if bad.any() else cols


def _from_inline(items: list[InlineRequest], source: str, hash_block_tokens: int) -> Columns:
    for i, r in enumerate(items):
        if r.hash_ids is not None and r.prefix_group >= 0:
            raise KvsimError(source, f"workload.requests.{i}: give prefix_group/prefix_len or hash_ids, not both")
        if r.prefix_len and r.prefix_len >= r.prompt_len:
            raise KvsimError(source, f"workload.requests.{i}: prefix_len ({r.prefix_len}) must be below "
                             f"prompt_len ({r.prompt_len})")
        if r.prefix_len and r.prefix_group < 0:
            raise KvsimError(source, f"workload.requests.{i}: prefix_len needs a prefix_group >= 0")
    if not items:
        raise KvsimError(source, "workload.requests: the list is empty")

    def col(name: str, dtype: type) -> np.ndarray:
        return np.array([getattr(r, name) for r in items], dtype=dtype)

    return Columns(arrival=col("arrival", np.float64), prompt_len=col("prompt_len", np.int64),
                   output_len=col("output_len", np.int64), priority=col("priority", np.int64),
                   n=col("n", np.int64), prefix_group=col("prefix_group", np.int64),
                   prefix_len=col("prefix_len", np.int64), beam_width=col("beam_width", np.int64),
                   lora=col("lora", np.int64) if any(r.lora >= 0 for r in items) else None,
                   hash_ids=[None if r.hash_ids is None else tuple(r.hash_ids) for r in items]
                   if any(r.hash_ids for r in items) else None,
                   hash_block_tokens=hash_block_tokens)


_POSITIONAL = ("req_id", "arrival_s", "prompt_len", "output_len", "priority", "n", "prefix_group", "prefix_len",
               "hash_ids", "hash_block_tokens")
if tuple(f.name for f in fields(Request))[:len(_POSITIONAL)] != _POSITIONAL:   # (to_requests passes them so)
    raise ImportError(f"sim.request.Request's first fields are not {_POSITIONAL}")


def to_requests(cols: Columns) -> list[Request]:
    """Request objects, req_id = position. Arrays go to Python scalars once, in bulk (fast)."""
    count = len(cols)
    arrival = cols.arrival.tolist()
    prompt = cols.prompt_len.tolist()
    output = cols.output_len.tolist()
    priority = cols.priority.tolist() if cols.priority is not None else [0] * count
    n = cols.n.tolist() if cols.n is not None else [1] * count
    beam = cols.beam_width.tolist() if cols.beam_width is not None else None
    if cols.prefix_group is not None and cols.prefix_len is not None:
        has = cols.prefix_group >= 0
        group = np.where(has, cols.prefix_group, -1).tolist()
        plen = np.where(has, cols.prefix_len, 0).tolist()
    else:
        group, plen = [-1] * count, [0] * count
    hashes = cols.hash_ids if cols.hash_ids is not None else [None] * count
    block = cols.hash_block_tokens
    # positional arguments, in _POSITIONAL's order (keywords cost a third of the time of a million requests)
    out = [Request(i, a, p, o, pr, k, g, pl, h, block)
           for i, a, p, o, pr, k, g, pl, h in zip(range(count), arrival, prompt, output, priority, n, group, plen, hashes)]
    if beam is not None:
        for r, w in zip(out, beam, strict=True):
            r.beam_width = int(w)
    if cols.lora is not None:
        for r, a in zip(out, cols.lora.tolist(), strict=True):
            r.lora_id = a
    return out
