"""A data-parallel engine of a mixture of experts (cluster.data_parallel): each rank's weights and KV by hand,
the group's expert layer as a tensor-parallel group of all its GPUs on every rank's rows, lockstep steps
(every rank's step starts together and lasts the slowest rank's), conservation, determinism, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.cli import main
from sim.executors.cost_model import make_cost_model_executor
from sim.executors.data_parallel import DataParallelPricer
from sim.executors.roofline import allreduce_time, gemm_time_scalar
from sim.runner import gpu_blocks, run_scenario
from sim.scenario import load_scenario
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec, rank_weight_bytes

GiB = 1 << 30
MIXTRAL = ModelSpec.from_name("mixtral-8x7b")

SCENARIO = {
    "name": "dp", "seed": 3, "model": "mixtral-8x7b", "hardware": "h100-80gb",
    "frontend": {"enabled": False}, "output": {"plots": False},
    "cluster": {"replicas": 4, "data_parallel": True, "router": {"policy": "least_requests"}},
    "workload": {"synthetic": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 20},
                               "prompt_len": {"dist": "uniform", "min": 50, "max": 900},
                               "output_len": {"dist": "uniform", "min": 5, "max": 80}}},
}


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def _expert_bytes_by_hand() -> int:
    """Mixtral-8x7B: one expert of one layer, gate and up (2 x 4,096 x 14,336) and down (14,336 x 4,096), fp16."""
    return 3 * 4096 * 14336 * 2


def test_a_rank_holds_its_share_of_the_experts() -> None:
    hw = HardwareSpec.from_name("h100-80gb")
    routed = 32 * 8 * _expert_bytes_by_hand()        # 32 layers of 8 experts: 90.2 GB
    whole = MIXTRAL.weight_bytes()
    assert rank_weight_bytes(MIXTRAL, hw, 4) == whole - routed + routed // 4   # each expert split four ways
    # placed whole over 3 GPUs: each keeps room for ceil(8 / 3) = 3 experts a layer
    ep = hw.model_copy(update={"expert_parallel": True})
    assert rank_weight_bytes(MIXTRAL, ep, 3) == whole - routed + 3 * 32 * _expert_bytes_by_hand()
    assert rank_weight_bytes(MIXTRAL, hw, 1) == whole   # one rank: the single engine's


def test_each_rank_caches_in_what_its_weights_leave(scenario: Path) -> None:
    scn = load_scenario(scenario)
    usable = 80 * GiB * 0.9                               # one H100 a rank, gpu_memory_utilization 0.9
    weights = MIXTRAL.weight_bytes() - 32 * 8 * _expert_bytes_by_hand() * 3 / 4
    block = 16 * 32 * 2 * 8 * 128 * 2                     # 16 tokens x 32 layers x K and V x 8 heads x 128 x fp16
    assert gpu_blocks(scn) == math.floor((usable * 0.95 - weights) / block)   # (5% kept for activations)
    # the single engine of the same GPU cannot hold Mixtral at all
    with pytest.raises(Exception, match="do not fit"):
        gpu_blocks(load_scenario(scenario, ["cluster=null"]))


def _pricers(path: Path, ranks: int):
    """(the group's pricer, a single engine of tensor-parallel degree ``ranks``) of the test scenario."""
    one = load_scenario(path, [f"cluster.replicas={ranks}"])
    base = make_cost_model_executor(model=one.model_spec, hardware=one.hardware_spec, config=one.executor,
                                    kv=one.kv_cache, scheduler=one.scheduler)
    group = load_scenario(path, ["cluster=null", f"hardware.tensor_parallel={ranks}"])
    tp = make_cost_model_executor(model=group.model_spec, hardware=group.hardware_spec, config=group.executor,
                                  kv=group.kv_cache, scheduler=group.scheduler)
    return DataParallelPricer(base, ranks, 16), tp


@pytest.mark.parametrize("tokens", [1, 7, 64, 512])
def test_the_expert_layer_is_a_tensor_parallel_group_of_all_the_gpus_on_every_ranks_rows(scenario: Path,
                                                                                         tokens: int) -> None:
    """Experts split over the group's 4 GPUs compute 4 x tokens rows: the experts of a TP-4 engine on 4 x tokens
    tokens (the gate apart: each rank's over its own tokens)."""
    dp, tp4 = _pricers(scenario, 4)
    m = MIXTRAL

    def gate(ex, t: int) -> float:   # the router's gate, [t, 4,096] x [4,096, 8] in fp16
        return gemm_time_scalar(t, m.num_experts, m.hidden_size, ex._peak, ex._bw, 2, ex.params)

    experts_dp = dp._moe_mlp_time(tokens) - gate(dp, tokens)
    experts_tp = tp4._moe_mlp_time(4 * tokens) - gate(tp4, 4 * tokens)
    assert experts_dp == pytest.approx(experts_tp, rel=1e-12)


def test_each_expert_layer_gathers_and_scatters_the_groups_hidden_states(scenario: Path) -> None:
    """At TP 1 a rank has no all-reduce of its own: its allreduce time is the 32 expert layers' all-gather and
    reduce-scatter, an all-reduce's traffic of 4 ranks x padded tokens x 4,096 x 2 bytes over 4 GPUs."""
    dp, _ = _pricers(scenario, 4)
    hw = dp.hardware
    plan = StepPlan(scheduled=[ScheduledRequest(i, 1, 100 + i, []) for i in range(3)])   # 3 decodes: padded to 4
    (res,) = dp.group_step([plan])
    by_hand = 32 * float(allreduce_time(4 * 4 * 4096 * 2, 4, hw.interconnect_bandwidth, hw.interconnect_latency_s,
                                        dp.params))
    assert res.breakdown["allreduce"] == pytest.approx(by_hand, rel=1e-12)


def test_a_group_step_lasts_its_slowest_rank_and_pads_every_rank_to_the_largest(scenario: Path) -> None:
    dp, _ = _pricers(scenario, 4)
    decode = StepPlan(scheduled=[ScheduledRequest(0, 1, 300, [])])
    prefill = StepPlan(scheduled=[ScheduledRequest(1, 700, 0, [])])
    alone = dp.group_step([decode, None, None, None])[0]
    together = dp.group_step([decode, prefill, None, None])
    assert together[0].duration_s == together[1].duration_s > 4 * alone.duration_s
    for r in together[:2]:   # each result's parts add up to the group's step
        assert sum(r.breakdown.values()) == pytest.approx(r.duration_s, rel=1e-12)
    # the decode rank's own work is priced on 700 padded tokens: its GEMMs are the prefill rank's
    assert together[0].breakdown["linear"] == pytest.approx(together[1].breakdown["linear"], rel=1e-3)
    assert together[2] is None and together[3] is None


def test_ranks_step_in_lockstep_and_every_request_ends(scenario: Path) -> None:
    # (a small cache: the integrity checks after every step read every block)
    res = run_scenario(load_scenario(scenario, ["kv_cache.num_gpu_blocks=1500"]), check_integrity=True)
    s = res.summary
    assert s["num_finished"] + s["num_rejected"] == 120 and s["num_finished"] == 120
    steps = res.steps
    # rows that start together last the same; the group's steps do not overlap
    assert (steps.groupby("start_s")["duration_s"].nunique() == 1).all()
    group = steps.groupby("start_s")["duration_s"].first().sort_index()
    starts, durations = group.index.to_numpy(), group.to_numpy()
    assert np.all(starts[1:] >= starts[:-1] + durations[:-1] - 1e-12)
    # every rank served requests (least_requests), and each request's replica is one of the four
    per = res.requests.groupby("replica").size()
    assert sorted(per.index.tolist()) == [0, 1, 2, 3] and per.sum() == 120
    assert s["step_model"]["data_parallel"] == 4


def test_same_seed_same_results(scenario: Path) -> None:
    a = run_scenario(load_scenario(scenario), check_integrity=False)
    b = run_scenario(load_scenario(scenario), check_integrity=False)
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)


