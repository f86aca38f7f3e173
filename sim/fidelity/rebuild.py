"""A measured run rebuilt as a kvsim scenario: the server's settings and the client's load.

The load, as the client (inference-perf) generated it (docs/fidelity.md):

    stage s:   load ``concurrent``: N = num_requests, all ready at start_s, sent by concurrency_level workers
               (a client limit for the stage: sim/clients.py), each sending its next request when its last
               is answered; the stage lasts until they are all answered
               otherwise N = rate x duration requests; gaps g_1..g_N ~ Exp(1), scaled so that they fill the stage:
               arrival_i = start_s + duration x (g_1 + ... + g_i) / (g_1 + ... + g_N)
               (a Poisson process conditioned on its count: load ``constant``); load ``poisson``: each
               whole second from start_s draws n ~ Poisson(rate) requests and spreads them over that
               second the same way (the last on the second), until N have been drawn
    stages:    the client starts a stage once every request of the previous one has finished, plus
               ``STAGE_GAP_S`` (its stage interval and the second its timer starts ahead); the first
               stage starts at 0. The start of stage s + 1 depends on when stage s's last request
               finishes in the replay: ``evaluate`` replays the stages before it to find it
    prompts:   P = num_groups x num_prompts_per_group fixed prompts, each its group's system prompt then
               a question of its own (the groups drawn at random over the prompts, as the client shuffles
               them); request i sends prompt i mod P. A prompt's content is given by one id per
               ``CONTENT_TOKENS`` tokens (inline ``hash_ids``): its group's ids over the blocks that lie
               wholly inside the system prompt (``system_tokens``), its own after; so identical prompts
               share every full block, and a group's prompts their system prompt's blocks, in the
               prefix cache
    lengths:   the P prompt lengths follow the measured server-side quantiles: the piecewise-linear
               quantile function through (0.1, p10), (0.5, median), (0.9, p90), (0.99, p99), extended
               linearly to 0 and 1, taken at (k + 0.5) / P, rounded, then nudged one token at a time
               (nearest the median first) until their mean is the measured mean; a seeded shuffle
               assigns them to prompts
    outputs:   exactly output_len tokens (ignore_eos, max_tokens = output_len)
    refusals:  a request whose prompt plus output_len exceeds max_model_len is refused by the API server
               (vLLM answers 400 when prompt + max_tokens does not fit the context) and never reaches the
               engine: it is left out of the replay, keeping its place in the prompt cycle, and counted
               as failed

The server: the model preset with the run's max_model_len, the hardware preset with its
tensor_parallel, block size 16, prefix caching and chunked prefill on, the run's max_num_seqs and
max_num_batched_tokens, the logged GPU block count when known, else what fits at 0.9 utilisation
beside the weights and ``NON_KV_GIB_PER_GPU`` per GPU. Nothing else: the step model and the frontend are
the hardware's defaults.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.fidelity.runs import MeasuredStage
from sim.scenario import Scenario, scenario_from_dict
from sim.specs import HardwareSpec, ModelSpec

# GPU memory vLLM keeps per GPU besides the weights and the KV cache (its profiling pass's activations, the
# CUDA context, communication and graph buffers), from the one run whose log gives its block count, the
# Llama-2-7B at TP 1 on H100 (vllm_h100_runs.csv): 0.9 x 80 GiB - 12.551 GiB of weights - 7,463 blocks x
# 8 MiB = 1.144 GiB (1.136-1.144 GiB give 7,463 blocks). Taken as the same for the other models, an
# assumption no logged run checks: the activations of a 2,048-token pass are a few hundred MB for each of
# them, sharded by tensor parallelism. kvsim's generic reserve, 5% of the usable HBM (3.6 GiB a card),
# would size the 7B at 7,148 blocks.
NON_KV_GIB_PER_GPU = 1.14

# tokens per content id of a rebuilt prompt (inline hash_ids): the server's block size, so a block is shared
# exactly when all of its tokens are
CONTENT_TOKENS = 16
_GROUP_ID, _PROMPT_ID = 1 << 24, 1 << 40   # content ids: group x 2^24 + chunk; 2^40 + prompt x 2^24 + chunk

# Between two stages the client (inference-perf) waits until every request of the first has finished,
# sleeps its stage interval (load.interval, 1 s by default) and starts the next stage's timer 1 s ahead
STAGE_GAP_S = 2.0


def prompt_lengths(q: dict[str, float], count: int) -> np.ndarray:
    """``count`` integer prompt lengths whose quantiles follow ``q`` and whose mean is ``q['mean']``."""
    p10, p50, p90, p99 = q["p10"], q["p50"], q["p90"], q["p99"]
    lo = max(1.0, p10 - (p50 - p10) / 4)            # the 0.1-0.5 slope carried down to 0
    hi = p99 + (p99 - p90) / 9                       # the 0.9-0.99 slope carried up to 1
    u = (np.arange(count) + 0.5) / count
    lengths = np.rint(np.interp(u, [0.0, 0.1, 0.5, 0.9, 0.99, 1.0], [lo, p10, p50, p90, p99, hi])).astype(np.int64)
    lengths = np.maximum(lengths, 1)
    diff = int(round(q["mean"] * count)) - int(lengths.sum())
    order = np.argsort(np.abs(u - 0.5), kind="stable")   # nearest the median first
    step = 1 if diff > 0 else -1
    i = 0
    while diff:
        k = order[i % count]
        if lengths[k] + step >= 1:
            lengths[k] += step
            diff -= step
        i += 1
    return lengths


def arrivals(rng: np.random.Generator, start_s: float, duration_s: float, count: int) -> np.ndarray:
    """``count`` Poisson arrivals conditioned to fill [start_s, start_s + duration_s] (the last at the end)."""
    gaps = rng.exponential(size=count)
    times = start_s + duration_s * np.cumsum(gaps) / gaps.sum()
    times[-1] = start_s + duration_s   # exactly, whatever the rounding of the cumulative sum
    return times


def poisson_arrivals(rng: np.random.Generator, start_s: float, rate: float, count: int) -> np.ndarray:
    """The first ``count`` arrivals of inference-perf's poisson load from ``start_s``: each whole second
    draws n ~ Poisson(rate) requests (none: the second passes empty) and spreads them over that second as
    ``arrivals`` spreads a stage, the last on the second."""
    parts = []
    second, left = start_s, count
    while left > 0:
        n = int(rng.poisson(rate))
        if n:
            gaps = rng.exponential(size=n)
            times = second + np.cumsum(gaps) / gaps.sum()
            times[-1] = second + 1.0
            parts.append(times[:left])
            left -= min(n, left)
        second += 1.0
    return np.concatenate(parts) if parts else np.empty(0)


def system_tokens(stage: MeasuredStage) -> int:
    """Server-side tokens of a group's shared system prompt: the BOS token and the system prompt's client-side
    tokens, scaled as the whole prompt grows from the client's count to the server's (re-tokenising the
    decoded random ids makes more tokens: the 7B's 566 become 591.6 on average)."""
    if stage.system_prompt_len <= 0:
        return 0
    client = stage.system_prompt_len + stage.question_len
    growth = (stage.prompt_quantiles["mean"] - 1) / client
    return 1 + round(stage.system_prompt_len * growth)


def prompt_content(prompt: int, group: int, length: int, shared: int) -> list[int]:
    """The content ids of prompt ``prompt`` of ``length`` tokens in group ``group``: the group's over the
    ``CONTENT_TOKENS``-token chunks wholly inside its first ``shared`` tokens, the prompt's own after."""
    inside = min(shared, length - 1) // CONTENT_TOKENS
    chunks = -(-length // CONTENT_TOKENS)
    return [group * _GROUP_ID + k for k in range(inside)] + \
        [_PROMPT_ID + prompt * _GROUP_ID + k for k in range(inside, chunks)]


def build_requests(stages: list[MeasuredStage], seed: int, starts: list[float] | None = None
                   ) -> tuple[list[dict[str, Any]], list[tuple[float, float]], list[int]]:
    """Inline requests for a run's stages, each stage's (start_s, end_s) window (from its start to its last
    arrival, at least its duration), and how many requests each stage sends that the API server refuses
    (prompt + output_len > max_model_len: they take their place in the prompt cycle but are not
    replayed). ``starts``: the stages' start times, as far as they are known; a stage past them starts
    where the one before it ends. A stage's draws do not depend on its start: the stages before one are
    the same requests, shifted, whatever the starts after them."""
    first = stages[0]
    rng = np.random.default_rng(seed)
    lengths = rng.permutation(prompt_lengths(first.prompt_quantiles, first.num_prompts))
    per_group = -(-first.num_prompts // first.num_groups)
    groups = np.random.default_rng([seed, 1]).permutation(first.num_prompts) // per_group   # (own draws)
    shared = system_tokens(first)
    content = [prompt_content(p, int(groups[p]), int(lengths[p]), shared) for p in range(first.num_prompts)]
    requests: list[dict[str, Any]] = []
    windows = []
    refused = []
    start = 0.0
    sent = 0
    for k, s in enumerate(stages):
        if starts is not None and k < len(starts):
            start = starts[k]
        elif math.isinf(start):
            raise ValueError("a stage after a concurrent one needs its start (it begins once that one drains)")
        if s.load == "poisson":
            times = poisson_arrivals(rng, start, s.rate_req_s, s.num_requests)
        elif s.load == "concurrent":   # every request ready at the start; the client's workers send them
            times = np.full(s.num_requests, start)
        else:
            times = arrivals(rng, start, s.duration_s, s.num_requests)
        n_refused = 0
        for t in times:
            p = sent % s.num_prompts
            sent += 1
            plen = int(lengths[p])
            if plen + s.output_len > s.max_model_len:
                n_refused += 1
                continue
            requests.append({"arrival": float(t), "prompt_len": plen, "output_len": s.output_len,
                             "hash_ids": content[p]})
        end = max(start + s.duration_s, float(times[-1]) if len(times) else start)
        if s.load == "concurrent":   # sent until the stage drains: up to the next stage's start, if known
            known = starts is not None and k + 1 < len(starts)
            end = float(np.nextafter(starts[k + 1], -np.inf)) if known else math.inf
        windows.append((start, end))
        refused.append(n_refused)
        start = end
    return requests, windows, refused


def server_settings(stage: MeasuredStage) -> dict[str, Any]:
    """The scenario keys of the measured server (everything but the workload): with ``data_parallel`` > 1 its
    engines as a cluster behind vLLM's balancer (``dp_balance``), the ranks of one data-parallel engine for a
    mixture of experts, plain replicas for a dense model (whose ranks share nothing)."""
    spec = stage.model_spec or ModelSpec.from_name(stage.model)
    model = spec.model_dump() | {"max_model_len": stage.max_model_len}
    hardware = HardwareSpec.from_name(stage.hardware).model_dump() | {"tensor_parallel": stage.tensor_parallel,
                                                                      "pipeline_parallel": stage.pipeline_parallel}
    kv: dict[str, Any] = {"block_size": 16, "prefix_caching": True}
    if stage.num_gpu_blocks:
        kv["num_gpu_blocks"] = stage.num_gpu_blocks
    else:   # (activation_reserve_gb is over every GPU of the server)
        kv["activation_reserve_gb"] = NON_KV_GIB_PER_GPU * stage.tensor_parallel * stage.pipeline_parallel
    out = {"model": model, "hardware": hardware, "kv_cache": kv,
           "scheduler": {"max_num_seqs": stage.max_num_seqs, "chunked_prefill": True,
                         "max_num_batched_tokens": stage.max_num_batched_tokens}}
    if stage.data_parallel > 1:   # vLLM's --data-parallel-size: engines behind its own balancer, each with the
        # limits and the logged KV blocks; a mixture of experts' ranks step together (sim/cluster/data_parallel.py)
        out["cluster"] = {"replicas": stage.data_parallel, "router": {"policy": "dp_balance"},
                          **({"data_parallel": True} if spec.num_experts else {})}
    return out


def run_scenario_for(stages: list[MeasuredStage], seed: int, overrides: list[str] | None = None,
                     source: str = "<fidelity>", starts: list[float] | None = None
                     ) -> tuple[Scenario | None, list[tuple[float, float]], list[int]]:
    """The scenario replaying a measured run (all its stages, starting at ``starts`` as far as given: see
    ``build_requests``), each stage's window and its refused requests; no scenario when the API server
    refuses every request."""
    requests, windows, refused = build_requests(stages, seed, starts)
    if not requests:
        return None, windows, refused
    workload: dict[str, Any] = {"requests": requests, "hash_block_tokens": CONTENT_TOKENS}
    if any(s.load == "concurrent" for s in stages):   # the client's workers: a limit per stage (sim/clients.py)
        workload["max_concurrency"] = [{"from_s": w[0], "limit": s.concurrency or max(len(requests), 1)}
                                       for s, w in zip(stages, windows)]
    data = {"name": f"fidelity-{stages[0].run}", "seed": seed, **server_settings(stages[0]),
            "workload": workload, "output": {"plots": False}}
    return scenario_from_dict(data, source=source, overrides=overrides), windows, refused
