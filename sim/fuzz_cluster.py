"""The cluster fuzzer: random small clusters, run with every invariant checked, then checks across replicas.

    draw_cluster_scenario(rng)  -> dict        a random, valid cluster scenario (tiny caches, few requests):
                                               colocated replicas behind any router (a mixed fleet of 2-3
                                               groups with settings of their own too), or prefill and decode
                                               pools (pull, push or layer-wise push, any link, pools with hardware, a
                                               tensor-parallel degree, a cache and limits of their own), or the
                                               ranks of one data-parallel engine (cluster.data_parallel)
    run_cluster_case(data)      -> CaseResult  run it three ways and check the outcome
    fuzz_clusters(seed, count)  -> FuzzReport  many cases; failures keep the scenario, to replay with ``kvsim run``

Each case runs as drawn (integrity checked after every step), again with decode runs off
(``scheduler.multi_step: false``) and again in the SimPy loop instead of the compiled core
(``sim.engine_core.enabled``): the three must give the same requests and steps, bit for bit.

End-of-run checks (``check_cluster_outcome``), computed from the run's tables:
- every request is FINISHED, or REJECTED or ABORTED (a client timeout) with a reason; finished + rejected +
  aborted = requests, in the summary too;
- per finished request: arrival <= first scheduled <= first token <= finish, and every output token made;
- its timeline's intervals add up to its life, from its arrival to its finish;
- its replicas: colocated, ``prefill_replica`` = ``replica``, one of the pool; disaggregated, a request of
  more than one output token ran its prompt on a prefill replica and finished on a decode replica, after
  a transfer of at least its KV over the link's bandwidth plus its latency (layer-wise: its last layer); one of a single output token
  finished where its prompt ran and sent nothing;
- the bytes sent equal the prompt KV of the requests handed to the decode pool;
- per replica, steps do not overlap, last a positive time and their memory slots add up to the
  replica's capacity; the requests each replica finished equal those the requests table places there;
- without preemptions, swaps, prefix hits or rejections after a prefill, the tokens computed over every
  replica's steps equal, per finished request, prompt + output - 1.
"""

from __future__ import annotations

import copy
import random
import time
import traceback
from collections.abc import Callable
from typing import Any

import pandas as pd

from sim.cluster.config import LINK_PRESETS, ClusterConfig, KVTransferConfig, RouterConfig
from sim.fuzz import (
    HARDWARE,
    CaseResult,
    FuzzReport,
    _combination_problem,
    _has_beams,
    _timeout,
    draw_client,
    draw_scenario,
    draw_workload,
    drawn_cache_tokens,
    drawn_model,
    drop_refused,
    literal_choices,
)

COLOCATED_P = 0.5   # share of colocated cases (the rest: prefill/decode pools)
GROUPS_P = 0.3      # of the colocated cases: a mixed fleet of 2-3 groups (cluster.groups)
DATA_PARALLEL_P = 0.25   # of the colocated cases of one group: the ranks of a data-parallel engine
EPS = 1e-9


def _pool(rng: random.Random, data: dict, role: str) -> dict:
    """One pool: 1-2 prefill or 1-3 decode replicas, sometimes with hardware, a tensor-parallel degree, a cache
    or limits of its own."""
    pool: dict[str, Any] = {"replicas": rng.randint(1, 2 if role == "prefill" else 3)}
    # hardware and a tensor-parallel degree of its own (where the cache is sized from HBM, the weights might
    # not fit them)
    if rng.random() < 0.25 and "num_gpu_blocks" in data["kv_cache"]:
        pool["hardware"] = rng.choice(HARDWARE)
    if rng.random() < 0.2 and "num_gpu_blocks" in data["kv_cache"]:
        model = drawn_model(data)
        pool["tensor_parallel"] = rng.choice([tp for tp in (1, 2, 4) if model.tensor_parallel_problem(tp) is None])
    kv = data["kv_cache"]
    if "num_gpu_blocks" in kv and rng.random() < 0.4:
        pool["kv_cache"] = {"num_gpu_blocks": rng.randint(1, 48)}
    if rng.random() < 0.4:
        sched: dict[str, Any] = {"max_num_seqs": rng.choice([1, 2, 4, 256])}
        if rng.random() < 0.5:
            sched["max_num_batched_tokens"] = rng.choice([8, 64, 2048])
        pool["scheduler"] = sched
    return pool