@pytest.mark.parametrize("sets, message", [
    (["model=llama-3.1-8b"], "cluster.data_parallel: llama-3.1-8b is dense"),
    (["cluster.replicas=1"], "cluster.replicas: a data-parallel group needs at least 2 ranks"),
    (["cluster.replicas=8", "hardware.tensor_parallel=2"], "16 GPUs span nodes"),
    (["cluster.replicas=3"], "does not divide mixtral-8x7b's MLP intermediate size"),
    (["kv_cache.prefix_caching=true", "kv_cache.cpu_offload_gib=4"], "with a host tier of the prefix cache is not"),
    (["cluster={groups: [{replicas: 2}], data_parallel: true}"], "given as replicas"),
    (["cluster.data_parallel=false", "cluster.data_parallel_size=2"], "give it with data_parallel: true"),
    (["cluster.replicas=6", "cluster.data_parallel_size=4"], "6 replicas do not split into engines of 4 ranks"),
    (["cluster.replicas=16", "cluster.data_parallel_size=8", "hardware.tensor_parallel=2"],
     "cluster.data_parallel_size: 8 ranks x 2 GPUs = 16 GPUs span nodes"),
])
def test_settings_a_group_does_not_model_exit_2_in_one_line(scenario: Path, capsys, sets: list[str],
                                                             message: str) -> None:
    args = [a for kv in sets for a in ("--set", kv)]
    assert main(["run", str(scenario), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_kv_size_gives_one_ranks_cache_and_the_groups(capsys) -> None:
    assert main(["kv-size", "--model", "mixtral-8x7b", "--seq-len", "1000", "--hardware", "h100-80gb",
                 "--data-parallel", "4", "--json"]) == 0
    fits = json.loads(capsys.readouterr().out)["fits"]
    weights = MIXTRAL.weight_bytes() - 32 * 8 * _expert_bytes_by_hand() * 3 / 4
    blocks = math.floor((80 * GiB * 0.9 * 0.95 - weights) / (16 * 32 * 2 * 8 * 128 * 2))
    assert fits["kv_blocks"] == blocks and fits["kv_tokens"] == 16 * blocks
    assert fits["data_parallel"] == {"ranks": 4, "kv_blocks": 4 * blocks, "kv_tokens": 64 * blocks,
                                     "sequences": 4 * (blocks // 63)}   # (1,000 tokens: 63 blocks each)
    assert fits["hbm_budget"]["weights_bytes"] == round(weights)


@pytest.mark.parametrize("args, message", [
    (["--model", "llama-3.1-8b", "--hardware", "h100-80gb", "--data-parallel", "2"], "llama-3.1-8b is dense"),
    (["--model", "mixtral-8x7b", "--data-parallel", "2"], "needs --hardware"),
    (["--model", "mixtral-8x7b", "--hardware", "h100-80gb", "--data-parallel", "4", "--tensor-parallel", "4"],
     "16 GPUs span nodes"),
])
def test_kv_size_data_parallel_errors_exit_2(capsys, args: list[str], message: str) -> None:
    assert main(["kv-size", "--seq-len", "100", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_capacity_does_not_grow_a_data_parallel_engine_as_a_fleet(scenario: Path, capsys) -> None:
    assert main(["capacity", str(scenario), "--slo", "ttft_p90=0.1"]) == 2
    err = capsys.readouterr().err
    assert "--search: replicas: a data-parallel engine's replicas are its ranks" in err
    assert len(err.strip().splitlines()) == 1


def test_the_shipped_scenario_runs_eight_ranks_of_deepseek_v3() -> None:
    root = Path(__file__).resolve().parents[1]
    res = run_scenario(load_scenario(root / "scenarios" / "data_parallel.yaml", ["workload.limit=60"]))
    assert res.summary["num_finished"] == 60
    assert res.summary["cluster"]["replicas"] == 8 and res.summary["step_model"]["data_parallel"] == 8
    assert (res.steps.groupby("start_s")["duration_s"].nunique() == 1).all()


class _Rank:
    """A replica as a router sees it: ``waiting`` queued and ``running`` running requests."""

    def __init__(self, waiting: int, running: int) -> None:
        self.waiting, self._running, self.submitted = waiting, running, 0

    def load(self) -> int:
        return self.waiting + self._running

    def running(self) -> int:
        return self._running


def test_dp_balance_weighs_a_waiting_request_as_four_running_ones() -> None:
    from sim.cluster.config import RouterConfig
    from sim.cluster.routers import DataParallelBalance

    router = DataParallelBalance(RouterConfig(policy="dp_balance"), seed=0)
    # scores 4 x waiting + running: 0 x 4 + 7 = 7, 2 x 4 + 0 = 8, 1 x 4 + 2 = 6: the third, though the most loaded
    assert router.choose(None, [_Rank(0, 7), _Rank(2, 0), _Rank(1, 2)]) == 2
    assert router.choose(None, [_Rank(2, 0), _Rank(0, 7), _Rank(1, 3)]) == 1   # 8, then 7 and 7: the lower index
    # least_requests would take the least loaded (the first: 3 against 4)
    assert router.choose(None, [_Rank(1, 2), _Rank(0, 4)]) == 1


def test_dp_balance_spreads_a_burst_over_idle_ranks(scenario: Path) -> None:
    """Every request at t = 0 (inline, a burst of 8 over 4 idle ranks): each rank's first request makes it
    score 4, so the burst goes round the ranks: 0, 1, 2, 3, 0, 1, 2, 3."""
    reqs = [{"arrival": 0.0, "prompt_len": 100, "output_len": 10} for _ in range(8)]
    res = run_scenario(load_scenario(scenario, ["cluster.router.policy=dp_balance",
                                                f"workload={{requests: {reqs}}}"]))
    assert res.requests.sort_values("req_id")["replica"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]


def test_the_summary_says_what_stepping_together_cost(scenario: Path) -> None:
    """Two ranks, a prompt of 100 tokens on one and of 300 on the other at t = 0, two output tokens each: a
    step of the prompts (the first rank's 100 padded to 300), then one of a decode each. Token slots 2 x 300
    + 2 x 1 = 602, tokens 100 + 300 + 2 = 402: padding 200 / 602; no dummy pass."""
    reqs = [{"arrival": 0.0, "prompt_len": p, "output_len": 2} for p in (100, 300)]
    res = run_scenario(load_scenario(scenario, ["cluster.replicas=2", "cluster.router.policy=round_robin",
                                                f"workload={{requests: {reqs}}}"]))
    dp = res.summary["cluster"]["data_parallel"]
    assert dp["ranks"] == 2 and dp["group_steps"] == 2 and dp["dummy_rank_steps"] == 0
    assert dp["padding_share"] == pytest.approx(200 / 602, rel=1e-12)
    # the first rank waits for the second's longer prompt in the first step, in its overhead column
    steps = res.steps
    first = steps[steps["start_s"] == steps["start_s"].min()]
    assert 0 < dp["wait_share"] < 0.5
    assert first["duration_s"].nunique() == 1


def test_a_client_with_one_request_in_flight_sends_each_when_the_last_is_answered(scenario: Path) -> None:
    """A client of one slot in front of the group (no frontend, no pauses): each request is sent as the one
    before it finishes, whichever rank served it."""
    res = run_scenario(load_scenario(scenario, ["workload.max_concurrency=1", "workload.synthetic.num_requests=20"]))
    reqs = res.requests.sort_values("arrival_s")
    assert (reqs["status"] == "FINISHED").all() and reqs["replica"].nunique() > 1
    assert reqs["arrival_s"].to_numpy()[1:].tolist() == reqs["finish_s"].to_numpy()[:-1].tolist()


def test_dp_balance_reads_counts_at_most_100_ms_old(scenario: Path) -> None:
    """Two ranks. A (one output token, done within a few ms) at t = 0 goes to rank 0, which the balancer then
    counts as one waiting request; B at t = 0.05, within 100 ms of that reading, goes to rank 1 although rank 0
    is idle again (live counts would tie, and the tie goes to rank 0); C at t = 0.2 reads the counts anew: both
    idle, rank 0."""
    reqs = [{"arrival": t, "prompt_len": 10, "output_len": 1} for t in (0.0, 0.05, 0.2)]
    res = run_scenario(load_scenario(scenario, ["cluster.replicas=2", "cluster.router.policy=dp_balance",
                                                f"workload={{requests: {reqs}}}"]))
    done = res.requests.sort_values("req_id")
    assert done["finish_s"].iloc[0] < 0.05
    assert done["replica"].tolist() == [0, 1, 0]


PD = {"prefill": {"replicas": 2, "tensor_parallel": 2}, "decode": {"replicas": 4, "data_parallel": True},
      "kv_transfer": {"link": "nvlink"}, "router": {"policy": "least_requests"}}


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_a_decode_pool_of_data_parallel_ranks(scenario: Path, mode: str) -> None:
    """Prefill on 2 replicas of TP 2, decode on one data-parallel engine of 4 ranks: every request finishes,
    its prompt KV crosses the link once (the bytes sent are the prompts' KV), the decode ranks step together
    (their rows that start together last the same) and each sizes its cache for a quarter of the experts."""
    pd = {**PD, "kv_transfer": {"link": "nvlink", "mode": mode}}
    res = run_scenario(load_scenario(scenario, [f"cluster={pd}"]), check_integrity=True)
    s = res.summary
    assert s["num_finished"] == 120
    kv_token = 32 * 2 * 8 * 128 * 2   # Mixtral: 32 layers x K and V x 8 heads x 128 x fp16
    decoded = res.requests[res.requests["output_tokens"] > 1]
    assert s["cluster"]["transferred_kv_bytes"] == int(decoded["prompt_tokens"].sum()) * kv_token
    steps = res.steps[res.steps["replica"] >= 2]   # (replicas 0-1 prefill, 2-5 the decode ranks)
    assert (steps.groupby("start_s")["duration_s"].nunique() == 1).all()
    assert set(s["cluster"]["data_parallel"]) == {"decode"} and s["cluster"]["data_parallel"]["decode"]["ranks"] == 4
    rank_blocks = res.replicas.set_index("replica")["num_gpu_blocks"]
    weights = MIXTRAL.weight_bytes() - 32 * 8 * _expert_bytes_by_hand() * 3 / 4
    assert rank_blocks[2] == math.floor((80 * GiB * 0.9 * 0.95 - weights) / (16 * kv_token))


def test_a_data_parallel_pool_is_refused_where_the_group_cannot_be(scenario: Path, capsys) -> None:
    pd = {**PD, "decode": {"replicas": 3, "data_parallel": True}}   # 14,336 / 3 experts' columns
    assert main(["run", str(scenario), "--set", f"cluster={pd}"]) == 2
    err = capsys.readouterr().err
    assert "cluster.decode.replicas: the expert layers split each expert over the group's 3 GPUs" in err
    pd = {**PD, "decode": {"replicas": 4, "data_parallel": True}}
    assert main(["run", str(scenario), "--set", f"cluster={pd}", "--set", "model=llama-3.1-8b"]) == 2
    assert "cluster.decode.data_parallel: llama-3.1-8b is dense" in capsys.readouterr().err


def test_capacity_does_not_grow_a_data_parallel_pool_as_a_fleet(scenario: Path, capsys) -> None:
    assert main(["capacity", str(scenario), "--slo", "ttft_p90=0.1", "--set", f"cluster={PD}"]) == 2
    assert "--search: replicas: a data-parallel engine's replicas are its ranks" in capsys.readouterr().err


FLEET = ["cluster.replicas=4", "cluster.data_parallel_size=2"]   # two engines of two ranks each


def test_each_rank_of_a_fleet_holds_its_engines_share_of_the_experts(scenario: Path) -> None:
    """Four ranks as two engines of two: each rank holds half of every expert (not a quarter, as one engine
    of the four would)."""
    usable = 80 * GiB * 0.9
    block = 16 * 32 * 2 * 8 * 128 * 2
    for sets, share in ((FLEET, 1 / 2), (["cluster.replicas=4"], 1 / 4)):
        weights = MIXTRAL.weight_bytes() - 32 * 8 * _expert_bytes_by_hand() * (1 - share)
        assert gpu_blocks(load_scenario(scenario, sets)) == math.floor((usable * 0.95 - weights) / block)


def test_the_engines_of_a_fleet_step_on_their_own(scenario: Path) -> None:
    """Round-robin over the two engines, each engine's balancer over its two ranks (``test_a_fleet_routes_
    to_an_engine_then_to_its_rank``: requests 0-3 to replicas 0, 2, 1, 3), prompts of 100 and 300 tokens to
    engine 0's ranks and of 50 and 50 to engine 1's at t = 0, two output tokens each: each engine steps
    twice, its ranks together and padded to its own largest batch only. Token slots 2 x 300 + 2 (engine 0)
    + 2 x 50 + 2 (engine 1) = 704, tokens 402 + 102: padding 200 / 704."""
    reqs = [{"arrival": 0.0, "prompt_len": p, "output_len": 2} for p in (100, 50, 300, 50)]
    res = run_scenario(load_scenario(scenario, [*FLEET, "cluster.router.policy=round_robin",
                                                f"workload={{requests: {reqs}}}"]), check_integrity=True)
    dp = res.summary["cluster"]["data_parallel"]
    assert (dp["engines"], dp["ranks"], dp["group_steps"], dp["dummy_rank_steps"]) == (2, 2, 4, 0)
    assert dp["padding_share"] == pytest.approx(200 / 704, rel=1e-12)
    steps = res.steps
    assert sorted(steps["replica"].unique()) == [0, 1, 2, 3] and len(steps) == 8
    assert res.replicas["engine"].tolist() == [0, 0, 1, 1]
    first = steps[steps["start_s"] == 0.0].set_index("replica")["duration_s"]
    assert first[0] == first[1] and first[2] == first[3]       # ranks of an engine last the same
    assert first[2] < first[0]                                 # engine 1's 50-token prompts: a shorter pass
    # engine 1 takes its second step when its own first ends, not when engine 0's does
    second = steps[steps["start_s"] > 0].groupby(steps["replica"] // 2)["start_s"].min()
    assert second[1] == pytest.approx(first[2], abs=1e-12) and second[0] == pytest.approx(first[0], abs=1e-12)
    assert res.summary["num_finished"] == 4


def test_capacity_adds_whole_engines(scenario: Path, capsys) -> None:
    """--search replicas over engines of two ranks: every candidate a whole number of engines; the answer's
    engines meet the SLOs in a plain run and one engine fewer does not."""
    slos = {"ttft_p90": 0.08, "tpot_p90": 0.02}
    assert main(["capacity", str(scenario), "--set", "cluster.data_parallel_size=2", "--workers", "2", "--json",
                 *[a for name, v in slos.items() for a in ("--slo", f"{name}={v}")]]) == 0
    answer = json.loads(capsys.readouterr().out)
    n = answer["engines"]
    assert answer["replicas"] == 2 * n and n >= 2
    assert all(c["replicas"] == 2 * c["engines"] for c in answer["candidates"])

    def figures(engines: int) -> dict[str, float]:
        reqs = run_scenario(load_scenario(scenario, [f"cluster.replicas={2 * engines}", "cluster.data_parallel_size=2"]),
                            check_integrity=False).requests
        done = reqs[reqs["status"] == "FINISHED"]
        return {"ttft_p90": float(np.percentile(done["ttft_s"], 90)), "tpot_p90": float(np.percentile(done["tpot_s"], 90))}

    assert all(v <= slos[k] for k, v in figures(n).items())
    assert any(v > slos[k] for k, v in figures(n - 1).items())


def test_a_decode_pool_of_two_data_parallel_engines(scenario: Path) -> None:
    """The decode pool's four ranks as two engines of two: every request finishes, each engine's ranks step
    together on their own (rows of an engine that start together last the same; the two engines' steps
    do not all start together), each rank caches beside half of the experts."""
    pd = {**PD, "decode": {"replicas": 4, "data_parallel": True, "data_parallel_size": 2}}
    res = run_scenario(load_scenario(scenario, [f"cluster={pd}"]), check_integrity=True)
    s = res.summary
    assert s["num_finished"] == 120
    dp = s["cluster"]["data_parallel"]["decode"]
    assert (dp["engines"], dp["ranks"]) == (2, 2)
    assert res.replicas["engine"].tolist() == [-1, -1, 0, 0, 1, 1]   # (the prefill pool's plain replicas: -1)
    steps = res.steps[res.steps["replica"] >= 2]   # (replicas 0-1 prefill; 2-3 engine 0, 4-5 engine 1)
    engine = steps["replica"] // 2
    assert (steps.groupby([engine, "start_s"])["duration_s"].nunique() == 1).all()
    assert set(steps.loc[engine == 1, "start_s"]) != set(steps.loc[engine == 2, "start_s"])
    assert dp["group_steps"] == sum(steps.loc[engine == e, "start_s"].nunique() for e in (1, 2))
    kv_token = 32 * 2 * 8 * 128 * 2
    weights = MIXTRAL.weight_bytes() - 32 * 8 * _expert_bytes_by_hand() / 2
    blocks = res.replicas.set_index("replica")["num_gpu_blocks"]
    assert (blocks[2:] == math.floor((80 * GiB * 0.9 * 0.95 - weights) / (16 * kv_token))).all()


@pytest.mark.parametrize("decode, message", [
    ({"replicas": 4, "data_parallel_size": 2}, "give it with data_parallel: true"),
    ({"replicas": 6, "data_parallel": True, "data_parallel_size": 4}, "6 replicas do not split into engines of 4"),
    ({"replicas": 6, "data_parallel": True, "data_parallel_size": 3},
     "cluster.decode.data_parallel_size: the expert layers split each expert over the group's 3 GPUs"),
])
def test_a_pools_engines_are_checked(scenario: Path, capsys, decode: dict, message: str) -> None:
    assert main(["run", str(scenario), "--set", f"cluster={ {**PD, 'decode': decode} }"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_capacity_max_below_one_engine_exits_2(scenario: Path, capsys) -> None:
    assert main(["capacity", str(scenario), "--set", "cluster.data_parallel_size=2", "--slo", "ttft_p90=0.1",
                 "--max", "1"]) == 2
    err = capsys.readouterr().err
    assert "--max: 1 replicas hold no whole data-parallel engine of 2 ranks" in err and len(err.strip().splitlines()) == 1


def test_a_fleet_routes_to_an_engine_then_to_its_rank(scenario: Path) -> None:
    """Two engines of two ranks behind round_robin, four requests at t = 0: the gateway alternates engines
    (0, 1, 0, 1); each engine's balancer reads its ranks' counts once (all idle) and counts what it sends as
    waiting: its first request to its rank 0, its second to its rank 1. Replicas 0, 2, 1, 3, where round-robin
    over the ranks themselves would give 0, 1, 2, 3."""
    reqs = [{"arrival": 0.0, "prompt_len": 40, "output_len": 3} for _ in range(4)]
    res = run_scenario(load_scenario(scenario, [*FLEET, "cluster.router.policy=round_robin",
                                                f"workload={{requests: {reqs}}}"]))
    assert res.requests.sort_values("req_id")["replica"].tolist() == [0, 2, 1, 3]


def test_an_engine_reads_as_the_sum_of_its_ranks() -> None:
    """``EngineView``: load, running and submissions summed over its ranks, KV usage their mean, the cached
    prefix the longest any rank holds."""
    from sim.cluster.engine_fleet import EngineView

    class Rank:
        def __init__(self, load: int, running: int, usage: float, cached: int, submitted: int) -> None:
            self._load, self._running, self._usage, self._cached = load, running, usage, cached
            self.submitted, self.block_size = submitted, 16

        def load(self) -> int:
            return self._load

        def running(self) -> int:
            return self._running

        def kv_usage(self) -> float:
            return self._usage

        def cached_prefix_blocks(self, req, hashes) -> int:
            return self._cached

        def has_prefix_cache(self) -> bool:
            return self._cached > 0

    view = EngineView([Rank(3, 2, 0.5, 0, 7), Rank(5, 1, 0.25, 4, 9)])
    assert (view.load(), view.running(), view.submitted, view.kv_usage()) == (8, 3, 16, 0.375)
    assert view.cached_prefix_blocks(None, []) == 4 and view.has_prefix_cache() and view.block_size == 16
