"""The scenario fuzzer: random small scenarios, run with every invariant checked, then conservation checks.

    draw_scenario(rng) -> dict          a random, valid scenario (tiny caches, few requests)
    run_case(data)     -> CaseResult    run it (integrity check after every step) and check the outcome
    fuzz(seed, count)  -> FuzzReport    many cases; failures keep the scenario, to replay with ``kvsim run``

Knobs are a list of (dotted key, draw function). Enumerated settings (scheduler.policy, allocator,
preemption, ...) are read from the pydantic schema, so a value added to a ``Literal`` is fuzzed without
touching this file; a new boolean or number is one line in ``KNOBS``. A run that raises
NotImplementedError (a setting whose code has not landed yet) counts as *unsupported*, not as a failure.

End-of-run checks (``check_outcome``), each computed from the run's tables, not from its summary code:
- every request is FINISHED, REJECTED with a reason (and never scheduled), or ABORTED with a reason (its
  client's timeout); finished + rejected + aborted = requests;
- the summary's preemption count equals the per-request sum;
- per finished request: arrival <= first scheduled <= first token <= finish;
- step times are monotone: each step starts at or after the previous one's end;
- the last step leaves no block referenced, no token state held (cached free blocks count as free) and
  nothing swapped out;
- each step's memory slots add up to the capacity;
- without preemptions, swaps, prefix hits or beams, the tokens computed over all steps equal, per finished
  request, prompt + n x (output - 1): the prompt once, then every sampled token but the last in each of
  the n sequences (the last one's KV is never computed), so every output token was made.
"""

from __future__ import annotations

import copy
import math
import random
import time
import traceback
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.scenario import KVCacheConfig, SchedulerConfig
from sim.specs import ModelSpec, complete_from_preset

MODELS = ["tiny-llama", "tiny-llama", "llama-2-7b", "llama-3-8b", "tiny-deepseek"]   # (the last: MoE, latent)
WINDOW_P = 0.35   # of the cases drawn on tiny-llama: tiny-gemma instead (sliding-window layers; _sliding_window)
HARDWARE = ["a100-80gb", "h100-80gb", "cpu", "h200-141gb", "a100-40gb"]   # (the last two: derived calibrations)
STALL_STEPS = 5_000  # fuzzed runs use a tight watchdog so a livelock fails fast instead of hanging


def literal_choices(model: type, name: str) -> list[Any]:
    """The values a ``Literal[...]`` field of a pydantic model accepts (in declaration order)."""
    ann = model.model_fields[name].annotation
    args = typing.get_args(ann)
    if typing.get_origin(ann) is typing.Literal:
        return list(args)
    for a in args:  # Optional[Literal[...]]
        if typing.get_origin(a) is typing.Literal:
            return list(typing.get_args(a))
    raise TypeError(f"{model.__name__}.{name} is not a Literal field")


def _choice(values: list[Any]) -> Callable[[random.Random], Any]:
    return lambda rng: rng.choice(values)


def _schema_choice(model: type, name: str) -> Callable[[random.Random], Any]:
    """Half the time the schema default, else any accepted value (so unbuilt values do not drown the rest)."""
    default = model.model_fields[name].default
    return lambda rng: default if rng.random() < 0.5 else rng.choice(literal_choices(model, name))


def _maybe(p: float, draw: Callable[[random.Random], Any], default: Any = None) -> Callable[[random.Random], Any]:
    return lambda rng: draw(rng) if rng.random() < p else default