def draw_cluster_scenario(rng: random.Random, index: int = 0) -> dict:
    """One random cluster scenario (as the dict a YAML file would hold), always one the schema accepts."""
    data = drop_refused(draw_scenario(rng, index))
    data["name"] = f"fuzz-cluster-{index}"
    router: dict[str, Any] = {"policy": rng.choice(literal_choices(RouterConfig, "policy"))}
    if rng.random() < 0.2:
        router["overhead_s"] = rng.choice([0.0001, 0.01])
    if router["policy"] == "prefix_affinity" and rng.random() < 0.5:
        router["load_slack"] = rng.choice([0, 1, 8])
    if rng.random() < COLOCATED_P:
        if rng.random() < GROUPS_P:   # each group as a pool may differ (hardware, TP, cache, limits)
            groups = [_pool(rng, data, "prefill") for _ in range(rng.randint(2, 3))]
            data["cluster"] = {"groups": groups, "router": router}
            return data
        data["cluster"] = {"replicas": rng.randint(1, 4), "router": router}
        return _data_parallel(index, data)
    # prefill/decode pools: paged blocks, continuous batching, one sequence a request, every token of a
    # sliding-window model kept (pools move whole tables)
    data["kv_cache"]["allocator"] = "paged"
    data["scheduler"]["batching"] = "continuous"
    data.pop("lora", None)   # (LoRA with pools is not modelled)
    if "tiny-gemma" in str(data["model"]):
        data["kv_cache"]["hybrid_manager"] = False
    data = drop_refused(data)
    data["workload"] = draw_workload(rng, drawn_cache_tokens(data), multi_seq=False)
    draw_client(rng, data["workload"])
    _timeout(random.Random(f"pools-timeout:{index}"), data)   # (a stream of its own: the other draws stay)
    if rng.random() < 0.5:
        link: Any = rng.choice(list(LINK_PRESETS))
    else:
        link = {"bandwidth_gb_s": rng.choice([0.1, 1.0, 100.0]), "latency_s": rng.choice([0.0, 1e-5, 0.05])}
    mode = rng.choice(literal_choices(KVTransferConfig, "mode"))
    transfer = {"link": link, "mode": mode, **({"layerwise": True} if mode == "push" and rng.random() < 0.5 else {})}
    data["cluster"] = {"prefill": _pool(rng, data, "prefill"), "decode": _pool(rng, data, "decode"),
                       "kv_transfer": transfer, "router": router}
    return _data_parallel_pools(index, data)


def _data_parallel(index: int, data: dict) -> dict:
    """Sometimes (``DATA_PARALLEL_P``, a stream of its own: the other draws stay) the replicas as the 2 or 4
    ranks of one data-parallel engine of tiny-deepseek (sim/cluster/data_parallel.py), or 4 as two engines of
    2 (``data_parallel_size``): ranks of 1 or 2 GPUs, experts split or placed whole, a cache of its own size,
    what the group refuses dropped."""
    rng = random.Random(f"data-parallel:{index}")
    if rng.random() >= DATA_PARALLEL_P:
        return data
    from sim.specs import HardwareSpec

    original = copy.deepcopy(data)
    hw = data["hardware"] if isinstance(data["hardware"], dict) else HardwareSpec.from_name(data["hardware"]).model_dump()
    data["hardware"] = {**hw, "tensor_parallel": rng.choice([1, 2]), "pipeline_parallel": 1,
                        "expert_parallel": rng.random() < 0.5}
    data["cluster"].update(replicas=rng.choice([2, 4]), data_parallel=True)
    if data["cluster"]["replicas"] == 4 and rng.random() < 0.5:
        data["cluster"]["data_parallel_size"] = 2
    return _tiny_moe(data, original)


def _data_parallel_pools(index: int, data: dict) -> dict:
    """Sometimes (``DATA_PARALLEL_P``, a stream of its own) the prefill pool, the decode pool or both as the 2 or
    4 ranks of a data-parallel engine of tiny-deepseek (4 sometimes as two engines of 2), ranks of 1 or 2 GPUs
    on the scenario's hardware, a cache of its own size, what the group refuses dropped."""
    rng = random.Random(f"data-parallel-pools:{index}")
    if rng.random() >= DATA_PARALLEL_P:
        return data
    original = copy.deepcopy(data)
    for role in ("prefill", "decode"):
        if rng.random() < 0.6:
            pool = data["cluster"][role]
            pool.pop("hardware", None)
            pool.update(replicas=rng.choice([2, 4]), tensor_parallel=rng.choice([1, 2]), data_parallel=True)
            if pool["replicas"] == 4 and rng.random() < 0.5:   # (two engines of two ranks)
                pool["data_parallel_size"] = 2
    return _tiny_moe(data, original)


