"""A model whose every layer attends a sliding window (Mistral-7B-v0.1; sim/kv/sliding_only.py): each request's
table cut to the window step by step by hand, vLLM's rule for a prefix hit on its own test cases, the bound
on what can ever fit, whole runs against every token kept, and the settings kvsim refuses."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.errors import KvsimError
from sim.executors.local_attention import LocalAttention
from sim.kv.sliding_only import NULL, SlidingKVCacheManager
from sim.request import Request
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.specs import ModelSpec


def _req(i: int, prompt: int, out: int) -> Request:
    return Request(req_id=i, arrival_s=0.0, prompt_len=prompt, output_len=out)


def _step(mgr: SlidingKVCacheManager, req: Request, n: int) -> bool:
    """One step computing ``n`` tokens of ``req``, as the scheduler runs it: the blocks a chunk left behind
    freed as the step is planned, allocate, then the tokens computed."""
    mgr.free_stale_pages()
    if not mgr.allocate_slots(req, n):
        return False
    req.num_computed_tokens += n
    mgr.note_computed(n)
    return True


def test_the_table_follows_the_window_by_hand():
    """Blocks of 2 tokens, a window of 4 (vLLM's remove_skipped_blocks test's shapes): 11 prompt tokens take
    6 blocks; the next step's query at token 11 sees tokens 8 .. 11, so blocks 0 .. 3 leave (last first)."""
    mgr = SlidingKVCacheManager(num_blocks=20, block_size=2, local=LocalAttention(4), step_tokens=100)
    r = _req(0, 11, 10)
    assert _step(mgr, r, 11)
    table = list(mgr.block_tables[0])
    assert len(table) == 6 and mgr.pool.num_used == 6
    assert _step(mgr, r, 1)     # computed 11: blocks 0-3 leave; token 11 fills block 5
    assert mgr.block_tables[0] == [NULL] * 4 + table[4:] and mgr.pool.num_used == 2
    assert mgr.pool._queue.order()[-4:] == table[3::-1]   # freed last block first, at the free queue's tail
    assert _step(mgr, r, 1)     # computed 12: the query at 12 sees 9 .. 12: block 4 stays; block 6 opens
    assert mgr.pool.num_used == 3 and mgr.block_tables[0][:5] == [NULL] * 4 + table[4:5]
    assert _step(mgr, r, 1)     # computed 13: sees 10 .. 13: block 4 leaves
    assert mgr.block_tables[0][:5] == [NULL] * 5 and mgr.pool.num_used == 2
    assert mgr._held_tokens == 14 - 5 * 2   # the two blocks' filled slots: tokens 10 .. 13
    mgr.check_integrity()
    mgr.free(r)
    assert mgr.pool.num_used == 0 and mgr._held_tokens == 0 and mgr._logical_blocks == 0
    mgr.check_integrity()


def test_what_can_ever_fit_is_the_window_and_one_step():
    """A window of 64 and steps of at most 64 tokens, blocks of 16: a request's blocks never exceed
    ceil((63 + 64) / 16) + 1 = 9, however long it is; a short one needs only its own."""
    mgr = SlidingKVCacheManager(num_blocks=9, block_size=16, local=LocalAttention(64), step_tokens=64)
    assert mgr.window_blocks_max(100_000) == 9 and mgr.can_ever_fit(_req(0, 90_000, 10_000))
    assert mgr.window_blocks_max(40) == 3
    assert not SlidingKVCacheManager(8, 16, LocalAttention(64), 64).can_ever_fit(_req(0, 90_000, 10))
    r = _req(1, 2000, 1)
    while r.num_computed_tokens < r.prompt_len:   # a 2,000-token prompt in chunks of 64 fits in 9 blocks
        assert _step(mgr, r, min(64, r.prompt_len - r.num_computed_tokens))
        assert mgr.pool.num_used <= 9
    mgr.check_integrity()