# (dotted key, draw): applied in order; a draw returning None leaves the key out (schema default)
KNOBS: list[tuple[str, Callable[[random.Random], Any]]] = [
    ("model", _choice(MODELS)),
    ("hardware", _choice(HARDWARE)),
    ("kv_cache.block_size", _choice([1, 2, 4, 8, 16, 32])),
    ("kv_cache.num_gpu_blocks", lambda rng: rng.randint(1, 48)),
    ("kv_cache.swap_space_gb", _choice([0.0, 0.0001, 0.001, 0.01])),
    ("kv_cache.allocator", _schema_choice(KVCacheConfig, "allocator")),
    ("kv_cache.prefix_caching", _choice([False, True])),
    ("scheduler.batching", _schema_choice(SchedulerConfig, "batching")),
    ("scheduler.policy", _schema_choice(SchedulerConfig, "policy")),
    ("scheduler.preemption", _schema_choice(SchedulerConfig, "preemption")),
    ("scheduler.victim", _schema_choice(SchedulerConfig, "victim")),
    ("scheduler.chunked_prefill", _choice([False, True])),
    ("scheduler.async_scheduling", _choice([False, True])),
    ("scheduler.max_num_seqs", _choice([1, 2, 3, 4, 8, 256])),
    ("scheduler.max_num_batched_tokens", _maybe(0.6, lambda rng: rng.choice([1, 2, 8, 16, 64, 256, 2048]))),
    ("scheduler.rr_quantum_steps", _choice([1, 2, 4, 16])),
    ("scheduler.multi_step", _choice([False, True])),      # decode runs: must change nothing (test_multi_step)
    ("executor.engine", _choice([True, False])),           # engine-level step terms or isolated operators
    ("frontend.enabled", _choice([True, False])),          # frontend latencies before and after the engine
    ("kv_cache.dtype", _maybe(0.3, _choice(["fp8", "fp32"]))),  # the cache's own element type (else auto)
    ("scheduler.parallel_sampling", _schema_choice(SchedulerConfig, "parallel_sampling")),   # forked or requests
]


# Schema fields the fuzzer leaves alone, and why (tests/test_fuzz.py checks that every field of the
# kv_cache and scheduler sections is either a knob above, drawn in draw_scenario, or listed here).
NOT_FUZZED: dict[str, str] = {
    "scheduler.max_steps_without_progress": "fixed to STALL_STEPS so a livelock fails fast",
}
# drawn by draw_scenario itself (they depend on each other): capacity from HBM instead of num_gpu_blocks
DRAWN_IN_SCENARIO = ("kv_cache.gpu_memory_utilization", "kv_cache.activation_reserve_gb", "hardware.tensor_parallel",
                     "kv_cache.cpu_offload_gib", "kv_cache.hybrid_manager")
HBM_CAPACITY_P = 0.1   # share of cases sized from HBM (gpu_memory_utilization, activation reserve)
TP_P = 0.15            # share of cases with tensor parallelism (2 or 4 GPUs)
REFUSED_P = 0.05       # share of drawn unsupported combinations kept (they must be refused cleanly)
HOST_TIER_P = 0.25     # share of cases with a host tier under the prefix cache (dropped without one)
QUANTIZED_P = 0.15     # share of cases (with a block count given) whose model has weight-only quantized weights
SPECULATIVE_P = 0.15   # share of the cases that can speculate (paged, continuous, one sequence a request) that do


def _set(data: dict, path: str, value: Any) -> None:
    node = data
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _length(rng: random.Random, hi: int) -> dict:
    hi = max(1, hi)
    kind = rng.choice(["fixed", "uniform", "uniform", "lognormal"])
    if kind == "fixed":
        return {"dist": "fixed", "value": rng.randint(1, hi)}
    if kind == "uniform":
        lo = rng.randint(1, hi)
        return {"dist": "uniform", "min": lo, "max": rng.randint(lo, hi)}
    return {"dist": "lognormal", "mean": float(rng.randint(1, hi)), "std": float(rng.randint(1, hi)),
            "min": 1, "max": hi}


def _arrival(rng: random.Random) -> dict:
    process = rng.choice(["burst", "poisson", "gamma", "constant"])
    if process == "burst":
        return {"process": "burst"}
    out: dict = {"process": process, "rate": rng.choice([1.0, 20.0, 500.0])}
    if process == "gamma":
        out["cv"] = rng.choice([0.5, 2.0])
    return out


TRACES_DIR = Path(__file__).resolve().parent.parent / "scenarios" / "traces"
# shipped traces (file, workload keys); lengths are clipped to a small max_model_len so requests fit
TRACES: list[tuple[str, dict]] = [
    ("azure_llm_2023_conv.csv", {"format": "azure"}),
    ("azure_llm_2023_code.csv", {"format": "azure"}),
    ("mooncake_conversation.jsonl", {"format": "mooncake"}),
    ("mooncake_synthetic.jsonl", {"format": "mooncake"}),
    ("burstgpt_synthetic_sample.csv", {"format": "burstgpt"}),
    ("arxiv_summarization_lengths.csv", {"format": "vidur", "arrival": {"process": "poisson", "rate": 50.0}}),
]


