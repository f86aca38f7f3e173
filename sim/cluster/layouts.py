"""Layouts side by side: ``kvsim capacity --vary`` (tensor parallelism, quantization, GPU type, pool splits ...
any scenario keys).

Each layout (one combination of the varied values) gets its own search. ``--search replicas``: its fewest
replicas, its GPUs their replicas times their tensor-parallel degree (a disaggregated fleet: each pool's
replicas times that pool's degree), the best the fewest GPUs. ``--search rate`` or ``concurrency``: the
highest rate (requests in flight) its own fleet meets the SLOs at, per GPU of that fleet, the best the most
per GPU. With ``costs`` (a price a GPU-hour per hardware name) the best is the cheapest fleet, or the most a
second (in flight) per unit of price an hour. Ties go to the first layout in the cross product.
Invariant: a layout no candidate of its search makes meet the SLOs is reported with the reason and is never
the best; nothing is chosen when none meets them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sim.cluster.replica import pool_scenario
from sim.errors import KvsimError
from sim.scenario import Scenario

Layout = list[tuple[str, str]]   # (key.path, value) of each varied key


def gpus_of(scn: Scenario, answer: dict[str, Any] | None = None) -> tuple[int, dict[str, int]]:
    """(GPUs, GPUs per hardware name) of ``scn``'s fleet, or of a replicas search's ``answer`` for it: each
    pool's (or group's) replicas x its tensor-parallel degree (no cluster: one replica)."""
    cl = scn.cluster
    if answer is not None and "group" in answer:   # one group of a mixed fleet grown, the others as they are
        pools = [(answer["replicas"] if i == answer["group"] else g.replicas, g) for i, g in enumerate(cl.groups)]
    elif answer is not None:
        pools = [(answer["prefill"], cl.prefill), (answer["decode"], cl.decode)] if "prefill" in answer \
            else [(answer["replicas"], None)]
    elif cl is None:
        pools = [(1, None)]
    elif cl.prefill is not None:
        pools = [(cl.prefill.replicas, cl.prefill), (cl.decode.replicas, cl.decode)]
    elif cl.groups is not None:
        pools = [(g.replicas, g) for g in cl.groups]
    else:
        pools = [(cl.replicas, None)]
    per_hw: dict[str, int] = {}
    for count, pool in pools:
        hw = pool_scenario(scn, pool).hardware_spec
        per_hw[hw.name] = per_hw.get(hw.name, 0) + count * hw.gpus   # (tensor x pipeline parallel)
    return sum(per_hw.values()), per_hw


def hardware_names(scn: Scenario) -> set[str]:
    """The hardware its replicas run on (a disaggregated fleet: each pool's; every pool has a replica)."""
    return set(gpus_of(scn)[1])


def cost_of(per_hw: dict[str, int], costs: dict[str, float]) -> float:
    """A fleet's price an hour: its GPUs of each hardware name times that name's price (KvsimError: unpriced)."""
    missing = sorted(set(per_hw) - set(costs))
    if missing:
        raise KvsimError("--gpu-cost", f"no price for {', '.join(missing)} (give --gpu-cost NAME=PRICE for each)")
    return sum(n * costs[name] for name, n in per_hw.items())


def search_layouts(layouts: list[Layout], data_of: Callable[[Layout], dict], scenario_of: Callable[[Layout], Scenario],
                   search: Callable[[Layout, dict], dict[str, Any]], key: str,
                   costs: dict[str, float] | None = None, figures: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every layout's answer to ``search`` (``key``: replicas, rate or concurrency), with its GPUs (and price)
    and the ``figures`` (the SLOs' names) of the candidate it chose, and the best layout: ``{"layout", key,
    "gpus", [score], "layouts": [...]}``, the best's fields None where no layout meets the SLOs. ``data_of``:
    a layout's scenario mapping for the search; ``scenario_of``: the same, validated."""
    rows: list[dict[str, Any]] = []
    for layout in layouts:
        row: dict[str, Any] = {"layout": ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in layout),
                               "varied": dict(layout)}
        try:
            answer = search(layout, data_of(layout))
        except KvsimError as e:   # no candidate meets the SLOs: this layout is out
            row.update({key: None, "gpus": None, score_key(key, costs is not None): None,
                        "reason": e.one_line().removeprefix("error: "), "candidates": []})
            rows.append(row)
            continue
        scn = scenario_of(layout)
        gpus, per_hw = gpus_of(scn, answer) if key == "replicas" else gpus_of(scn)
        row.update({k: answer[k] for k in (key, "prefill", "decode") if k in answer})
        chosen = next(c for c in answer["candidates"] if c[key] == answer[key])
        row.update({f: chosen[f] for f in figures})
        row.update(gpus=gpus, gpus_by_hardware=per_hw)
        if key != "replicas":
            row[f"{key}_per_gpu"] = answer[key] / gpus
        if costs is not None:
            row["cost_per_hour"] = cost_of(per_hw, costs)
            if key != "replicas":
                row[f"{key}_per_cost"] = answer[key] / row["cost_per_hour"] if row["cost_per_hour"] else math.inf
        row["candidates"] = answer["candidates"]
        row["out_of_order"] = answer.get("out_of_order", [])
        rows.append(row)
    score = score_key(key, costs is not None)
    met = [r for r in rows if r["gpus"] is not None]
    lower = key == "replicas"   # fewest GPUs or cheapest; else the most per GPU or per price
    best = (min if lower else max)(met, key=lambda r: r[score]) if met else None   # (the first of equals)
    out: dict[str, Any] = {"layout": None, key: None, "gpus": None, score: None}
    if best is not None:
        out.update({"layout": best["layout"], key: best[key], "gpus": best["gpus"], score: best[score]})
    out["layouts"] = rows
    return out


def score_key(key: str, priced: bool) -> str:
    """The column layouts are ranked by."""
    if key == "replicas":
        return "cost_per_hour" if priced else "gpus"
    return f"{key}_per_cost" if priced else f"{key}_per_gpu"
