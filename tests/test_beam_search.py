"""Beam search as fork and free of block tables: ref counts equal holders after every redraw, beams
share their history, and a dropped beam's private blocks go back to the pool."""

from __future__ import annotations

from collections import Counter

from sim.kv.manager import KVCacheManager
from sim.request import Request
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict


def test_beams_fork_and_free_with_exact_ref_counts():
    m = KVCacheManager(64, 16)
    r = Request(0, 0.0, 20, 40, beam_width=4)
    assert m.allocate_slots(r, 20)
    r.num_computed_tokens, r.num_generated = 20, 1
    m.note_computed(20)
    m.on_token(r)                                  # fork: 4 beams share blocks 0 and 1
    assert m.pool.ref_counts[:2] == [4, 4]
    for _ in range(30):
        before = [list(t) for t in m.seq_tables(0)]
        assert m.allocate_slots(r, 1)
        copies = m.take_copies()
        # every copy's source was shared before the step and is a block some beam held
        held = Counter(b for t in before for b in t)
        assert all(held[src] > 1 for src, _ in copies)
        r.num_computed_tokens += 1
        r.num_generated += 1
        m.note_computed(4)
        m.on_token(r)                              # redraw 4 parents among the 4 beams
        tables = m.seq_tables(0)
        assert len(tables) == 4
        holders = Counter(b for t in tables for b in t)
        assert all(m.pool.ref_counts[b] == c for b, c in holders.items())
        assert m.pool.num_used == len(holders)     # nothing leaked: every used block is held
        assert all(t[0] == 0 for t in tables)      # the prompt's full block is shared by all beams
        m.check_integrity()
    m.free(r)
    assert m.pool.num_used == 0
    m.check_integrity()


def _saving(key: str, width: int) -> float:
    scn = scenario_from_dict({
        "model": "tiny-llama", "hardware": "cpu",
        "kv_cache": {"block_size": 16, "num_gpu_blocks": 600, "swap_space_gb": 0},
        "workload": {"synthetic": {"num_requests": 8, "arrival": {"process": "burst"},
                                   "prompt_len": {"dist": "fixed", "value": 100},
                                   "output_len": {"dist": "fixed", "value": 120}, key: width}},
        "output": {"plots": False},
    })
    import sim.runner as runner
    made = []
    orig = runner.make_kv_manager
    runner.make_kv_manager = lambda *a, **k: made.append(orig(*a, **k)) or made[-1]
    try:
        res = run_scenario(scn)
    finally:
        runner.make_kv_manager = orig
    assert res.summary["num_finished"] == 8
    return made[-1].sharing_summary(1)["kv_sharing_saving"]


def test_beam_search_shares_more_than_parallel_sampling():
    # parallel samples share only the prompt; beams also share the history of common ancestors
    assert _saving("beam_width", 4) > _saving("n", 4) > 0
