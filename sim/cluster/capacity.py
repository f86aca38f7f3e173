"""Capacity planning: the fewest replicas (or, for a fixed fleet, the highest request rate or client
concurrency) meeting every SLO.

An SLO is ``METRIC_STAT=VALUE``: METRIC one of ttft, tpot, itl, e2e (seconds), STAT one of mean, p50, p90,
p99; it holds when the summary's ``METRIC_s.STAT`` is at most VALUE (a missing figure, NaN, fails).

Search (each candidate an independent run of the scenario with ``cluster.replicas``, ``workload.rate`` or
``workload.max_concurrency`` set; ``workers`` candidates at a time, in processes or on Ray):

    replicas:  grow 1, 2, 4, ... (up to --max) until one meets the SLOs, then bisect between the last
               failure and the first success: the answer N meets, N - 1 was run and fails.
               Prefill/decode pools: a total of N replicas meets when some split p + (N - p) does; every
               split of a candidate total is run, and the answer carries the best split (lowest worst
               SLO ratio). A mixed fleet (``cluster.groups``, ``--group I``): group I's replicas grow, the
               other groups as they are.
    rate:      from the workload's own mean rate, double (or halve) until the SLOs fail (or hold), then
               bisect to 1% of the rate: the answer R meets, and a rate 1% above it failed.
    concurrency: the client's ``workload.max_concurrency`` (sim/clients.py) grows 1, 2, 4, ... (up to
               --max) until the SLOs fail, then bisects: the answer C meets, C + 1 was run and fails.

Assumes the SLO figures get no worse with more replicas and no better with more load or concurrency (monotone);
``candidates`` lists every run so a violation can be seen.

Seeds (``seeds`` > 1, ``kvsim capacity --seeds N``): each candidate runs with the scenario's seed and the
N - 1 after it (other draws of a synthetic workload's arrivals and lengths, of a random router's choices)
and meets only if every seed's run meets; its figures are the worst seed's (``across_seeds``), its
``seeds`` each seed's. An answer then holds for N draws of the traffic, not for one draw's luck near a
percentile's bound.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.errors import KvsimError
from sim.scenario import apply_override
from sim.worker_pool import require_ray

METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2e": "e2e_s"}
STATS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class SLO:
    metric: str     # summary key, e.g. ttft_s
    stat: str       # mean | p50 | p90 | p99
    value: float

    @property
    def name(self) -> str:
        return f"{self.metric.removesuffix('_s')}_{self.stat}"


def parse_slo(text: str) -> SLO:
    """``ttft_p90=2`` -> SLO("ttft_s", "p90", 2.0)."""
    key, sep, raw = text.partition("=")
    metric, _, stat = key.strip().rpartition("_")
    if not sep or metric not in METRICS or stat not in STATS:
        raise KvsimError("--slo", f"expected METRIC_STAT=SECONDS with METRIC in {', '.join(METRICS)} and STAT in "
                         f"{', '.join(STATS)} (e.g. ttft_p90=2), got {text!r}")
    try:
        value = float(raw)
    except ValueError:
        raise KvsimError("--slo", f"{key}: {raw!r} is not a number of seconds") from None
    if not value > 0:
        raise KvsimError("--slo", f"{key}: the bound must be positive, got {raw}")
    return SLO(METRICS[metric], stat, value)


def slo_figures(summary: dict, slos: list[SLO]) -> dict[str, float]:
    out = {}
    for s in slos:
        v = summary.get(s.metric, {}).get(s.stat)
        out[s.name] = math.nan if v is None else float(v)
    return out


def meets(figures: dict[str, float], slos: list[SLO]) -> bool:
    return all(figures[s.name] <= s.value for s in slos)   # NaN compares False: fails


def evaluate(data: dict, base_dir: str, source: str, slos: list[SLO]) -> dict[str, Any]:
    """Run one candidate (in a worker): its SLO figures, whether it meets them, a few summary figures,
    each SLO's attainment and the goodput (sim/goodput.py)."""
    from sim.goodput import slo_report
    from sim.runner import run_scenario
    from sim.scenario import scenario_from_dict

    scn = scenario_from_dict(data, base_dir=base_dir, source=source)
    res = run_scenario(scn, keep_steps=False)   # (the SLOs read the requests and the summary)
    report = slo_report(res.requests, res.summary, slos)
    return {**report, "num_finished": res.summary["num_finished"],
            "output_throughput_tok_s": res.summary["output_throughput_tok_s"],
            "worst_ratio": max((report[s.name] / s.value if report[s.name] == report[s.name] else math.inf)
                               for s in slos)}


Runner = Callable[[list[dict]], list[dict[str, Any]]]