@pytest.mark.parametrize("cached, expect", [
    # vLLM's test_sliding_window_possible_cached_prefix (blocks of 2, a window of 4: 2 contiguous blocks needed)
    ([False] * 10, 0), ([True], 1), ([True, False], 1), ([True, True], 2), ([True, True, False], 2),
    ([True, True, True], 3), ([True, True, True, False], 3),
    ([True, True, False, True, False, False, True, True, False, True, True, True], 12),
    ([True, True, False, True, False, False, True, True, False, False, False], 8),
    ([True, True, False, True, False, False, True, True, False, False, False, True], 8),
])
def test_a_prefix_hit_is_vllms_for_one_sliding_group(cached, expect):
    """The hit ends with the last run of 2 cached blocks (else the cached run from block 0); everything before
    that run is null, as in vLLM's computed blocks."""
    mgr = SlidingKVCacheManager(num_blocks=40, block_size=2, local=LocalAttention(4), step_tokens=100,
                                prefix_caching=True)
    r = _req(0, 2 * len(cached) + 1, 5)   # its prompt's full blocks, all looked up (a token left to compute)
    hashes = mgr._hashes_upto(r, len(cached))
    blocks = mgr.pool.allocate(len(cached))
    for b, h, c in zip(blocks, hashes, cached):
        if c:
            mgr.prefix_cache.insert(b, h)
    mgr.pool.free(blocks)   # (cached ones stay findable in the free queue)
    hit = mgr.match_prefix_blocks(r)
    assert len(hit) == expect
    nulls = max(0, expect - 2)   # (vLLM: every computed block before the last two is null)
    assert list(hit[:nulls]) == [NULL] * nulls
    assert list(hit[nulls:]) == [b for b, c in zip(blocks[nulls:expect], cached[nulls:expect])]
    if expect:   # the hit starts the table: nulls, the cached blocks, then blocks for the rest of the prompt
        assert mgr.allocate_slots(r, r.prompt_len - 2 * expect, hit)
        assert r.num_computed_tokens == 2 * expect and r.num_cached_tokens == 2 * expect
        rest = len(cached) + 1 - expect   # (the prompt's 2 x len + 1 tokens take len + 1 blocks)
        assert mgr.block_tables[0][:nulls] == [NULL] * nulls and mgr.pool.num_used == expect - nulls + rest
        mgr.check_integrity()


def _mistral(hybrid: bool, **kv) -> dict:
    """Mistral-7B-v0.1 (every layer a 4,096-token window) on one H100 with 600 blocks (9,600 tokens), a prompt
    of 12,000 tokens chunked 2,048 at a time, then 10 output tokens."""
    return {"name": "mistral", "model": "mistral-7b-v0.1", "hardware": "h100-80gb", "seed": 1,
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 600, "hybrid_manager": hybrid, **kv},
            "scheduler": {"max_num_batched_tokens": 2048, "chunked_prefill": True},
            "workload": {"requests": [{"arrival": 0.0, "prompt_len": 12000, "output_len": 10}]},
            "output": {"plots": False}}


def _both(data: dict):
    """The run in the SimPy loop and in the compiled core (where built), the invariants checked after every step:
    the same results bit for bit; the core's."""
    from result_compare import assert_same

    import sim.engine_core as engine_core
    from sim.native import native

    runs = []
    before = engine_core.enabled
    try:
        for on in (False, True):
            engine_core.enabled = on
            runs.append(run_scenario(scenario_from_dict(data), check_integrity=True))
    finally:
        engine_core.enabled = before
    assert_same(*runs)
    assert runs[1].profile["compiled_core"] == (native is not None)
    return runs[1]