def _tiny_moe(data: dict, original: dict) -> dict:
    """A case made data-parallel, served by tiny-deepseek with a cache of its own size (sized from the drawn
    cache's tokens), without what a data-parallel group refuses (LoRA, drafts), the rest as ``_refused_dropped``
    leaves it."""
    data["model"] = "tiny-deepseek"
    kv = data["kv_cache"]
    kv.pop("gpu_memory_utilization", None)
    kv.pop("activation_reserve_gb", None)
    kv["num_gpu_blocks"] = max(8, drawn_cache_tokens(data) // kv.get("block_size", 16))
    for section in ("lora", "speculative"):
        data.pop(section, None)
    return _refused_dropped(data, original)


def _refused_dropped(data: dict, original: dict) -> dict:
    """``data`` (a case made data-parallel) with each setting the schema refuses dropped back to its default,
    as ``drop_refused`` does; ``original`` (the case as drawn) where what is refused is the model or the cluster
    itself (the conversion does not hold: dropping either would undo it, or leave a refusal no key removes)."""
    problem = _combination_problem(data)
    while problem is not None:
        section, _, key = problem[0].partition(".")
        if section in ("model", "cluster"):
            return original
        if section == "speculative" or not key:
            dropped = data.pop(section, None) is not None
        else:
            dropped = isinstance(data.get(section), dict) and data[section].pop(key, None) is not None
        if not dropped:   # (a refusal no key of the case removes)
            return original
        problem = _combination_problem(data)
    return data


# ---------------------------------------------------------------- checking


def check_cluster_outcome(result, scn, beams: bool = False) -> list[str]:
    """Conservation checks on a finished cluster run's tables; returns the problems found (empty: all good).
    ``beams``: some request searches beams (its token count depends on the draws: that check is skipped)."""
    bad: list[str] = []
    reqs: pd.DataFrame = result.requests
    steps: pd.DataFrame = result.steps
    summary: dict = result.summary
    status = reqs["status"]
    ended = ["FINISHED", "REJECTED", "ABORTED"]
    if not status.isin(ended).all():
        bad.append(f"requests neither finished, rejected nor aborted: {reqs.loc[~status.isin(ended), 'req_id'].tolist()[:10]}")
    rej = reqs[status.isin(["REJECTED", "ABORTED"])]
    if (rej["reject_reason"].fillna("") == "").any():
        bad.append("a request rejected or aborted without a reason")
    aborted = summary.get("num_aborted", 0)
    if summary["num_finished"] + summary["num_rejected"] + aborted != len(reqs):
        bad.append("num_finished + num_rejected + num_aborted != num_requests")
    if summary["num_finished"] != int((status == "FINISHED").sum()):
        bad.append("the summary's num_finished differs from the requests table")
    done = reqs[status == "FINISHED"]
    for a, b in (("arrival_s", "first_scheduled_s"), ("first_scheduled_s", "first_token_s"), ("first_token_s", "finish_s")):
        wrong = done[~(done[b] >= done[a] - EPS)]
        if len(wrong):
            bad.append(f"{b} < {a} (or missing) for requests {wrong['req_id'].tolist()[:10]}")
    if "generated_tokens" in done.columns and not (done["generated_tokens"] == done["output_tokens"]).all():
        bad.append("generated tokens differ from the output length")
    bad += _check_placement(reqs, done, scn, summary)
    bad += _check_timeline(result.timeline, done)
    spec = summary.get("speculative", {})   # (drafts rejected were computed and thrown away)
    rejected = spec.get("draft_tokens", 0) - spec.get("accepted_tokens", 0)
    bad += _check_steps(steps, result.replicas, done, reqs, beams, rejected)
    cl = scn.cluster
    if cl.data_parallel and len(steps):
        bad += _check_lockstep(steps, 0, cl.num_replicas, cl.ranks_per_engine)
    if cl.disaggregated and len(steps):
        for pool, first in ((cl.prefill, 0), (cl.decode, cl.prefill.replicas)):
            if pool.data_parallel:
                bad += _check_lockstep(steps, first, pool.replicas, pool.ranks_per_engine)
    return bad


def _check_lockstep(steps: pd.DataFrame, first: int, count: int, ranks: int) -> list[str]:
    """Data-parallel engines of ``ranks`` ranks each on replicas ``first`` .. ``first + count - 1`` (numbered
    engine after engine): within an engine, the rows that start together last the same, and its group steps do
    not overlap."""
    bad = []
    mine = steps[steps["replica"].between(first, first + count - 1)]
    for engine, rows in mine.groupby((mine["replica"] - first) // ranks):
        group = rows.groupby("start_s")["duration_s"]
        if (group.nunique() != 1).any():
            bad.append(f"engine {engine}: ranks' steps that start together last differently")
        steps_of = group.first().sort_index()   # (each group step's start and duration)
        if (steps_of.index.to_numpy()[1:] < (steps_of.index + steps_of).to_numpy()[:-1] - EPS).any():
            bad.append(f"engine {engine}: group steps overlap")
    return bad


def _check_timeline(timeline: pd.DataFrame | None, done: pd.DataFrame) -> list[str]:
    """Each finished request's timeline covers its life: its intervals follow one another from its arrival
    (as planned: a client may hold it back until its send, ``client_wait_s``) to its finish (the client's
    wait, frontend, queues, prefill, a transfer's wait and the link, decode, preemptions; static batching's
    ``idle``, a finished request holding its memory until its batch ends, comes after it)."""
    if timeline is None or not len(done):
        return []
    tl = timeline[timeline["req_id"].isin(done["req_id"]) & (timeline["phase"] != "idle")]
    span = (tl["end_s"] - tl["start_s"]).groupby(tl["req_id"]).sum().reindex(done["req_id"]).fillna(0.0)
    life = (done["finish_s"] - done["arrival_s"]).to_numpy()
    if "client_wait_s" in done.columns:
        life = life + done["client_wait_s"].to_numpy()
    off = abs(span.to_numpy() - life) > 1e-9 * (1 + life)
    if off.any():
        return [f"the timeline of requests {done['req_id'][off].tolist()[:10]} does not add up to their lives"]
    return []


def _check_placement(reqs: pd.DataFrame, done: pd.DataFrame, scn, summary: dict) -> list[str]:
    """Where each finished request ran, its transfer, and the bytes sent."""
    bad: list[str] = []
    cfg: ClusterConfig = scn.cluster
    if cfg.num_replicas == 1:
        return bad   # the single engine's tables (no replica columns)
    if not cfg.disaggregated:
        if not (done["prefill_replica"] == done["replica"]).all():
            bad.append("a colocated request's prefill replica differs from its replica")
        if not done["replica"].between(0, cfg.num_replicas - 1).all():
            bad.append("a request on a replica outside the pool")
        return bad
    n_p = cfg.prefill.replicas
    many = done[done["output_tokens"] > 1]
    one = done[done["output_tokens"] == 1]
    if not (many["prefill_replica"].between(0, n_p - 1).all() and many["replica"].between(n_p, cfg.num_replicas - 1).all()):
        bad.append("a request of several output tokens did not go from a prefill replica to a decode replica")
    if not ((one["replica"] == one["prefill_replica"]).all() and one["transfer_s"].isna().all()):
        bad.append("a request of one output token left its prefill replica or sent its KV")
    waits = many["kv_wait_s"]
    if not (waits >= 0).all() or (cfg.link.mode == "push" and not (waits == 0).all()):
        bad.append("a KV wait below zero, or one where the KV is pushed")
    bw, lat = cfg.link.bandwidth_latency()
    per_token = scn.model_spec.kv_bytes_per_token()
    # layer-wise, at least the last layer leaves after the prefill (fewer bytes for a preempted prefill: all)
    least = many["prompt_tokens"] * per_token / bw / (scn.model_spec.num_layers if cfg.link.layerwise else 1) + lat
    if not (many["transfer_s"] >= least * (1 - 1e-9) - EPS).all():
        bad.append("a transfer faster than the link's bandwidth and latency allow")
    sent = reqs[reqs["transfer_s"].notna()]
    expect = int(sent["prompt_tokens"].sum()) * per_token
    got = summary["cluster"]["transferred_kv_bytes"]
    if got != expect:
        bad.append(f"bytes sent {got} != the prompt KV of the requests handed over {expect}")
    return bad


def _check_steps(steps: pd.DataFrame, replicas: pd.DataFrame | None, done: pd.DataFrame, reqs: pd.DataFrame,
                 beams: bool, rejected_drafts: int = 0) -> list[str]:
    """Each replica's steps: in time order, positive, memory slots adding up to one capacity; replicas.csv:
    every request ends on one replica, the prompts handed off are the transfers; tokens computed (with the
    ``rejected_drafts`` of speculative decoding)."""
    bad: list[str] = []
    if not len(steps):
        return ["requests finished without any step"] if len(done) else []
    by = steps.groupby("replica") if "replica" in steps.columns else [(0, steps)]
    slots_cols = ["slots_token_states", "slots_reserved", "slots_internal_frag", "slots_external_frag", "slots_free"]
    for rid, rows in by:
        start, end = rows["start_s"].to_numpy(), rows["end_s"].to_numpy()
        if (rows["duration_s"] <= 0).any():
            bad.append(f"replica {rid}: a step with a non-positive duration")
        if (start[1:] < end[:-1] - EPS).any():
            bad.append(f"replica {rid}: steps overlap or go back in time")
        slots = rows[slots_cols].sum(axis=1)
        if slots.nunique() != 1:
            bad.append(f"replica {rid}: memory slots do not add up to one capacity in every step")
    if replicas is not None:
        ends = int(replicas["finished"].sum() + replicas["rejected"].sum()
                   + (replicas["aborted"].sum() if "aborted" in replicas else 0))
        if ends != len(reqs):
            bad.append(f"replicas.csv: finished + rejected + aborted over the replicas {ends} != {len(reqs)} requests")
        mine = replicas["finished"] + replicas["rejected"] + (replicas["aborted"] if "aborted" in replicas else 0)
        if (mine > replicas["requests"]).any():
            bad.append("replicas.csv: a replica ended more requests than it was given")
        handed = int(replicas["handed_off"].sum())
        sent = int(reqs["transfer_s"].notna().sum()) if "prefill" in set(replicas["role"]) else 0
        if handed != sent:
            bad.append(f"replicas.csv: {handed} prompts handed off, {sent} KV transfers")
    plain = (not beams and int(reqs["num_preemptions"].sum()) == 0 and (reqs["num_cached_tokens"] == 0).all()
             and not (reqs["status"].eq("REJECTED") & reqs["first_token_s"].notna()).any()
             and not reqs["status"].eq("ABORTED").any())
    if plain:   # the prompt once, then each of the n sequences computes every output token but the last
        computed = int(steps["num_prefill_tokens"].sum() + steps["num_decode_tokens"].sum()) - rejected_drafts
        expect = int((done["prompt_tokens"] + done["n"] * (done["output_tokens"] - 1)).sum())
        if computed != expect:
            bad.append(f"tokens computed over every replica's steps {computed} != sum of prompt + n x (output - 1) "
                       f"= {expect}")
    return bad


# ---------------------------------------------------------------- running


def _same(a, b, what: str) -> list[str]:
    bad = []
    for name, x, y in (("requests", a.requests, b.requests), ("steps", a.steps, b.steps)):
        if not x.equals(y):
            bad.append(f"{what}: the {name} table differs")
    return bad


def run_cluster_case(data: dict, index: int = 0) -> CaseResult:
    """Validate and run one cluster scenario dict (integrity checks on) as drawn, with decode runs off and in
    the SimPy loop (colocated and prefill/decode pools alike: either may have run in the compiled core);
    check the outcome and that the three agree."""
    import sim.engine_core as engine_core
    from sim.errors import KvsimError
    from sim.runner import run_scenario
    from sim.scenario import scenario_from_dict

    t0 = time.perf_counter()
    try:
        scn = scenario_from_dict(data, source=f"<fuzz cluster {index}>")
        result = run_scenario(scn, check_integrity=True)
        single = dict(data, scheduler={**data.get("scheduler", {}), "multi_step": False})
        problems = _same(result, run_scenario(scenario_from_dict(single), check_integrity=True), "without decode runs")
        before, engine_core.enabled = engine_core.enabled, False
        try:
            problems += _same(result, run_scenario(scn, check_integrity=True), "in the SimPy loop")
        finally:
            engine_core.enabled = before
    except KvsimError as e:
        return CaseResult(index, data, "failed", f"KvsimError: {e}", time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - the fuzzer reports every crash with its scenario
        return CaseResult(index, data, "failed", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}",
                          time.perf_counter() - t0)
    problems += check_cluster_outcome(result, scn, beams=_has_beams(data))
    return CaseResult(index, data, "failed" if problems else "ok", "; ".join(problems), time.perf_counter() - t0,
                      int(result.summary["num_steps"]))


def fuzz_clusters(seed: int, count: int, on_case: Callable[[CaseResult], None] | None = None,
                  start: int = 0) -> FuzzReport:
    """Run ``count`` random cluster scenarios drawn from ``seed`` (case i is reproducible from (seed, i))."""
    report = FuzzReport()
    for i in range(start, start + count):
        case = run_cluster_case(draw_cluster_scenario(random.Random(f"cluster:{seed}:{i}"), i), i)
        report.cases.append(case)
        if on_case is not None:
            on_case(case)
    return report