def draw_trace(rng: random.Random, cache_tokens: int) -> dict | None:
    """A few requests of a shipped trace, clipped and sped up; None when the traces are not installed."""
    name, keys = rng.choice(TRACES)
    path = TRACES_DIR / name
    if not path.exists():
        return None
    out: dict = {"trace": str(path), **keys, "limit": rng.randint(1, 10),
                 "max_model_len": rng.randint(2, max(2, int(cache_tokens * 1.2)))}
    if rng.random() < 0.5:
        out["time_scale"] = rng.choice([0.001, 0.01, 0.1])
    return out


def draw_workload(rng: random.Random, cache_tokens: int, multi_seq: bool = True) -> dict:
    """A synthetic, inline or trace workload whose prompts reach a little past the cache (some get rejected)."""
    hi = max(2, int(cache_tokens * 1.2))
    if rng.random() < 0.15:
        trace = draw_trace(rng, cache_tokens)
        if trace is not None:
            return trace
    if rng.random() < 0.3:
        reqs = []
        for _ in range(rng.randint(1, 6)):
            r: dict = {"arrival": round(rng.uniform(0, 0.5), 3) if rng.random() < 0.5 else 0.0,
                       "prompt_len": rng.randint(1, hi), "output_len": rng.randint(1, 40)}
            if rng.random() < 0.3:
                r["priority"] = rng.randint(0, 3)
            if multi_seq and rng.random() < 0.2:
                r["n"] = rng.randint(2, 3)
            elif multi_seq and rng.random() < 0.1:
                r["beam_width"] = rng.randint(2, 3)
            if rng.random() < 0.3:
                r["prefix_group"] = rng.randint(0, 1)
                r["prefix_len"] = rng.randint(0, r["prompt_len"] - 1)
            reqs.append(r)
        return {"requests": reqs}
    syn: dict = {"num_requests": rng.randint(1, 12), "arrival": _arrival(rng),
                 "prompt_len": _length(rng, hi), "output_len": _length(rng, rng.choice([1, 8, 40]))}
    if rng.random() < 0.3:
        syn["shared_prefix"] = {"groups": rng.randint(1, 3), "length": rng.randint(1, max(1, hi // 2))}
    if multi_seq and rng.random() < 0.2:
        syn["n"] = rng.randint(2, 3)
    elif multi_seq and rng.random() < 0.1:
        syn["beam_width"] = rng.randint(2, 3)
    if rng.random() < 0.3:
        syn["priority"] = {"dist": "uniform", "min": 0, "max": 3}
    out: dict = {"synthetic": syn}
    if rng.random() < 0.15:
        out["max_model_len"] = rng.randint(2, 4096)
    if rng.random() < 0.1 and syn["num_requests"] >= 2 and syn["arrival"]["process"] != "burst":
        out["rate"] = rng.choice([5.0, 100.0])  # rescaling needs two distinct arrival times
    return out


def _combination_problem(data: dict) -> tuple[str, str] | None:
    from sim.scenario import Scenario, unsupported_combination

    probe = {k: v for k, v in data.items() if k != "workload"}
    probe["workload"] = {"requests": [{"prompt_len": 1, "output_len": 1}]}
    return unsupported_combination(Scenario.model_validate(probe))


def _capacity_and_parallelism(rng: random.Random, data: dict) -> None:
    """Sometimes a tensor-parallel group, sometimes a cache sized from HBM instead of num_gpu_blocks."""
    if rng.random() < TP_P:
        from sim.specs import HardwareSpec

        hw = HardwareSpec.from_name(data["hardware"]).model_dump()
        hw["tensor_parallel"] = rng.choice([2, 4])
        data["hardware"] = hw
    if rng.random() < HBM_CAPACITY_P:
        # a utilization that leaves room for about ``blocks`` KV blocks after the weights and the reserve
        from sim.specs import GiB, HardwareSpec, ModelSpec

        kv = data["kv_cache"]
        model = ModelSpec.from_name(data["model"])
        hw = data["hardware"] if isinstance(data["hardware"], dict) else HardwareSpec.from_name(
            data["hardware"]).model_dump()
        blocks = kv.pop("num_gpu_blocks")
        # (a group of more GPUs than KV heads holds each head on several of them: kv_replicas copies)
        block_bytes = model.kv_bytes_per_block(kv.get("block_size", 16), kv.get("dtype")) \
            * model.kv_replicas(hw.get("tensor_parallel", 1))
        need = model.weight_bytes() + (blocks + 0.5) * block_bytes
        reserve = rng.choice([None, 0.0, 0.001])
        if reserve is None:
            usable = need / 0.95  # the default reserve is 5% of the usable memory
        else:
            kv["activation_reserve_gb"] = reserve
            usable = need + reserve * GiB
        util = usable / (hw["hbm_bytes"] * hw.get("tensor_parallel", 1))
        if util <= 1.0:
            kv["gpu_memory_utilization"] = util
        else:  # the weights do not fit this hardware: keep the explicit block count
            kv["num_gpu_blocks"] = blocks
            kv.pop("activation_reserve_gb", None)


def _host_tier(rng: random.Random, data: dict) -> None:
    """Sometimes a host tier of 1 to 64 blocks (``cpu_offload_gib`` from the bytes of a block over the
    group: at least that many, so small caches overflow it)."""
    if rng.random() >= HOST_TIER_P:
        return
    from sim.specs import GiB, ModelSpec

    kv = data["kv_cache"]
    hw = data["hardware"]
    tp = hw.get("tensor_parallel", 1) if isinstance(hw, dict) else 1   # (each GPU holds at most every head)
    block = ModelSpec.from_name(data["model"]).kv_bytes_per_block(kv.get("block_size", 16), kv.get("dtype")) * tp
    kv["cpu_offload_gib"] = (rng.randint(1, 64) + 0.5) * block / GiB


def drop_refused(data: dict) -> dict:
    """``data`` with each setting the schema refuses dropped back to its default until none is left."""
    problem = _combination_problem(data)
    while problem is not None:
        section, _, key = problem[0].partition(".")
        if section == "speculative" or not key:   # (its keys go together: speculation is dropped whole)
            data.pop(section, None)
        else:
            data[section].pop(key, None)
        problem = _combination_problem(data)
    return data


def drawn_cache_tokens(data: dict) -> int:
    """Tokens the drawn cache holds (for a cache sized from HBM, lengths on the scale of the small caches)."""
    kv = data["kv_cache"]
    return kv["num_gpu_blocks"] * kv["block_size"] if "num_gpu_blocks" in kv else 64 * kv["block_size"]


def draw_scenario(rng: random.Random, index: int = 0) -> dict:
    """One random scenario (as the dict a YAML file would hold). A few (``REFUSED_P``) keep a combination
    of settings the schema refuses; ``run_case`` then expects that refusal."""
    data: dict = {"name": f"fuzz-{index}", "seed": rng.randint(0, 2**31 - 1)}
    for path, draw in KNOBS:
        value = draw(rng)
        if value is not None:
            _set(data, path, value)
    _set(data, "scheduler.max_steps_without_progress", STALL_STEPS)
    _set(data, "output.plots", False)
    _capacity_and_parallelism(rng, data)
    _host_tier(rng, data)
    if rng.random() >= REFUSED_P:
        drop_refused(data)
    # parallel samples and beams fork block tables: only paged + continuous batching accepts them
    multi_seq = (data["kv_cache"].get("allocator", "paged") == "paged"
                 and data["scheduler"].get("batching", "continuous") == "continuous")
    data["workload"] = draw_workload(rng, drawn_cache_tokens(data), multi_seq)
    draw_client(rng, data["workload"])
    _quantized_weights(data)
    _speculative(data)
    _sliding_window(data)
    _timeout(rng, data)
    _pipeline(data)
    _expert_parallel(data)
    _lora(data)
    return data


PIPELINE_P = 0.1   # of the cases whose settings allow it: pipeline stages (hardware.pipeline_parallel)


def _pipeline(data: dict) -> None:
    """Sometimes 2 to 4 pipeline stages (as many as the model has layers), where the case allows them: a block
    count given (a cache sized from HBM was sized for one stage's GPUs), one sequence a request, no drafts,
    swaps or host tier (``scenario._pipeline_problem``). Drawn from a stream of its own."""
    rng = random.Random(f"pipeline:{data['seed']}")
    if rng.random() >= PIPELINE_P or "num_gpu_blocks" not in data["kv_cache"] or _max_n(data) > 1:
        return
    layers = drawn_model(data).num_layers
    if layers < 2:
        return
    from sim.specs import HardwareSpec

    hw = data["hardware"]
    before = copy.deepcopy(hw)
    hw = data["hardware"] = dict(hw) if isinstance(hw, dict) else HardwareSpec.from_name(hw).model_dump()
    hw["pipeline_parallel"] = rng.randint(2, min(4, layers))
    if rng.random() < 0.3:
        hw["pipeline_link"] = rng.choice(["nvlink", "infiniband-400g", "ethernet-100g"])
    if _combination_problem(data) is not None:
        data["hardware"] = before


EXPERT_PARALLEL_P = 0.5   # of the cases on a mixture of experts over several GPUs: experts placed whole


def _expert_parallel(data: dict) -> None:
    """Sometimes a mixture of experts' experts placed whole on its tensor-parallel GPUs
    (``hardware.expert_parallel``, sim/expert_parallel.py), where the case allows it. Drawn from a stream of
    its own."""
    rng = random.Random(f"expert_parallel:{data['seed']}")
    hw = data["hardware"]
    if rng.random() >= EXPERT_PARALLEL_P or not isinstance(hw, dict) or hw.get("tensor_parallel", 1) < 2 \
            or not drawn_model(data).num_experts:
        return
    hw["expert_parallel"] = True
    if _combination_problem(data) is not None:
        hw["expert_parallel"] = False


LORA_P = 0.25   # of the cases whose settings allow it: multi-LoRA serving (the lora section, sim/lora.py)


def _lora(data: dict) -> None:
    """Sometimes LoRA adapters (1 to 4 a batch, a host cache of at least as many, 1 to 8 adapters drawn), where
    the case allows them (``scenario._lora_problem``) and gives a block count (a cache sized from HBM was sized
    without the adapters' slots). Drawn from a stream of its own."""
    rng = random.Random(f"lora:{data['seed']}")
    if rng.random() >= LORA_P or "num_gpu_blocks" not in data["kv_cache"]:
        return
    slots = rng.randint(1, 4)
    data["lora"] = {"max_loras": slots, "max_cpu_loras": slots + rng.randint(0, 3), "adapters": rng.randint(1, 8),
                    "popularity": rng.choice(["uniform", "zipf"]), "share": rng.choice([0.3, 0.8, 1.0]),
                    "load_latency_s": rng.choice([0.0, 0.01])}
    if _combination_problem(data) is not None:
        del data["lora"]


TIMEOUT_P = 0.15   # share of cases with a client timeout (workload.timeout_s)


def _timeout(rng: random.Random, data: dict) -> None:
    """Sometimes a client timeout (every setting takes one)."""
    if rng.random() < TIMEOUT_P:
        data["workload"]["timeout_s"] = rng.choice([0.0005, 0.005, 0.05, 0.5])


def _sliding_window(data: dict) -> None:
    """Sometimes tiny-gemma where tiny-llama was drawn with a block count (its shapes, with sliding-window
    layers, every layer's now and then as Mistral-7B-v0.1's, or chunked ones as Llama 4 has), its cache as
    vLLM's hybrid manager keeps it where the case allows (sim/kv/window_pages.py, sim/kv/sliding_only.py), else
    every token kept (``kv_cache.hybrid_manager: false``), and now and then the
    latter anyway. Drawn from a stream of its own (the case's other draws stay as they were)."""
    rng = random.Random(f"window:{data['seed']}")
    model = data["model"]
    name = model.get("name") if isinstance(model, dict) else model
    if name != "tiny-llama" or rng.random() >= WINDOW_P or "num_gpu_blocks" not in data["kv_cache"]:
        return   # (a cache sized from HBM was sized for tiny-llama's weights)
    if isinstance(model, dict):
        model["name"] = "tiny-gemma"
    else:
        data["model"] = model = {"name": "tiny-gemma"}
    chunks = rng.random() < 0.4
    if chunks:   # Llama 4's kind instead: chunks of 64 on the same three layers
        model.update(sliding_window=0, sliding_layers=None, attention_chunk_size=64, chunked_layers=3)
    kv = data["kv_cache"]
    for key in ("swap_space_gb", "cpu_offload_gib"):   # (its 4 layers' blocks are twice tiny-llama's 2 layers')
        if kv.get(key):
            kv[key] *= 2
    if rng.random() < 0.2 or not _pages_allowed(data):
        data["kv_cache"]["hybrid_manager"] = False
    if not chunks and rng.random() < 0.5:   # Mistral-7B-v0.1's kind: every layer in the window
        model["sliding_layers"] = 4   # (tables cut to the window, sim/kv/sliding_only.py)


def _pages_allowed(data: dict) -> bool:
    """Whether a drawn case may keep window pages (``scenario._hybrid_manager_problem``'s settings, and
    inline requests of one sequence each)."""
    kv, sched, work = data["kv_cache"], data["scheduler"], data["workload"]
    syn = work.get("synthetic", {})
    wide = any(r.get("n", 1) > 1 or r.get("beam_width", 1) > 1 for r in work.get("requests", []))
    forks = sched.get("parallel_sampling", "fork") == "fork" and (wide or syn.get("n", 1) > 1)
    return not (sched.get("batching", "continuous") == "static" or kv.get("allocator", "paged") != "paged"
                or sched.get("preemption", "recompute") == "swap" or kv.get("cpu_offload_gib")
                or "speculative" in data or forks or syn.get("beam_width", 1) > 1 or wide)


def _speculative(data: dict) -> None:
    """Sometimes speculative decoding: ngram, or (with a block count given: a drafter's weights would shrink a
    cache sized from HBM) an EAGLE or EAGLE-3 head, 1 to 4 drafts, any acceptance from none to all. Drawn from a
    stream of its own (the case's other draws stay as they were), only where the engine can speculate."""
    rng = random.Random(f"speculative:{data['seed']}")
    kv, sched = data["kv_cache"], data["scheduler"]
    if (rng.random() >= SPECULATIVE_P or kv.get("allocator", "paged") != "paged"
            or sched.get("batching", "continuous") != "continuous" or _max_n(data) > 1):
        return
    k = rng.randint(1, 4)
    rate = rng.choice([0.0, 1.0, round(rng.random(), 3), [round(rng.random(), 3) for _ in range(k)]])
    method = rng.choice(["ngram", "eagle", "eagle3"]) if "num_gpu_blocks" in kv else "ngram"
    data["speculative"] = {"method": method, "num_speculative_tokens": k, "acceptance_rate": rate}


def _quantized_weights(data: dict) -> None:
    """Sometimes the model's projections in int4 or int8 with groups of 32 or 128 rows, or one scale a column:
    other prices, the same engine. Drawn from a stream of its own (the case's other draws stay as they were),
    only where the block count is given (a cache sized from HBM would grow by the weights' savings)."""
    rng = random.Random(f"weights:{data['seed']}")
    if rng.random() >= QUANTIZED_P or not isinstance(data["model"], str) or "num_gpu_blocks" not in data["kv_cache"]:
        return
    data["model"] = {"name": data["model"], "weight_dtype": rng.choice(["int4", "int8"]),
                     "weight_group_size": rng.choice([0, 32, 128])}


def drawn_model(data: dict) -> ModelSpec:
    """The model of a drawn case: a preset's name, or a mapping naming one (``_quantized_weights``)."""
    model = data["model"]
    return ModelSpec(**complete_from_preset(dict(model), ModelSpec)) if isinstance(model, dict) \
        else ModelSpec.from_name(model)


def draw_client(rng: random.Random, workload: dict) -> None:
    """Sometimes a client with a concurrency limit in front of the engines (sim/clients.py)."""
    if rng.random() < 0.1:
        workload["max_concurrency"] = rng.randint(1, 4)
        if rng.random() < 0.5:
            workload["think_time_s"] = rng.choice([0.001, 0.05])
            if rng.random() < 0.5:
                workload["think_time_dist"] = "exponential"


# ---------------------------------------------------------------- known issues

def _max_n(data: dict) -> int:
    """The widest request (parallel samples or beams) of a fuzzed workload."""
    wl = data.get("workload", {})
    rows = wl.get("requests") or [wl.get("synthetic", {})]
    return max((max(r.get("n", 1), r.get("beam_width", 1)) for r in rows), default=1)


def _has_beams(data: dict) -> bool:
    wl = data.get("workload", {})
    return any(r.get("beam_width", 1) > 1 for r in (wl.get("requests") or [wl.get("synthetic", {})]))


# Open bugs whose fix belongs elsewhere, each with a regression test (tests/test_fuzz_regressions.py).
# A failing case that matches one is reported as "known:<name>" instead of "failed"; drop the entry
# when the fix lands, so the fuzzer guards it again.
KNOWN_ISSUES: dict[str, Callable[[dict, str], bool]] = {}  # none open


def known_issue(data: dict, error: str) -> str:
    return next((name for name, match in KNOWN_ISSUES.items() if match(data, error)), "")


# ---------------------------------------------------------------- running and checking


@dataclass
class CaseResult:
    index: int
    scenario: dict
    outcome: str                 # "ok" | "refused" | "unsupported" | "known:<issue>" | "failed"
    error: str = ""
    seconds: float = 0.0
    num_steps: int = 0


@dataclass
class FuzzReport:
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if c.outcome == "failed"]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cases:
            out[c.outcome] = out.get(c.outcome, 0) + 1
        return out


def check_outcome(requests, steps, summary: dict, capacity_slots: int, beams: bool = False) -> list[str]:
    """Conservation checks on a finished run's tables; returns the problems found (empty: all good).
    ``beams``: some request searches beams (its token count depends on the draws: that check is skipped)."""
    bad: list[str] = []
    status = requests["status"]
    ended = ["FINISHED", "REJECTED", "ABORTED"]
    if not status.isin(ended).all():
        left = requests.loc[~status.isin(ended), "req_id"].tolist()
        bad.append(f"requests neither finished, rejected nor aborted: {left[:10]}")
    rej = requests[status.isin(["REJECTED", "ABORTED"])]
    if (rej["reject_reason"].fillna("") == "").any():
        bad.append(f"rejected or aborted without a reason: "
                   f"{rej.loc[rej['reject_reason'].fillna('') == '', 'req_id'].tolist()}")
    rej = requests[status == "REJECTED"]
    if rej["first_scheduled_s"].notna().any() or rej["first_token_s"].notna().any():
        bad.append("a rejected request was scheduled or produced a token")
    done = requests[status == "FINISHED"]
    if "num_preemptions" in requests.columns and int(requests["num_preemptions"].sum()) != summary["num_preemptions"]:
        bad.append(f"summary num_preemptions {summary['num_preemptions']} != per-request sum "
                   f"{int(requests['num_preemptions'].sum())}")
    aborted = summary.get("num_aborted", 0)
    if aborted != int((status == "ABORTED").sum()):
        bad.append("the summary's num_aborted differs from the requests table")
    if summary["num_finished"] + summary["num_rejected"] + aborted != len(requests):
        bad.append("num_finished + num_rejected + num_aborted != num_requests")
    eps = 1e-9
    for col_a, col_b in (("arrival_s", "first_scheduled_s"), ("first_scheduled_s", "first_token_s"),
                         ("first_token_s", "finish_s")):
        wrong = done[~(done[col_b] >= done[col_a] - eps)]
        if len(wrong):
            bad.append(f"{col_b} < {col_a} (or missing) for requests {wrong['req_id'].tolist()[:10]}")
    if "generated_tokens" in done.columns:
        expect = done["output_tokens"] * (done["n"] if "n" in done.columns else 1)
        if not (done["generated_tokens"] == expect).all():
            bad.append("generated tokens differ from output length x n")
    if len(steps):
        start = steps["start_s"].to_numpy()
        end = steps["end_s"].to_numpy()
        if (steps["duration_s"] <= 0).any():
            bad.append("a step with a non-positive duration")
        if (start[1:] < end[:-1] - eps).any():
            bad.append("steps overlap or go back in time")
        last = steps.iloc[-1]
        if last.get("num_swapped", 0) != 0:
            bad.append(f"after the last step {last['num_swapped']} requests are still swapped out")
        # (a request aborted after the last step frees its blocks then, with no step to record it)
        late = (status == "ABORTED") & (requests["finish_s"] >= end[-1] - eps)
        if (last["kv_blocks_used"] != 0 or last["slots_token_states"] != 0) and not late.any():
            bad.append(f"after the last step {last['kv_blocks_used']} blocks and "
                       f"{last['slots_token_states']} token slots are still held")
        slots = steps[["slots_token_states", "slots_reserved", "slots_internal_frag", "slots_external_frag",
                       "slots_free"]].sum(axis=1)
        if not (slots == capacity_slots).all():
            bad.append("memory slots do not add up to the capacity in some step")
        if len(done) and not done["finish_s"].max() <= end[-1] + eps:
            bad.append("a request finished after the last step ended")
    elif len(done):
        bad.append("requests finished without any step")
    plain = (not beams and summary["num_preemptions"] == 0 and (requests["num_cached_tokens"] == 0).all()
             and summary.get("swapped_blocks", 0) == 0 and not aborted)
    if plain and len(steps):
        # the prompt once, then each of the n sequences computes every output token but the last (and,
        # speculating, the drafts it rejected)
        spec = summary.get("speculative", {})
        rejected = spec.get("draft_tokens", 0) - spec.get("accepted_tokens", 0)
        computed = int(steps["num_prefill_tokens"].sum() + steps["num_decode_tokens"].sum()) - rejected
        expect = int((done["prompt_tokens"] + done["n"] * (done["output_tokens"] - 1)).sum())
        if computed != expect:
            bad.append(f"tokens computed over all steps {computed} != sum of prompt + n x (output - 1) = {expect}")
    bd = summary["memory_breakdown"]
    if not math.isclose(sum(bd.values()), 1.0, abs_tol=1e-6):
        bad.append(f"memory breakdown sums to {sum(bd.values())}")
    return bad


def run_case(data: dict, index: int = 0) -> CaseResult:
    """Validate and run one scenario dict with integrity checks on; classify the outcome."""
    from sim.errors import KvsimError
    from sim.runner import run_scenario
    from sim.scenario import scenario_from_dict

    t0 = time.perf_counter()
    try:
        expected = _combination_problem(data)
    except Exception:  # noqa: BLE001 - an invalid draw: scenario_from_dict below reports it
        expected = None
    try:
        scn = scenario_from_dict(data, source=f"<fuzz {index}>")
        if expected is not None:
            return CaseResult(index, data, "failed", f"{expected[0]}: accepted, should be refused",
                              time.perf_counter() - t0)
        result = run_scenario(scn, check_integrity=True)
    except KvsimError as e:
        if expected is not None and e.what.startswith(f"{expected[0]}: "):
            return CaseResult(index, data, "refused", e.one_line(), time.perf_counter() - t0)
        error = f"KvsimError: {e}"
        known = known_issue(data, error)
        return CaseResult(index, data, f"known:{known}" if known else "failed", error, time.perf_counter() - t0)
    except NotImplementedError as e:
        return CaseResult(index, data, "unsupported", str(e), time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - the fuzzer reports every crash with its scenario
        error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"
        known = known_issue(data, error)
        return CaseResult(index, data, f"known:{known}" if known else "failed", error, time.perf_counter() - t0)
    cap = int(result.summary["num_gpu_blocks"]) * scn.kv_cache.block_size
    problems = check_outcome(result.requests, result.steps, result.summary, cap, beams=_has_beams(data))
    error = "; ".join(problems)
    outcome = "ok" if not problems else (f"known:{known_issue(data, error)}" if known_issue(data, error) else "failed")
    return CaseResult(index, data, outcome, error, time.perf_counter() - t0, int(result.summary["num_steps"]))


def fuzz(seed: int, count: int, on_case: Callable[[CaseResult], None] | None = None,
         start: int = 0) -> FuzzReport:
    """Run ``count`` random scenarios drawn from ``seed`` (case i is reproducible from (seed, i))."""
    report = FuzzReport()
    for i in range(start, start + count):
        data = draw_scenario(random.Random(f"{seed}:{i}"), i)
        case = run_case(data, i)
        report.cases.append(case)
        if on_case is not None:
            on_case(case)
    return report