def test_a_context_longer_than_the_cache_runs_in_its_window():
    """Every token kept, 12,010 tokens never fit 9,600 slots: refused. Cut to the window, it runs: at most
    384 blocks at once, while a chunk from c tokens holds blocks (c - 4,095) // 16 .. (c + 2,048) / 16 - 1 (c =
    4,096: blocks 0 .. 383, the first one not yet out of the window); a decode from c = 12,000 to 12,009 holds
    blocks (c - 4,095) // 16 = 494 .. 750: 257, until the request ends and gives them back."""
    kept = run_scenario(scenario_from_dict(_mistral(False)), check_integrity=True)
    assert kept.summary["num_rejected"] == 1
    cut = _both(_mistral(True))
    assert cut.summary["num_finished"] == 1
    block_bytes = 16 * ModelSpec.from_name("mistral-7b-v0.1").kv_bytes_per_token()   # 16 x 128 KiB
    assert cut.summary["kv_bytes_peak"] == 384 * block_bytes
    decoding = cut.steps[cut.steps["num_prefill_tokens"] == 0]
    assert list(decoding["kv_blocks_used"]) == [257] * 8 + [0]


def test_windows_are_refused_with_what_they_do_not_model():
    with pytest.raises(KvsimError) as e:
        scenario_from_dict(_mistral(True) | {"scheduler": {"preemption": "swap"}})
    assert "preemption by swap with mistral-7b-v0.1's window pages" in str(e.value)
    assert "kv_cache.hybrid_manager: false" in str(e.value)
    scenario_from_dict(_mistral(False) | {"scheduler": {"preemption": "swap"}})   # every token kept: allowed


def test_prefix_caching_over_the_window_serves_a_repeated_prompt():
    """The same 12,000-token prompt twice, one after the other: the second finds the last 256 blocks before
    its last full block cached (its window: ceil(4,095 / 16) = 256 contiguous blocks), a hit of 749 blocks
    (11,984 tokens) whose first 493 entries are null."""
    data = _mistral(True, prefix_caching=True)
    data["workload"]["requests"].append({"arrival": 30.0, "prompt_len": 12000, "output_len": 10,
                                         "hash_ids": list(range(750))})
    data["workload"]["requests"][0]["hash_ids"] = list(range(750))
    res = _both(data)
    reqs = res.requests.set_index("req_id")
    assert list(reqs["num_cached_tokens"]) == [0, 749 * 16]
    assert np.isfinite(reqs["finish_s"]).all()


def test_kv_size_counts_the_window_of_each_sequence():
    """16,384 tokens of Mistral-7B-v0.1: 1,024 blocks of 16 with every token kept; the last query sees tokens
    12,288 .. 16,383, blocks 768 .. 1,023: 256 blocks, 2 MiB each (16 tokens x 32 layers x 2 x 8 heads x 128
    x 2 bytes), so a GPU's blocks hold four times the sequences."""
    from sim.commands.kv_size import pages_per_sequence

    model = ModelSpec.from_name("mistral-7b-v0.1")
    assert pages_per_sequence(model, 16384, 16) == 256
    assert pages_per_sequence(model.model_copy(update={"hybrid_kv": False}), 16384, 16) == 1024
    assert pages_per_sequence(model, 3000, 16) == 188   # (shorter than the window: all of its blocks)


def _tiny(hybrid: bool, blocks: int, caching: bool = False, rate: float = 40.0) -> dict:
    """tiny-gemma with all four layers in a window of 64 tokens, blocks of 16, 60 prompts of 20 to 400 tokens
    chunked 128 at a time."""
    return {"name": "tiny-window", "model": {"name": "tiny-gemma", "sliding_layers": 4}, "hardware": "a100-80gb",
            "seed": 5, "kv_cache": {"block_size": 16, "num_gpu_blocks": blocks, "hybrid_manager": hybrid,
                                    "prefix_caching": caching},
            "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 128, "max_num_seqs": 8},
            "workload": {"synthetic": {"num_requests": 60, "arrival": {"process": "poisson", "rate": rate},
                                       "prompt_len": {"dist": "uniform", "min": 20, "max": 400},
                                       "output_len": {"dist": "uniform", "min": 1, "max": 120},
                                       "shared_prefix": {"groups": 3, "length": 64}}},
            "output": {"plots": False}}


