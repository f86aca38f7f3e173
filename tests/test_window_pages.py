"""Sliding-window pages (sim/kv/window_pages.py, vLLM's hybrid KV cache manager): the pages a request holds
step by step by hand and against a per-block reference rule, the block counts of a model's groups, the
bound on what can ever fit, whole runs with their invariants checked, and the settings kvsim refuses."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sim.errors import KvsimError
from sim.executors.local_attention import LocalAttention
from sim.kv.window_pages import WindowedKVCacheManager
from sim.request import Request
from sim.runner import gpu_blocks, run_scenario
from sim.scenario import load_scenario, scenario_from_dict
from sim.specs import HardwareSpec, ModelSpec

ROOT = Path(__file__).resolve().parents[1]


def _req(i: int, prompt: int, out: int) -> Request:
    return Request(req_id=i, arrival_s=0.0, prompt_len=prompt, output_len=out)


def _step(mgr: WindowedKVCacheManager, req: Request, n: int) -> bool:
    """One step computing ``n`` tokens of ``req``, as the scheduler runs it: allocate, then the tokens computed."""
    if not mgr.allocate_slots(req, n):
        return False
    req.num_computed_tokens += n
    mgr.note_computed(n)
    return True


def test_pages_follow_the_window_by_hand():
    # blocks of 4 tokens, a window of 8, two sliding groups: a logical block in the window takes 2 pages
    mgr = WindowedKVCacheManager(num_blocks=100, block_size=4, local=LocalAttention(8), sliding_groups=2,
                                 step_tokens=1000)
    r = _req(0, 10, 20)
    assert _step(mgr, r, 10)   # 10 tokens: 3 table blocks, and all 3 blocks' pages (the prefill saw them all)
    assert mgr.pool.num_used == 3 + 2 * 3
    assert _step(mgr, r, 1)    # computed 10: the next query reaches back to token 3, block 0 still in the window
    assert mgr.pool.num_used == 3 + 2 * 3
    assert _step(mgr, r, 1)    # computed 11: it reaches back to token 4: block 0's pages leave
    assert mgr.pool.num_used == 3 + 2 * 2
    assert _step(mgr, r, 1)    # computed 12: token 12 opens block 3 (a table block and its 2 pages)
    assert mgr.pool.num_used == 4 + 2 * 3
    assert _step(mgr, r, 1)    # computed 13: reaches back to token 6 (block 1 stays)
    assert mgr.pool.num_used == 4 + 2 * 3
    assert _step(mgr, r, 1) and mgr.pool.num_used == 4 + 2 * 3   # computed 14: back to token 7, block 1 stays
    assert _step(mgr, r, 1) and mgr.pool.num_used == 4 + 2 * 2   # computed 15: back to token 8, block 1 leaves
    mgr.check_integrity()
    mgr.free(r)
    assert mgr.pool.num_used == 0 and mgr.window_pages_held() == 0
    mgr.check_integrity()


def _reference_pages(computed: int, end: int, span: int, chunked: bool, bs: int, groups: int) -> int:
    """Pages a step from ``computed`` to ``end`` tokens holds: each logical block below ``end`` with a token the
    next query (at position ``computed``) can still see (the ``span`` tokens up to it, or its chunk of
    ``span``), ``groups`` pages each."""
    seen = {t for t in range(computed + 1) if (t // span == computed // span if chunked else computed - t < span)}
    return groups * sum(1 for k in range(-(-end // bs)) if any(k * bs <= t < (k + 1) * bs for t in seen)
                        or k * bs > computed)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("chunked", [False, True])
def test_pages_against_a_reference_rule(seed, chunked):
    rng = random.Random(seed)
    bs, span, groups = rng.choice([4, 8, 16]), rng.randint(1, 70), rng.randint(1, 4)
    mgr = WindowedKVCacheManager(num_blocks=10_000, block_size=bs, local=LocalAttention(span, chunked),
                                 sliding_groups=groups, step_tokens=64)
    reqs = [_req(i, rng.randint(1, 150), rng.randint(1, 80)) for i in range(5)]
    live = list(reqs)
    while live:
        r = rng.choice(live)
        if r.num_computed_tokens < r.prompt_len:
            n = min(rng.randint(1, 64), r.prompt_len - r.num_computed_tokens)
        else:
            n = 1
        c = r.num_computed_tokens
        assert mgr.allocate_slots(r, n)   # during the step: what its queries see
        table = -(-(c + n) // bs)
        assert len(mgr.window_pages[r.req_id]) == _reference_pages(c, c + n, span, chunked, bs, groups)
        assert len(mgr.block_tables[r.req_id]) == table
        r.num_computed_tokens += n
        mgr.note_computed(n)
        mgr.free_stale_pages()   # as the next step is planned: a chunk's pages behind the next query are gone
        if n > 1:
            assert len(mgr.window_pages[r.req_id]) == _reference_pages(c + n, c + n, span, chunked, bs, groups)
        if r.num_computed_tokens >= r.prompt_len + r.output_len - 1 or rng.random() < 0.02:
            mgr.free(r)   # finished, or preempted (by recompute: it starts again)
            live.remove(r)
            if r.num_computed_tokens < r.prompt_len + r.output_len - 1:
                r.num_computed_tokens = 0
                live.append(r)
        mgr.check_integrity()
    assert mgr.pool.num_used == 0


def test_a_step_that_does_not_fit_takes_nothing():
    mgr = WindowedKVCacheManager(num_blocks=8, block_size=4, local=LocalAttention(8), sliding_groups=2,
                                 step_tokens=1000)
    r = _req(0, 12, 4)
    assert not mgr.allocate_slots(r, 12)   # 3 table blocks and 6 pages: 9 > 8
    assert mgr.pool.num_used == 0 and r.req_id not in mgr.window_pages
    assert mgr.blocks_needed(r, 8) == 2 + 2 * 2 and _step(mgr, r, 8)   # a chunk of 8: 6 blocks
    # the next chunk from 8 to 12: its first query sees tokens 1..8, so block 0 stays; block 2 joins
    assert mgr.blocks_needed(r, 4) == 1 + 2
    r.num_computed_tokens = 11   # (a decode at 11 would see tokens 4..11: block 0 leaves as block 2 is taken)
    assert mgr.blocks_needed(r, 1) == 1 + 2 - 2
    mgr.check_integrity()


def test_what_can_ever_fit_counts_the_window_of_a_chunk():
    # vLLM's bound: a step computes at most the chunk and sees window - 1 tokens before it: ceil((8 - 1 + 16) /
    # 4) + 1 = 7 logical blocks of pages at most, below a request's own 12 blocks
    mgr = WindowedKVCacheManager(num_blocks=12 + 2 * 7, block_size=4, local=LocalAttention(8), sliding_groups=2,
                                 step_tokens=16)
    assert mgr.window_blocks_max(48) == 7
    assert mgr.can_ever_fit(_req(0, 40, 9))   # 48 KV tokens
    assert not mgr.can_ever_fit(_req(1, 41, 9))
    # without chunks a prompt is one step: all of its blocks' pages
    whole = WindowedKVCacheManager(num_blocks=100, block_size=4, local=LocalAttention(8), sliding_groups=2,
                                   step_tokens=48)
    assert whole.window_blocks_max(48) == 12


def test_blocks_are_pages_of_one_group():
    # Gemma-3-27B: 10 full, 52 sliding layers: groups of 10 (six sliding, the last padded); a block is 16 tokens
    # of 10 layers of 16 KV heads x 128 x 2 x 2 bytes
    gemma = ModelSpec.from_name("gemma-3-27b")
    assert gemma.kv_pages() == (10, 6)
    assert gemma.kv_bytes_per_block(16) == 16 * 10 * 2 * 16 * 128 * 2 == 1_310_720
    # gpt-oss's even split (12 and 12: one group each), Gemma 2's (21 and 21), a full-heavy split (20 full, 8
    # sliding: groups of 8, three full ones, which kvsim does not page), and every layer sliding (no full group)
    split = ModelSpec.from_name("mistral-7b").model_copy(update={"sliding_window": 128, "sliding_layers": 12,
                                                                  "num_layers": 24})
    assert split.kv_pages() == (12, 1)
    assert ModelSpec.from_name("gemma-2-9b").kv_pages() == (21, 1)
    assert split.model_copy(update={"num_layers": 28, "sliding_layers": 8}).kv_pages() is None
    assert ModelSpec.from_name("mistral-7b-v0.1").kv_pages() is None   # (its tables are cut instead: sliding_only)
    assert ModelSpec.from_name("mistral-7b-v0.1").sliding_only() and not gemma.sliding_only()
    assert gemma.model_copy(update={"hybrid_kv": False}).kv_pages() is None
    # the cache: the same bytes in blocks of 10 layers instead of 62
    scn = {"model": "gemma-3-27b", "hardware": "h100-80gb", "workload": {"requests": [{"prompt_len": 5,
                                                                                      "output_len": 2}]}}
    pages = gpu_blocks(scenario_from_dict(scn))
    whole = gpu_blocks(scenario_from_dict({**scn, "kv_cache": {"hybrid_manager": False}}))
    h100 = HardwareSpec.from_name("h100-80gb")
    free = 0.9 * h100.hbm_bytes * 0.95 - gemma.num_params() * 2
    assert whole == int(free // (16 * 62 * 8192)) and pages == int(free // (16 * 10 * 8192))


def _scenario(**kv) -> dict:
    return {"name": "pages", "model": "tiny-gemma", "hardware": "a100-80gb",
            "kv_cache": {"num_gpu_blocks": 400, **kv},
            "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 256, "max_num_seqs": 16},
            "workload": {"synthetic": {"num_requests": 80, "arrival": {"process": "poisson", "rate": 40.0},
                                       "prompt_len": {"dist": "uniform", "min": 20, "max": 600},
                                       "output_len": {"dist": "uniform", "min": 5, "max": 200},
                                       "shared_prefix": {"groups": 3, "length": 128}}},
            "output": {"plots": False}}


@pytest.mark.usefixtures("simpy_loop")   # (the manager's own checks; the core's: the next test)
@pytest.mark.parametrize("prefix", [False, True])
def test_runs_under_pressure_keep_their_invariants(prefix):
    # tiny-gemma: 1 full and 3 sliding layers (a 64-token window), 200 pages of one layer: preemptions
    run = run_scenario(scenario_from_dict(_scenario(prefix_caching=prefix, num_gpu_blocks=200)),
                       check_integrity=True)
    s = run.summary
    assert s["num_finished"] + s["num_rejected"] == 80 and s["num_preemptions"] > 0
    if prefix:
        assert s["prefix_cache_hit_rate"] > 0
    again = run_scenario(scenario_from_dict(_scenario(prefix_caching=prefix, num_gpu_blocks=200)))
    assert run.steps.equals(again.steps) and run.requests.equals(again.requests)


@pytest.mark.parametrize("policy", ["fcfs", "round_robin", "priority"])
@pytest.mark.parametrize("model", ["window", "chunks"])
@pytest.mark.parametrize("prefix", [False, True], ids=["counts", "prefix-cache"])
def test_the_compiled_core_keeps_the_pages_as_the_loop_does(monkeypatch, policy, model, prefix):
    # core.c's window pages (counts, or blocks by identity beside a prefix cache: the free queue's order
    # decides every later eviction) against the manager's, under pressure, bit for bit, every invariant
    # checked after every step both ways; round-robin's head check counts the window's pages too
    from result_compare import assert_same, off_and_on

    from sim import engine_core

    data = _scenario(prefix_caching=prefix, num_gpu_blocks=200)
    data["scheduler"].update(policy=policy, rr_quantum_steps=8)
    if policy == "priority":
        data["workload"]["synthetic"]["priority"] = {"dist": "uniform", "min": 0, "max": 3}
    if model == "chunks":
        data["model"] = {"name": "tiny-gemma", "sliding_window": 0, "sliding_layers": None,
                         "attention_chunk_size": 64, "chunked_layers": 3}
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]
    assert_same(loop, core)
    s = core.summary
    assert s["num_preemptions"] > 0 and (s["prefix_cache_hit_rate"] > 0) == prefix


def test_pages_hold_more_than_whole_layers():
    # the same bytes: 120 blocks of 4 layers against 480 pages of one; a request past the window holds its
    # table and 3 x 5 pages (64 tokens and a block) instead of 4 blocks' worth a block of its table
    pages = run_scenario(scenario_from_dict(_scenario(num_gpu_blocks=480)))
    whole = run_scenario(scenario_from_dict(_scenario(num_gpu_blocks=120, hybrid_manager=False)))
    assert pages.summary["num_preemptions"] == 0 < whole.summary["num_preemptions"]
    assert pages.summary["kv_bytes_peak"] < whole.summary["kv_bytes_peak"]


@pytest.mark.parametrize("edit, key", [
    ({"scheduler": {"preemption": "swap"}}, "scheduler.preemption: preemption by swap"),
    ({"scheduler": {"batching": "static"}}, "scheduler.batching: static batching"),
    ({"kv_cache": {"allocator": "contiguous-max"}}, "kv_cache.allocator: the contiguous-max allocator"),
    ({"kv_cache": {"prefix_caching": True, "cpu_offload_gib": 1}}, "kv_cache.cpu_offload_gib: a host tier"),
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5}},
     "speculative: speculative decoding"),
    ({"workload": {"synthetic": {"num_requests": 4, "n": 2, "prompt_len": {"value": 8}, "output_len": {"value": 4}}}},
     "workload.synthetic.n: forked parallel samples"),
    ({"cluster": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}},
     "cluster: disaggregated prefill and decode pools"),
])
def test_settings_paging_does_not_model_are_refused(edit, key):
    data = {"model": "tiny-gemma", "hardware": "a100-80gb",
            "workload": {"requests": [{"prompt_len": 5, "output_len": 2}]}}
    for section, values in edit.items():
        data[section] = values
    with pytest.raises(KvsimError, match=f"{key}.*window pages.*set kv_cache.hybrid_manager: false"):
        scenario_from_dict(data)
    data["kv_cache"] = {**data.get("kv_cache", {}), "hybrid_manager": False}
    scenario_from_dict(data)   # every token kept: accepted


def test_inline_forked_samples_are_refused_at_run():
    data = {"model": "tiny-gemma", "hardware": "a100-80gb", "output": {"plots": False},
            "kv_cache": {"num_gpu_blocks": 400}, "workload": {"requests": [{"prompt_len": 5, "output_len": 2, "n": 3}]}}
    with pytest.raises(KvsimError, match="forked samples and beams with tiny-gemma's window pages"):
        run_scenario(scenario_from_dict(data))
    data["scheduler"] = {"parallel_sampling": "fanout"}   # samples as requests of their own: paged
    assert run_scenario(scenario_from_dict(data)).summary["num_finished"] == 3


def test_a_window_no_request_outgrows_pages_as_the_full_blocks_do():
    # Gemma-2-9B's 21 full and 21 sliding layers with a window of 8,000 tokens, over requests of at most
    # 7,979: no page ever leaves, and two pages of 21 layers are one block of 42, so every step's decision is
    # the same as with every token kept (the pool: 2 x 9,983 pages and one more, the floor of the same bytes)
    def run(hybrid: bool):
        scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                            ["model=gemma-2-9b", "model.sliding_window=8000",
                             f"kv_cache.hybrid_manager={str(hybrid).lower()}"])
        return run_scenario(scn, check_integrity=False)
    pages, whole = run(True), run(False)
    assert pages.summary["num_gpu_blocks"] == 2 * whole.summary["num_gpu_blocks"] + 1
    assert pages.summary["num_preemptions"] == whole.summary["num_preemptions"] > 0
    assert pages.steps["duration_s"].tolist() == whole.steps["duration_s"].tolist()


@pytest.mark.usefixtures("simpy_loop")   # (the lane is the loop's)
@pytest.mark.parametrize("chunked", [False, True])
def test_the_decode_lane_moves_the_windows_as_the_loop_does(monkeypatch, chunked):
    # the lane's block boundaries go through allocate_slots (boundary_need counts what they take and give
    # back): with and without it, the same steps and requests under pressure (preemptions), bit for bit
    from result_compare import assert_same, off_and_on

    import sim.sched.continuous as continuous

    data = _scenario(num_gpu_blocks=200)
    if chunked:
        data["model"] = {"name": "tiny-gemma", "sliding_window": 0, "sliding_layers": None,
                         "attention_chunk_size": 64, "chunked_layers": 3}
    monkeypatch.setattr(continuous, "LANE_MIN_BATCH", 1)
    off, on = off_and_on(monkeypatch, continuous.ContinuousScheduler, "use_lane",
                         lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(off, on)
    assert on.summary["num_preemptions"] > 0