# a candidate's figures that are better when higher: across seeds the lowest is the worst
_HIGHER_IS_BETTER = ("goodput_req_s", "num_finished", "output_throughput_tok_s")


def seed_list(data: dict, seeds: int) -> list[int]:
    """The seeds a candidate runs with: the scenario's own (``seed``, 0 by default) and the ``seeds`` - 1 after it."""
    base = int(data.get("seed") or 0)
    return list(range(base, base + seeds))


def across_seeds(rows: list[dict[str, Any]], seeds: list[int], slos: list[SLO]) -> dict[str, Any]:
    """One candidate's runs under ``seeds`` (``rows[i]`` ran with ``seeds[i]``) as one row: it meets only if
    every run meets; each figure is the worst run's (an SLO's figure and ``worst_ratio`` the highest, a NaN
    figure failing; the attainments, goodput, finished requests and throughput the lowest); ``seeds_met``
    counts the runs that meet and ``seeds`` holds each run's row with its seed."""
    out: dict[str, Any] = {}
    for s in slos:
        values = [r[s.name] for r in rows]
        out[s.name] = math.nan if any(v != v for v in values) else max(values)
    out["meets"] = all(r["meets"] for r in rows)
    for key in rows[0]:
        if key.startswith("attain_") or key in _HIGHER_IS_BETTER:
            values = [r[key] for r in rows]
            out[key] = math.nan if any(v != v for v in values) else min(values)
    out["worst_ratio"] = max(r["worst_ratio"] for r in rows)
    out["seeds_met"] = sum(bool(r["meets"]) for r in rows)
    out["seeds"] = [{"seed": seed, **r} for seed, r in zip(seeds, rows)]
    return out


def seeds_agree(answer: dict[str, Any], slos: list[SLO]) -> bool:
    """Whether every candidate's seeds gave the same SLO figures (nothing in the scenario is drawn at random:
    a trace replayed as recorded, a router that draws nothing), so that more seeds only cost time."""
    rows = [c for cand in answer["candidates"] for c in cand.get("splits", [cand])]
    return all(len({repr(run[s.name]) for run in row["seeds"]}) == 1 for row in rows if "seeds" in row for s in slos)


