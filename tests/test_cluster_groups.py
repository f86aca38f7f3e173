"""A mixed colocated fleet (``cluster.groups``): replicas of several hardware or settings behind one router.

Checked against independent references: one group is the homogeneous fleet bit for bit; under round-robin
(choices fixed ahead) every replica serves exactly what a single engine of its group's settings serves when
given the same requests; GPU counts by hand; the compiled core against the SimPy loop.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from result_compare import off_and_on

from sim import engine_core
from sim.cli import main
from sim.cluster.layouts import gpus_of
from sim.errors import KvsimError
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import load_scenario, scenario_from_dict

BASE = {
    "name": "mixed", "seed": 3, "model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
    "kv_cache": {"block_size": 16, "num_gpu_blocks": 120},
    "workload": {"synthetic": {"num_requests": 48, "arrival": {"process": "poisson", "rate": 40.0},
                               "prompt_len": {"dist": "uniform", "min": 20, "max": 300},
                               "output_len": {"dist": "uniform", "min": 1, "max": 60}}},
}


def _fleet(groups: list[dict] | None = None, policy: str = "round_robin", **cluster) -> dict:
    data = copy.deepcopy(BASE)
    data["cluster"] = {"router": {"policy": policy}, **cluster}
    if groups is not None:
        data["cluster"]["groups"] = groups
    return data


def _core_as_loop(monkeypatch, data: dict):
    """The run of ``data`` in the compiled core (where it is built) after checking that it gives the SimPy
    loop's requests, steps and replicas tables bit for bit."""
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert core.profile["compiled_core"] == (native is not None) and not loop.profile["compiled_core"]
    for table in ("requests", "steps", "replicas"):
        pd.testing.assert_frame_equal(getattr(loop, table), getattr(core, table), check_exact=True)
    return core


MIXED = [{"replicas": 1, "hardware": "h100-80gb"}, {"replicas": 2, "hardware": "a100-80gb"}]


