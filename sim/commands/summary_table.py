"""A readable summary table (rich) for the terminal."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

LATENCIES = ["ttft_s", "tpot_s", "itl_s", "e2e_s", "normalized_latency_s_per_tok", "client_wait_s"]   # (the last: with a client)
# shown only when something was shared (summary.json always has them)
SHARING = ["kv_bytes_unshared_peak", "kv_sharing_saving", "prefix_kv_bytes_peak", "prefix_kv_bytes_unshared_peak",
           "prefix_cache_evictions"]


def _fmt(v) -> str:
    if isinstance(v, dict):   # e.g. step_model: "executor cost_model, calibration h100-80gb, engine_terms True"
        return ", ".join(f"{k} {_fmt(x)}" if not isinstance(x, dict) else f"{k}: ({_fmt(x)})" for k, x in v.items())
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.4g}"
    return str(v)


def print_summary(summary: dict, title: str = "summary") -> None:
    console = Console()
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    shared = any(summary.get(k) for k in ("kv_sharing_saving", "prefix_kv_bytes_peak", "prefix_cache_evictions"))
    for k, v in summary.items():
        if k in LATENCIES or k in ("memory_breakdown", "slo", "hbm_budget") or (k in SHARING and not shared):
            continue
        if k == "cluster":   # (its replicas' memory and a mixed fleet's groups get tables of their own, below)
            v = {kk: vv for kk, vv in v.items() if kk not in ("hbm_budget_per_replica", "groups")}
        t.add_row(k, _fmt(v))
    console.print(t)
    groups = summary.get("cluster", {}).get("groups")
    if groups:   # a mixed colocated fleet (cluster.groups)
        gt = Table(title="groups of the fleet", header_style="bold")
        short = {"tensor_parallel": "TP", "ttft_s_mean": "TTFT mean (s)", "e2e_s_mean": "E2E mean (s)"}
        for name in groups[0]:
            gt.add_column(short.get(name, name), justify="left" if name == "hardware" else "right",
                          no_wrap=name == "hardware")
        for row in groups:
            gt.add_row(*(_fmt(x) for x in row.values()))
        console.print(gt)
    lat = Table(title="latency (s)", header_style="bold")
    lat.add_column("metric")
    for q in ("mean", "p50", "p90", "p99"):
        lat.add_column(q, justify="right")
    for k in LATENCIES:
        if k in summary:
            lat.add_row(k, *(_fmt(summary[k][q]) for q in ("mean", "p50", "p90", "p99")))
    console.print(lat)
    mb = Table(title="KV memory breakdown (fraction of capacity, time-weighted)", header_style="bold")
    for k in summary["memory_breakdown"]:
        mb.add_column(k, justify="right")
    mb.add_row(*(f"{v:.3f}" for v in summary["memory_breakdown"].values()))
    console.print(mb)
    budgets = ({"": summary["hbm_budget"]} if "hbm_budget" in summary   # the cache sized from HBM (sim.specs)
               else summary.get("cluster", {}).get("hbm_budget_per_replica", {}))
    if budgets:
        gpus = ", ".join(sorted({str(b["gpus"]) for b in budgets.values()}))
        title = "of the" if "" in budgets else "of one replica, a"
        hbm = Table(title=f"GPU memory {title} {gpus}-GPU group (GB)", header_style="bold")
        parts = ("weights", "activation_reserve", "kv_cache", "unused")
        if "" not in budgets:
            hbm.add_column("replica")
        for k in parts:
            hbm.add_column(k, justify="right")
        hbm.add_column("total", justify="right")
        for role, b in budgets.items():
            cells = [f"{b[k + '_bytes'] / 1e9:.2f}" for k in parts] + [f"{b['hbm_bytes'] / 1e9:.2f}"]
            hbm.add_row(*([role] if role else []), *cells)
        console.print(hbm)
    if "slo" in summary:   # kvsim run --slo (sim/goodput.py)
        slo = Table(title="SLOs", header_style="bold")
        slo.add_column("metric")
        slo.add_column("value", justify="right")
        for k, v in summary["slo"].items():
            slo.add_row(k, ("yes" if v else "no") if isinstance(v, bool) else _fmt(v))
        console.print(slo)
