"""kvsim compare: the cross product of --vary values, the table, compare.csv and the overlaid plots."""

from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.commands.compare import combinations, label_of, parse_vary
from sim.errors import KvsimError
from sim.output import flatten

SEED = str(Path(__file__).resolve().parent.parent / "scenarios" / "seed_four_requests.yaml")


def test_vary_parsing_and_cross_product():
    vary = parse_vary(["scheduler.batching=static,continuous", "kv_cache.block_size=8, 16"])
    assert vary == [("scheduler.batching", ["static", "continuous"]), ("kv_cache.block_size", ["8", "16"])]
    combos = combinations(vary)
    assert len(combos) == 4
    assert label_of(combos[1]) == "batching=static, block_size=16"
    assert flatten({"a": 1, "b": {"c": 2}}) == {"a": 1, "b.c": 2}
    for bad in ([], ["novalue"], ["a=1,,2"], ["a=1", "a=2"]):
        with pytest.raises(KvsimError):
            parse_vary(bad)


def test_compare_writes_table_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", SEED, "--vary", "scheduler.batching=static,continuous", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "batching=static" in printed and "batching=continuous" in printed
    df = pd.read_csv(out / "compare.csv")
    assert df["run"].tolist() == ["batching=static", "batching=continuous"]
    assert df["scheduler.batching"].tolist() == ["static", "continuous"]
    assert (df["num_finished"] == 7).all()
    assert {"ttft_s.p50", "memory_breakdown.token_states", "swap_time_s"} <= set(df.columns)
    for name in ("latency_cdf.png", "kv_usage.png", "memory_breakdown.png", "timeline.png", "throughput_latency.png"):
        assert (out / name).stat().st_size > 1000
    assert [p.name for p in out.glob(".*")] == [".kvsim-results"]   # the folder's marker, no staging leftovers
    assert [p.name for p in tmp_path.iterdir()] == ["cmp"]


def test_compare_bad_key_is_one_line_exit_2(tmp_path, capsys):
    rc = main(["compare", SEED, "--vary", "scheduler.batchin=static,continuous"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "batchin" in err[0]


def test_compare_json_is_one_object_a_run_and_nothing_else(capsys):
    import json

    rc = main(["compare", SEED, "--vary", "scheduler.batching=static,continuous", "--json"])
    assert rc == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in runs] == ["batching=static", "batching=continuous"]
    assert [r["varied"] for r in runs] == [{"scheduler.batching": "static"}, {"scheduler.batching": "continuous"}]
    # the seed's four requests plus three more (scenarios/seed_four_requests.yaml): all finish either way
    assert [r["summary"]["num_finished"] for r in runs] == [7, 7]


def test_compare_shows_the_client_wait_where_a_run_has_a_client(tmp_path, capsys):
    # a burst of 40 requests, no cap and 2 slots: the capped run's mean client wait is its mean send time (every
    # request planned at 0), the uncapped run has none; runs without a client show no such column
    gateway = str(Path(__file__).resolve().parents[1] / "scenarios" / "gateway_cap.yaml")
    out = tmp_path / "cmp"
    rc = main(["compare", gateway, "--vary", "workload.max_concurrency=null,2", "--out", str(out), "--no-plots",
               "--set", "workload.synthetic.num_requests=40", "--set", "workload.synthetic.arrival={process: burst}"])
    assert rc == 0
    assert "client wait" in capsys.readouterr().out
    df = pd.read_csv(out / "compare.csv").set_index("run")
    assert pd.isna(df.loc["max_concurrency=null", "client_wait_s.mean"])
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    sends = run_scenario(load_scenario(gateway, ["workload.synthetic.num_requests=40", "workload.max_concurrency=2",
                                                 "workload.synthetic.arrival={process: burst}"])).requests["arrival_s"]
    assert df.loc["max_concurrency=2", "client_wait_s.mean"] == pytest.approx(sends.mean(), rel=1e-9)
    assert df.loc["max_concurrency=2", "client_wait_s.mean"] > 1.0
    main(["compare", SEED, "--vary", "scheduler.batching=static,continuous", "--no-plots"])
    assert "client wait" not in capsys.readouterr().out


def test_workers_give_the_same_runs_in_the_same_order(tmp_path, capsys):
    tables = {}
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        rc = main(["compare", SEED, "--vary", "scheduler.batching=static,continuous", "--vary",
                   "kv_cache.block_size=8,16", "--workers", workers, "--out", str(out), "--no-plots"])
        assert rc == 0
        tables[workers] = pd.read_csv(out / "compare.csv").drop(columns=["wall_time_s"])
    capsys.readouterr()
    assert tables["2"]["run"].tolist() == ["batching=static, block_size=8", "batching=static, block_size=16",
                                           "batching=continuous, block_size=8", "batching=continuous, block_size=16"]
    pd.testing.assert_frame_equal(tables["1"], tables["2"])


@pytest.mark.parametrize("workers", ["0", "-2", "5000"])
def test_bad_workers_is_one_line_exit_2(capsys, workers):
    rc = main(["compare", SEED, "--vary", "scheduler.batching=static,continuous", "--workers", workers])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --workers")


def test_the_throughput_latency_figure_has_each_run_in_order_and_skips_a_run_without_values():
    from sim.plots import throughput_latency_figure

    summaries = {"a": {"output_throughput_tok_s": 100.0, "ttft_s": {"p50": 0.03}, "tpot_s": {"mean": 0.006}},
                 "b": {"output_throughput_tok_s": 400.0, "ttft_s": {"p50": 0.05}, "tpot_s": {"mean": 0.009}},
                 "none finished": {"output_throughput_tok_s": 0.0, "ttft_s": {"p50": float("nan")},
                                   "tpot_s": {"mean": float("nan")}},
                 "c": {"output_throughput_tok_s": 500.0, "ttft_s": {"p50": 2.5}, "tpot_s": {"mean": 0.04}}}
    fig = throughput_latency_figure(summaries)
    ttft, tpot = (ax.lines[0] for ax in fig.axes)
    assert list(ttft.get_xdata()) == [100.0, 400.0, 500.0] == list(tpot.get_xdata())
    assert list(ttft.get_ydata()) == pytest.approx([30.0, 50.0, 2500.0])   # milliseconds
    assert list(tpot.get_ydata()) == pytest.approx([6.0, 9.0, 40.0])
    assert fig.axes[0].get_yscale() == "log" and fig.axes[1].get_yscale() == "linear"   # (2.5 s / 30 ms > 20)
    assert [t.get_text() for t in fig.axes[0].texts] == ["a", "b", "c"]