def test_one_group_is_the_fleet_of_its_replicas():
    one = run_scenario(scenario_from_dict(_fleet([{"replicas": 3}], policy="least_requests")))
    plain = run_scenario(scenario_from_dict(_fleet(policy="least_requests", replicas=3)))
    pd.testing.assert_frame_equal(one.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(one.steps, plain.steps, check_exact=True)
    pd.testing.assert_frame_equal(one.replicas.drop(columns="group"), plain.replicas, check_exact=True)
    assert list(one.replicas["group"]) == [0, 0, 0] and "group" not in plain.replicas
    strip = lambda s: {k: v for k, v in s.items() if k not in ("wall_time_s", "cluster")}   # noqa: E731
    assert strip(one.summary) == strip(plain.summary)
    assert one.summary["cluster"]["groups"][0]["requests"] == 48


def test_round_robin_replicas_serve_as_single_engines_of_their_group():
    """Round-robin's choices do not depend on the replicas, so replica i serves requests i, i + 3, ...; a
    single engine on replica i's hardware given exactly those requests (same arrivals and lengths) must
    produce the same first-token and finish times for each: to the last bit but one (since the frontend's
    fitted input latency became 4.427 ms, two of the H100 replica's requests reach the single engine's
    first step one ulp, 1e-17 s, before the cluster's: the request table's arrival plus that latency rounds
    differently on the two paths; every later time keeps that ulp)."""
    res = run_scenario(scenario_from_dict(_fleet(MIXED)))
    reqs = res.requests.sort_values("arrival_s", kind="stable")
    assert list(res.replicas["hardware"]) == ["h100-80gb", "a100-80gb", "a100-80gb"]
    for replica, hardware in enumerate(["h100-80gb", "a100-80gb", "a100-80gb"]):
        mine = reqs[reqs["replica"] == replica]
        assert len(mine) == 16
        single = copy.deepcopy(BASE)
        single["hardware"] = hardware
        single["workload"] = {"requests": [{"arrival": float(a), "prompt_len": int(p), "output_len": int(o)}
                                           for a, p, o in zip(mine["arrival_s"], mine["prompt_tokens"],
                                                              mine["output_tokens"])]}
        alone = run_scenario(scenario_from_dict(single)).requests.sort_values("arrival_s", kind="stable")
        for col in ("first_token_s", "finish_s", "ttft_s", "e2e_s"):
            np.testing.assert_allclose(mine[col].to_numpy(), alone[col].to_numpy(), rtol=0, atol=1e-15,
                                       err_msg=col)


def test_the_summary_describes_each_group_from_the_request_table():
    res = run_scenario(scenario_from_dict(_fleet(MIXED, policy="least_requests")))
    groups = res.summary["cluster"]["groups"]
    group_of = dict(zip(res.replicas["replica"], res.replicas["group"]))
    reqs = res.requests.assign(group=res.requests["replica"].map(group_of))
    assert [(g["group"], g["replicas"], g["hardware"], g["tensor_parallel"]) for g in groups] == [
        (0, 1, "h100-80gb", 1), (1, 2, "a100-80gb", 1)]
    for g in groups:
        own = reqs[reqs["group"] == g["group"]]
        assert g["requests"] == len(own) == g["finished"]
        assert math.isclose(g["ttft_s_mean"], own["ttft_s"].mean(), rel_tol=1e-12)
        assert math.isclose(g["e2e_s_mean"], own["e2e_s"].mean(), rel_tol=1e-12)
    assert sum(g["requests"] for g in groups) == 48
    assert set(res.summary["step_model"]) == {"group 0", "group 1"}
    assert res.summary["step_model"]["group 0"]["calibration"] == "h100-80gb"


def test_a_fleet_sized_from_hbm_reports_each_groups_budget():
    data = _fleet([{"replicas": 1, "hardware": "h100-80gb"}, {"replicas": 1, "hardware": "a100-40gb"}])
    data["model"] = "llama-2-7b"
    del data["kv_cache"]["num_gpu_blocks"]
    res = run_scenario(scenario_from_dict(data))
    budgets = res.summary["cluster"]["hbm_budget_per_replica"]
    assert set(budgets) == {"group 0", "group 1"}
    assert budgets["group 0"]["hbm_bytes"] == 80 * 2**30 and budgets["group 1"]["hbm_bytes"] == 40 * 2**30
    blocks = dict(zip(res.replicas["hardware"], res.replicas["num_gpu_blocks"]))
    assert blocks["h100-80gb"] > 2 * blocks["a100-40gb"]   # the same weights in half the memory


def test_gpus_of_a_mixed_fleet_by_hand():
    scn = scenario_from_dict(_fleet([{"replicas": 2, "hardware": "h100-80gb"},
                                     {"replicas": 3, "hardware": "a100-80gb", "tensor_parallel": 2}]))
    assert gpus_of(scn) == (8, {"h100-80gb": 2, "a100-80gb": 6})


@pytest.mark.skipif(native is None, reason="sim._native is not built")
def test_the_core_runs_groups_that_admit_alike_as_the_loop_does(monkeypatch):
    """Both groups have 120 blocks, so they cap and reject requests alike: the compiled core covers them."""
    data = _fleet(MIXED, policy="least_kv")
    loop, core = off_and_on(monkeypatch, engine_core, "enabled", lambda: run_scenario(scenario_from_dict(data)))
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]
    pd.testing.assert_frame_equal(loop.requests, core.requests, check_exact=True)
    pd.testing.assert_frame_equal(loop.steps, core.steps, check_exact=True)
    pd.testing.assert_frame_equal(loop.replicas, core.replicas, check_exact=True)