def test_with_room_to_spare_the_window_changes_memory_not_time():
    """A cache no schedule fills (8 requests of at most 520 tokens in 2,000 blocks): every step and request the
    same, to the bit, as with every token kept (the attention is priced over the window either way); each
    step holds at most the blocks it would with every token kept."""
    cut = _both(_tiny(True, 2000))
    kept = run_scenario(scenario_from_dict(_tiny(False, 2000)), check_integrity=True)
    assert kept.summary["num_preemptions"] == 0
    memory = ("kv_", "slots_")   # (the steps' memory columns: blocks, bytes, usage, the slots' breakdown)
    same = [c for c in cut.steps.columns if not c.startswith(memory)]
    assert {"start_s", "duration_s", "num_prefill_tokens", "num_decode_tokens", "num_waiting"} <= set(same)
    pd.testing.assert_frame_equal(cut.steps[same], kept.steps[same], check_exact=True)
    pd.testing.assert_frame_equal(cut.requests, kept.requests, check_exact=True)
    assert (cut.steps["kv_blocks_used"] <= kept.steps["kv_blocks_used"]).all()
    assert cut.steps["kv_blocks_used"].max() < kept.steps["kv_blocks_used"].max()


@pytest.mark.parametrize("caching", [False, True])
def test_a_small_cache_under_pressure_keeps_every_invariant(caching):
    """30 blocks for 8 seats: preemptions by recompute (prefix hits over the shared prefixes, with a cache), the
    invariants checked after every step, in the loop and the core alike; every request ends, and no block is
    left held."""
    res = _both(_tiny(True, 30, caching, rate=200.0))
    s = res.summary
    assert s["num_finished"] == 60 and s["num_preemptions"] > 0
    assert res.steps["kv_blocks_used"].iloc[-1] == 0
    if caching:
        assert s["prefix_cache_hit_rate"] > 0


def test_a_mixed_load_equals_in_the_loop_and_the_core():
    """40 requests, prompts of 100 to 6,000 tokens (some past the window, some within it), shared prefixes of
    1,000 tokens, 300 blocks: drops, hits by the one-group rule and preemptions, the same bit for bit."""
    data = _mistral(True, prefix_caching=True, num_gpu_blocks=300)
    data["workload"] = {"synthetic": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 20.0},
                                      "prompt_len": {"dist": "uniform", "min": 100, "max": 6000},
                                      "output_len": {"dist": "uniform", "min": 1, "max": 1000},
                                      "shared_prefix": {"groups": 4, "length": 1000}}}
    res = _both(data)
    assert res.summary["num_preemptions"] > 0 and res.summary["prefix_cache_hit_rate"] > 0


def test_fuzzed_cases_on_every_layer_sliding():
    """Drawn fuzz cases moved onto tiny-gemma with all four layers in its 64-token window (the settings the
    window's tables refuse turned off): each run with the invariants checked after every step, again without
    decode runs and in the SimPy loop instead of the compiled core, all three the same (``sim.fuzz.run_case``)."""
    import random

    from sim.fuzz import _pages_allowed, draw_scenario, run_case

    ran = 0
    for i in range(300):
        d = draw_scenario(random.Random(f"sliding-only:{i}"), i)
        name = d["model"].get("name") if isinstance(d["model"], dict) else d["model"]
        if "num_gpu_blocks" not in d["kv_cache"] or name not in ("tiny-llama", "tiny-gemma"):
            continue
        d["model"] = {"name": "tiny-gemma", "sliding_layers": 4}
        d["kv_cache"].update(hybrid_manager=True, allocator="paged")
        for key in ("swap_space_gb", "cpu_offload_gib"):
            d["kv_cache"].pop(key, None)
        d["scheduler"].update(batching="continuous", preemption="recompute", parallel_sampling="fanout")
        d.pop("speculative", None)
        if not _pages_allowed(d):   # (beams)
            continue
        case = run_case(d, i)
        assert case.outcome in ("ok", "refused"), (i, case.error)
        ran += case.outcome == "ok"
    assert ran >= 60
