"""The shipped policy scenarios show what they claim (small runs of them, integrity checked every step)."""

from pathlib import Path

import numpy as np
import pytest

from sim.commands.compare import run_all

SCN = Path(__file__).resolve().parent.parent / "scenarios"


def test_continuous_batching_doubles_static_throughput():
    res = run_all(str(SCN / "static_vs_continuous.yaml"), [("scheduler.batching", ["static", "continuous"])],
                  ["workload.synthetic.num_requests=160", "kv_cache.num_gpu_blocks=800"])
    static, cont = (res[k].summary for k in ("batching=static", "batching=continuous"))
    assert static["num_finished"] == cont["num_finished"] == 160
    assert cont["output_throughput_tok_s"] >= 2.0 * static["output_throughput_tok_s"]


def test_seed_example_static_idles_continuous_refills():
    res = run_all(str(SCN / "seed_four_requests.yaml"), [("scheduler.batching", ["static", "continuous"])], [])
    st = res["batching=static"].requests.set_index("req_id")
    co = res["batching=continuous"].requests.set_index("req_id")
    # A, B, C, D = 0, 1, 2, 3; E, F, G = 4, 5, 6. Static: E, F, G start only when C (200 tokens) ends.
    assert st.loc[4, "first_scheduled_s"] >= st.loc[2, "finish_s"]
    assert st.loc[3, "finish_s"] < st.loc[1, "finish_s"] < st.loc[0, "finish_s"] < st.loc[2, "finish_s"]
    # Continuous: E takes D's seat right after D's 30th token, F takes B's after B's 50th.
    assert co.loc[3, "finish_s"] <= co.loc[4, "first_scheduled_s"] < co.loc[1, "finish_s"]
    assert co.loc[1, "finish_s"] <= co.loc[5, "first_scheduled_s"] < co.loc[0, "finish_s"]


def test_round_robin_bounds_the_queue_wait_at_some_throughput():
    res = run_all(str(SCN / "fcfs_vs_round_robin.yaml"), [("scheduler.policy", ["fcfs", "round_robin"])],
                  ["workload.synthetic.num_requests=120", "kv_cache.num_gpu_blocks=512"])
    fc, rr = res["policy=fcfs"].summary, res["policy=round_robin"].summary
    assert rr["num_finished"] == fc["num_finished"] == 120
    assert rr["queue_wait_max_s"] < 0.5 * fc["queue_wait_max_s"]
    assert rr["jain_fairness"] > fc["jain_fairness"] + 0.1
    assert rr["num_preemptions"] > 0 == fc["num_preemptions"]
    assert rr["output_throughput_tok_s"] < fc["output_throughput_tok_s"]   # the price: recomputation


def _saturated_breakdown(res) -> dict[str, float]:
    st = res.steps[res.steps["num_waiting"] > 0]
    cols = ["slots_token_states", "slots_reserved", "slots_internal_frag", "slots_external_frag", "slots_free"]
    w = st["duration_s"].to_numpy()
    frac = (st[cols].to_numpy(float) * w[:, None]).sum(axis=0) / w.sum()
    frac /= frac.sum()
    return dict(zip(["token_states", "reserved", "internal", "external", "free"], frac))


def test_memory_breakdown_paged_vs_contiguous_baselines():
    allocs = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"]
    res = run_all(str(SCN / "memory_breakdown.yaml"), [("kv_cache.allocator", allocs)],
                  ["workload.synthetic.num_requests=240"])
    sat = {a: _saturated_breakdown(res[f"allocator={a}"]) for a in allocs}
    ts = {a: sat[a]["token_states"] for a in allocs}
    assert ts["paged"] >= 0.9
    assert ts["contiguous-max"] < ts["contiguous-pow2"] < ts["contiguous-oracle"] < ts["paged"] - 0.2
    assert sat["paged"]["external"] == 0.0 and sat["contiguous-oracle"]["external"] > 0.0
    assert sat["contiguous-max"]["internal"] > 0.4          # regions sized at 2,048 tokens
    for a in allocs:
        assert sum(res[f"allocator={a}"].summary["memory_breakdown"].values()) == pytest.approx(1.0)
        assert res[f"allocator={a}"].summary["num_finished"] == 240


def test_swap_cost_grows_as_blocks_shrink():
    sizes = ["8", "32", "128"]
    res = run_all(str(SCN / "swap_vs_recompute.yaml"),
                  [("kv_cache.block_size", sizes), ("scheduler.preemption", ["swap", "recompute"])],
                  ["workload.synthetic.num_requests=48", "scheduler.max_num_seqs=48",
                   "workload.synthetic.output_len.max=512"])
    per_token = []
    for bs in sizes:
        sw, rc = res[f"block_size={bs}, preemption=swap"], res[f"block_size={bs}, preemption=recompute"]
        for r in (sw, rc):
            assert r.summary["num_finished"] == 48 and r.summary["num_rejected"] == 0
        assert sw.summary["swapped_blocks"] > 0 and rc.summary["swapped_blocks"] == 0
        assert rc.summary["swap_time_s"] == 0.0
        per_token.append(sw.summary["swap_time_s"] / (sw.summary["swapped_blocks"] * int(bs)))
    assert np.all(np.diff(per_token) < 0)     # seconds per swapped token fall as blocks grow
    assert per_token[0] > 2.0 * per_token[-1]  # 8-token blocks pay mostly the per-block latency
    # and with small blocks swapping loses to recompute, with large ones it wins (the paper's Figure 19)
    mk = {k: r.summary["makespan_s"] for k, r in res.items()}
    assert mk["block_size=8, preemption=swap"] > mk["block_size=8, preemption=recompute"]
    assert mk["block_size=128, preemption=swap"] < mk["block_size=128, preemption=recompute"]