@pytest.mark.skipif(native is None, reason="sim._native is not built")
@pytest.mark.parametrize("policy", ["least_kv", "least_requests", "prefix_affinity", "power_of_two"])
def test_caches_of_other_sizes_that_hold_every_request_run_in_the_core(monkeypatch, policy):
    """120 blocks beside 60 (every request needs at most 23): no block count decides an admission, so the
    core runs the fleet, least_kv comparing each replica's share of blocks in use as Replica.kv_usage does."""
    data = _fleet([{"replicas": 1}, {"replicas": 2, "hardware": "h100-80gb", "kv_cache": {"num_gpu_blocks": 60}}],
                  policy=policy)
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]
    assert list(core.replicas["num_gpu_blocks"]) == [120, 60, 60] and core.summary["num_finished"] == 48
    pd.testing.assert_frame_equal(loop.requests, core.requests, check_exact=True)
    pd.testing.assert_frame_equal(loop.steps, core.steps, check_exact=True)
    pd.testing.assert_frame_equal(loop.replicas, core.replicas, check_exact=True)


@pytest.mark.parametrize("policy", ["round_robin", "least_kv", "least_requests"])
def test_a_request_too_large_for_one_group_is_rejected_there_only(monkeypatch, policy):
    """Group 1 holds 8 blocks (128 tokens): a request routed there with more KV than that is rejected with
    its reason; on group 0 (120 blocks) every request fits. The compiled core gives each engine its own
    admission: the same results as the SimPy loop, bit for bit."""
    data = _fleet([{"replicas": 1}, {"replicas": 1, "kv_cache": {"num_gpu_blocks": 8}}], policy=policy)
    res = _core_as_loop(monkeypatch, data)
    reqs = res.requests
    need = -(-(reqs["prompt_tokens"] + reqs["output_tokens"] - 1) // 16)   # (as served: none is capped)
    rejected = reqs["status"] == "REJECTED"
    assert (rejected == ((reqs["replica"] == 1) & (need > 8))).all() and rejected.any()
    assert list(reqs.loc[rejected, "reject_reason"]) == [f"needs {n} KV blocks, the cache has 8" for n in need[rejected]]
    assert (reqs.loc[~rejected, "reject_reason"].fillna("") == "").all()


@pytest.mark.parametrize("policy", ["round_robin", "least_requests"])
def test_groups_with_limits_of_their_own_run_in_the_core_as_in_the_loop(monkeypatch, policy):
    """Group 1 prefills whole prompts of at most 128 tokens (no chunking) in 60 blocks: a longer prompt routed
    there is rejected for its budget, by that engine's own admission; the same results as the SimPy loop."""
    data = _fleet([{"replicas": 1}, {"replicas": 2, "kv_cache": {"num_gpu_blocks": 60},
                                     "scheduler": {"max_num_batched_tokens": 128, "chunked_prefill": False}}],
                  policy=policy)
    core = _core_as_loop(monkeypatch, data)
    reqs = core.requests
    rejected = reqs["status"] == "REJECTED"
    assert (rejected == ((reqs["replica"] > 0) & (reqs["prompt_tokens"] > 128))).all() and rejected.any()
    assert list(reqs.loc[rejected, "reject_reason"]) == [
        f"prompt of {p} tokens exceeds max_num_batched_tokens 128 without chunked prefill"
        for p in reqs.loc[rejected, "prompt_tokens"]]


def test_a_request_group_0_would_refuse_and_its_own_group_aborted_keeps_its_timeouts_reason(monkeypatch):
    """Group 0 holds 8 blocks, group 1 120: a long request routed to group 1 is taken there (group 0 would
    refuse it) and its client gives up after 20 ms, while it runs: its reason is the timeout's, in the core as in the
    loop (the core first wrote the refusals' reasons over it)."""
    data = _fleet([{"replicas": 1, "kv_cache": {"num_gpu_blocks": 8}}, {"replicas": 1}])
    data["workload"]["timeout_s"] = 0.02
    core = _core_as_loop(monkeypatch, data)
    reqs = core.requests
    need = -(-(reqs["prompt_tokens"] + reqs["output_tokens"] - 1) // 16)
    taken = (reqs["replica"] == 1) & (need > 8) & (reqs["status"] == "ABORTED")
    assert taken.any() and reqs.loc[taken, "reject_reason"].str.startswith("client timeout after 0.02 s").all()


@pytest.mark.parametrize("cluster, message", [
    ({"replicas": 2, "groups": [{"replicas": 1}]}, "not replicas with groups"),
    ({"groups": []}, "groups"),
    ({"groups": [{"replicas": 0}]}, "replicas"),
    ({"groups": [{"replicas": 1, "colour": "red"}]}, "colour"),
    ({"groups": [{"replicas": 1}], "kv_transfer": {"link": "nvlink"}}, "kv_transfer applies to prefill and decode"),
    ({"groups": [{"replicas": 1}, {"replicas": 1, "tensor_parallel": 3}]},
     "cluster.groups.1.tensor_parallel: 3 does not divide"),
    ({"groups": [{"replicas": 1}, {"replicas": 1, "scheduler": {"batching": "static", "policy": "round_robin"}}]},
     "cluster.groups.1.scheduler.policy: round_robin needs scheduler.batching: continuous"),
])
def test_bad_groups_are_one_line_errors_naming_the_key(cluster, message):
    data = copy.deepcopy(BASE)
    data["cluster"] = cluster
    with pytest.raises(KvsimError) as e:
        scenario_from_dict(data)
    assert message in e.value.one_line()


def test_a_group_is_set_by_its_position(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(_fleet(MIXED)))
    scn = load_scenario(path, ["cluster.groups.1.replicas=4", "cluster.groups.0.hardware.tensor_parallel=2"])
    assert [g.replicas for g in scn.cluster.groups] == [1, 4]
    assert gpus_of(scn) == (6, {"h100-80gb": 2, "a100-80gb": 4})
    with pytest.raises(KvsimError, match=r"cluster\.groups\.2\.replicas: 2 is not an item of its list \(0 \.\. 1\)"):
        load_scenario(path, ["cluster.groups.2.replicas=1"])
    assert yaml.safe_load(path.read_text())["cluster"]["groups"][1]["replicas"] == 2   # (the file as it was)


def test_cli_runs_a_mixed_fleet_and_refuses_a_replicas_search_without_a_group(tmp_path, capsys):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(_fleet(MIXED)))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "groups of the fleet" in out and "h100-80gb" in out
    table = pd.read_csv(tmp_path / "out" / "replicas.csv")
    assert list(table["group"]) == [0, 1, 1] and list(table["hardware"]) == ["h100-80gb", "a100-80gb", "a100-80gb"]
    assert main(["capacity", str(path), "--slo", "ttft_p90=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster.groups: a mixed fleet has no one replica count to search" in err[0]


def test_capacity_grows_one_group_of_a_mixed_fleet(tmp_path, capsys):
    """--group 1: the fewest replicas of group 1 (group 0 kept) meeting the SLO; checked by running the
    answer N and N - 1 directly and reading TTFT p90 off their request tables."""
    data = _fleet([{"replicas": 1, "hardware": "h100-80gb"}, {"replicas": 1, "hardware": "a100-80gb"}],
                  policy="least_requests")
    data["model"] = "llama-2-7b"
    data["workload"]["synthetic"].update(num_requests=300, arrival={"process": "poisson", "rate": 100.0})
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(data))
    bound = 0.052
    assert main(["capacity", str(path), "--group", "1", "--slo", f"ttft_p90={bound}", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    n = answer["replicas"]
    assert answer["group"] == 1 and n > 1

    def ttft_p90(replicas: int) -> float:
        res = run_scenario(load_scenario(path, [f"cluster.groups.1.replicas={replicas}"]))
        done = res.requests[res.requests["status"] == "FINISHED"]
        return float(np.percentile(done["ttft_s"], 90))

    assert ttft_p90(n) <= bound < ttft_p90(n - 1)
    scn = load_scenario(path, [f"cluster.groups.1.replicas={n}"])
    assert gpus_of(scn) == gpus_of(load_scenario(path), answer) == (1 + n, {"h100-80gb": 1, "a100-80gb": n})


@pytest.mark.parametrize("args, message", [
    (["--group", "2"], "--group: the fleet has groups 0 .. 1, not 2"),
    (["--group", "0", "--search", "rate"], "--group: grows one group of a mixed fleet"),
    ([], "cluster.groups: a mixed fleet has no one replica count to search; give --group I"),
])
def test_bad_group_searches_exit_2_in_one_line(tmp_path, capsys, args, message):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(_fleet(MIXED)))
    assert main(["capacity", str(path), "--slo", "ttft_p90=1", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_the_report_shows_the_groups_and_replicas_as_tables(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(_fleet(MIXED)))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    groups = page.split("<h2>Groups of the fleet</h2>")[1].split("</table>")[0]
    replicas = page.split("<h2>Replicas</h2>")[1].split("</table>")[0]
    assert groups.count("<tr>") == 1 + 2 and replicas.count("<tr>") == 1 + 3   # header + a row each
    assert "<td class=\"n\">h100-80gb</td>" in groups and "cluster.groups" not in page


def test_figures_name_each_replicas_hardware_in_a_mixed_fleet():
    from sim.cluster.output import replica_labels

    mixed = pd.DataFrame({"replica": [0, 1, 2], "group": [0, 1, 1], "hardware": ["h100-80gb", "a100-80gb", "a100-80gb"],
                          "tensor_parallel": [2, 1, 1]})
    assert replica_labels(mixed) == {0: "replica 0 (h100-80gb TP 2)", 1: "replica 1 (a100-80gb)",
                                     2: "replica 2 (a100-80gb)"}
    assert replica_labels(mixed.drop(columns="group")) == {0: "replica 0", 1: "replica 1", 2: "replica 2"}


def test_a_group_whose_gpus_cannot_hold_the_weights_is_named(tmp_path, capsys):
    data = _fleet([{"replicas": 1}, {"replicas": 1, "hardware": "a100-40gb"}])
    data["model"] = "llama-2-70b"
    del data["kv_cache"]["num_gpu_blocks"]
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump({**data, "hardware": {"name": "a100-80gb", "tensor_parallel": 4}}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # (line 4: the second group's, found after loading as loading finds its own)
    assert len(err) == 1 and f"{path}:4: cluster.groups.1: model weights" in err[0] and "a100-40gb" in err[0], err
    assert not (tmp_path / "out").exists()


def test_layouts_of_a_group_name_its_replicas_in_the_answer(tmp_path, capsys):
    """--vary with --group: each layout grows group 1; the line naming the best counts every group's GPUs."""
    data = _fleet([{"replicas": 1, "hardware": "h100-80gb"}, {"replicas": 1, "hardware": "a100-80gb"}])
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["capacity", str(path), "--group", "1", "--slo", "ttft_p90=10", "--vary",
                 "cluster.groups.1.hardware=a100-80gb,h100-80gb", "--gpu-cost", "h100-80gb=4",
                 "--gpu-cost", "a100-80gb=2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # a loose SLO: one replica of group 1 meets it either way, the A100 beside the H100 is the cheaper fleet
    assert last.endswith("hardware=a100-80gb (6 an hour, 2 GPUs, group 1 at 1 replica)"), last


def test_a_bad_group_item_set_on_the_command_line_is_named_as_from_set(tmp_path, capsys):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(_fleet(MIXED)))
    assert main(["run", str(path), "--set", "cluster.groups.0.replicas=0", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {path}: cluster.groups.0.replicas: Input should be greater than or equal to 1 (from --set)"]