class CandidateRunner:
    """Evaluates scenario dicts in order: inline, in a process pool, or on Ray (as ``kvsim sweep`` does).

    The pool is started at the first batch of candidates and kept for the whole search (``close``, or
    ``with``): its workers keep what a run leaves in a process (the parsed calibration, the memoised
    prices: sim/executors/document_cache.py, price_memo.py) from one round of the bisection to the next,
    instead of a fresh pool each round starting from nothing.

    ``seeds`` > 1: each candidate runs under that many seeds (``seed_list``; all of a round's runs side by side)
    and comes back as one row (``across_seeds``)."""

    def __init__(self, base_dir: str, source: str, slos: list[SLO], workers: int = 1, use_ray: bool = False,
                 ray_address: str | None = None, seeds: int = 1) -> None:
        self.base_dir, self.source, self.slos = base_dir, source, slos
        self.workers, self.use_ray, self.ray_address = workers, use_ray, ray_address
        self.seeds = seeds
        self._pool = None

    def __call__(self, datas: list[dict]) -> list[dict[str, Any]]:
        if self.seeds <= 1:
            return self._evaluate(datas)
        lists = [seed_list(d, self.seeds) for d in datas]
        runs = self._evaluate([_with(d, seed=seed) for d, seeds in zip(datas, lists) for seed in seeds])
        n = self.seeds
        return [across_seeds(runs[i * n:(i + 1) * n], seeds, self.slos) for i, seeds in enumerate(lists)]

    def _evaluate(self, datas: list[dict]) -> list[dict[str, Any]]:
        base_dir, source, slos = self.base_dir, self.source, self.slos
        if self.use_ray:
            require_ray()
            import ray

            if not ray.is_initialized():
                ray.init(address=self.ray_address or None)
            remote = ray.remote(evaluate)
            return ray.get([remote.remote(d, base_dir, source, slos) for d in datas])
        if self.workers <= 1 or len(datas) == 1:
            return [evaluate(d, base_dir, source, slos) for d in datas]
        from sim.worker_pool import new_pool, stop_pool

        if self._pool is None:
            self._pool = new_pool(self.workers)
        try:
            return list(self._pool.map(evaluate, datas, [base_dir] * len(datas), [source] * len(datas),
                                       [slos] * len(datas)))
        except BaseException:   # (an error, Ctrl-C, SIGTERM: the workers stop now, not after their runs)
            stop_pool(self._pool)
            self._pool = None
            raise

    def close(self) -> None:
        """Let the pool's workers finish and go (a later call starts a new pool)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> CandidateRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parallel_runner(base_dir: str, source: str, slos: list[SLO], workers: int = 1, use_ray: bool = False,
                    ray_address: str | None = None, seeds: int = 1) -> CandidateRunner:
    """A ``CandidateRunner`` (close it, or use it in ``with``, when the search is done)."""
    return CandidateRunner(base_dir, source, slos, workers, use_ray, ray_address, seeds)


def _with(data: dict, **keys: Any) -> dict:
    out = copy.deepcopy(data)
    for path, value in keys.items():
        apply_override(out, path.split("__"), value)
    return out


def _spread(lo: float, hi: float, k: int, integer: bool) -> list[float]:
    """k points strictly between lo and hi, evenly spaced (integers: distinct, possibly fewer)."""
    pts = [lo + (hi - lo) * (i + 1) / (k + 1) for i in range(k)]
    if integer:
        return sorted({int(round(p)) for p in pts if lo < round(p) < hi}) or [int(lo + (hi - lo) // 2)]
    return pts


def out_of_order(answer: dict[str, Any], key: str, more_is_harder: bool) -> list[float]:
    """The candidates tried on the far side of ``answer[key]`` whose outcome contradicts it: a larger fleet
    that fails (``more_is_harder`` False: replicas), or a higher rate or concurrency that meets. The searches
    bisect assuming that meeting the SLOs is monotone in ``key``; near an SLO's bound a percentile can step
    back and forth (a random router, a few hundred requests), and then a smaller answer may exist that
    bisection did not visit."""
    x = answer[key]
    return [c[key] for c in answer["candidates"]
            if c[key] > x and (c["meets"] if more_is_harder else not c["meets"])]


def search_replicas(data: dict, run: Runner, max_replicas: int, workers: int, group: int | None = None,
                    per_engine: int = 1) -> dict[str, Any]:
    """The fewest replicas meeting the SLOs; every candidate's figures in ``candidates``. ``group``: of that
    group of a mixed fleet (``cluster.groups``), the others as they are (the answer names it). ``per_engine``:
    the replicas are ranks of data-parallel engines of that many (``cluster.data_parallel_size``): whole
    engines are added, each candidate and the answer naming its ``engines`` too."""
    disagg = "prefill" in (data.get("cluster") or {})
    seen: dict[int, dict[str, Any]] = {}   # by the candidate's count of engines (of replicas: per_engine 1)
    key = "cluster__replicas" if group is None else f"cluster__groups__{group}__replicas"
    if max_replicas < per_engine:
        raise KvsimError("--max", f"{max_replicas} replicas hold no whole data-parallel engine of {per_engine} ranks")
    max_units = max_replicas // per_engine

    def try_totals(totals: list[int]) -> None:
        todo = [n for n in totals if n not in seen]
        if not todo:
            return
        if not disagg:
            rows = run([_with(data, **{key: n * per_engine}) for n in todo])
            for n, row in zip(todo, rows):
                seen[n] = {"replicas": n * per_engine, **({"engines": n} if per_engine > 1 else {}), **row}
            return
        jobs = [(n, p) for n in todo for p in range(1, n)]
        rows = run([_with(data, cluster__prefill__replicas=p, cluster__decode__replicas=n - p) for n, p in jobs])
        for n in todo:
            splits = [{"replicas": n, "prefill": p, "decode": n - p, **r} for (m, p), r in zip(jobs, rows) if m == n]
            best = min(splits, key=lambda r: (not r["meets"], r["worst_ratio"], r["prefill"]))
            seen[n] = {**best, "splits": splits}

    lo, hi = (1 if disagg else 0), None   # lo: largest known failure (a P/D cluster needs 2)
    n = lo + 1
    while hi is None:                    # grow geometrically, `workers` candidates a round
        batch = []
        while len(batch) < max(1, workers) and n <= max_units:
            batch.append(n)
            n = n * 2 if n > 1 else 2
        if not batch:
            break
        if batch[-1] < max_units and n > max_units and len(batch) < max(1, workers):
            batch.append(max_units)
        try_totals(batch)
        for m in sorted(batch):
            if seen[m]["meets"]:
                hi = m
                break
            lo = max(lo, m)
    if hi is None:
        if max_units not in seen:
            try_totals([max_units])
            if seen[max_units]["meets"]:
                hi = max_units
        if hi is None:
            engines = f" ({max_units} engine{'s' if max_units != 1 else ''})" if per_engine > 1 else ""
            fleet = f"{max_units * per_engine} replicas{engines}"
            raise KvsimError("capacity", f"no fleet of up to {fleet} meets the SLOs (raise --max, or relax the SLOs)")
    while hi - lo > 1:                    # bisect: every known failure below every known success
        try_totals(_spread(lo, hi, max(1, workers), integer=True))
        for m in sorted(k for k in seen if lo < k < hi):
            if seen[m]["meets"]:
                hi = m
                break
            lo = m
    answer: dict[str, Any] = {"replicas": hi * per_engine}
    if per_engine > 1:
        answer["engines"] = hi
    if group is not None:
        answer["group"] = group
    if disagg:
        answer.update(prefill=seen[hi]["prefill"], decode=seen[hi]["decode"])
    answer["candidates"] = [seen[k] for k in sorted(seen)]
    answer["out_of_order"] = out_of_order(answer, "replicas", more_is_harder=False)
    return answer


def search_rate(data: dict, run: Runner, base_rate: float, workers: int, tolerance: float = 0.01,
                max_rounds: int = 30) -> dict[str, Any]:
    """The highest ``workload.rate`` meeting the SLOs (within ``tolerance``, relative)."""
    seen: dict[float, dict[str, Any]] = {}

    def try_rates(rates: list[float]) -> None:
        todo = [r for r in rates if r not in seen]
        for r, row in zip(todo, run([_with(data, workload__rate=r) for r in todo])):
            seen[r] = {"rate": r, **row}

    w = max(1, workers)

    def bracket() -> tuple[float, float]:   # smallest failing rate; largest meeting rate below it
        bad = min((r for r in seen if not seen[r]["meets"]), default=math.inf)
        return max((r for r in seen if seen[r]["meets"] and r < bad), default=0.0), bad

    rates = [base_rate * 2.0 ** (i - w // 2) for i in range(w)]
    for _ in range(max_rounds):           # bracket: double up or halve down, w candidates a round
        try_rates(rates)
        good, bad = bracket()
        if good > 0 and bad < math.inf:
            break
        if good == 0:
            rates = [min(seen) / 2.0 ** (i + 1) for i in range(w)]
        else:
            rates = [max(seen) * 2.0 ** (i + 1) for i in range(w)]
    if good == 0:
        raise KvsimError("capacity", f"the SLOs fail even at {min(seen):.4g} requests/s")
    if bad == math.inf:
        raise KvsimError("capacity", f"the SLOs still hold at {max(seen):.4g} requests/s (no bound found)")
    for _ in range(max_rounds):
        if bad - good <= tolerance * good:
            break
        try_rates(_spread(good, bad, w, integer=False))
        good, bad = bracket()
    answer = {"rate": good, "candidates": [seen[k] for k in sorted(seen)]}
    answer["out_of_order"] = out_of_order(answer, "rate", more_is_harder=True)
    return answer


def search_concurrency(data: dict, run: Runner, max_concurrency: int, workers: int) -> dict[str, Any]:
    """The highest ``workload.max_concurrency`` (at most ``max_concurrency``) meeting the SLOs."""
    seen: dict[int, dict[str, Any]] = {}

    def try_levels(levels: list[int]) -> None:
        todo = [c for c in levels if c not in seen]
        for c, row in zip(todo, run([_with(data, workload__max_concurrency=c) for c in todo])):
            seen[c] = {"concurrency": c, **row}

    good, bad = 0, max_concurrency + 1   # largest known success; smallest known failure
    c = 1
    while bad > max_concurrency and c <= max_concurrency:   # grow geometrically, `workers` candidates a round
        batch = []
        while len(batch) < max(1, workers) and c <= max_concurrency:
            batch.append(c)
            c *= 2
        if c > max_concurrency and batch[-1] < max_concurrency and len(batch) < max(1, workers):
            batch.append(max_concurrency)
        try_levels(batch)
        for m in sorted(batch):
            if not seen[m]["meets"]:
                bad = m
                break
            good = m
    if good == 0:
        raise KvsimError("capacity", "the SLOs fail even with one request in flight")
    if bad > max_concurrency and max_concurrency not in seen:
        try_levels([max_concurrency])
        if seen[max_concurrency]["meets"]:
            good = max_concurrency
        else:
            bad = max_concurrency
    while bad - good > 1 and bad <= max_concurrency:   # bisect: every known success below every failure
        try_levels(_spread(good, bad, max(1, workers), integer=True))
        for m in sorted(k for k in seen if good < k < bad):
            if not seen[m]["meets"]:
                bad = m
                break
            good = m
    answer = {"concurrency": good, "candidates": [seen[k] for k in sorted(seen)]}
    answer["out_of_order"] = out_of_order(answer, "concurrency", more_is_harder=True)
    return answer
