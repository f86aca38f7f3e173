"""The fewest GPUs meeting SLOs over layouts: ``kvsim capacity --vary`` (tensor parallelism, quantization,
GPU type, pool splits ... any scenario keys).

Each layout (one combination of the varied values) gets its own fewest-replicas search
(``search_replicas``); its GPUs are its replicas times their tensor-parallel degree (a disaggregated fleet:
each pool's replicas times that pool's degree). The best layout is the one with the fewest GPUs, or with
``costs`` (a price a GPU-hour per hardware name) the cheapest; ties go to the first in the cross product.
Invariant: a layout that no fleet of up to ``max_replicas`` replicas makes meet the SLOs is reported with
its reason and is never the best; nothing is chosen when none meets them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sim.cluster.capacity import Runner, search_replicas
from sim.cluster.replica import pool_scenario
from sim.errors import KvsimError
from sim.scenario import Scenario

Layout = list[tuple[str, str]]   # (key.path, value) of each varied key


def gpus_of(scn: Scenario, answer: dict[str, Any]) -> tuple[int, dict[str, int]]:
    """(GPUs, GPUs per hardware name) of a replicas answer for ``scn``: each pool's replicas x its degree."""
    cl = scn.cluster
    pools = [(answer["prefill"], cl.prefill), (answer["decode"], cl.decode)] if "prefill" in answer \
        else [(answer["replicas"], None)]
    per_hw: dict[str, int] = {}
    for count, pool in pools:
        hw = pool_scenario(scn, pool).hardware_spec
        per_hw[hw.name] = per_hw.get(hw.name, 0) + count * hw.tensor_parallel
    return sum(per_hw.values()), per_hw


def hardware_names(scn: Scenario) -> set[str]:
    """The hardware its replicas run on (a disaggregated fleet: each pool's)."""
    cl = scn.cluster
    pools = [cl.prefill, cl.decode] if cl is not None and cl.prefill is not None else [None]
    return {pool_scenario(scn, pool).hardware_spec.name for pool in pools}


def cost_of(per_hw: dict[str, int], costs: dict[str, float]) -> float:
    """A fleet's price an hour: its GPUs of each hardware name times that name's price (KvsimError: unpriced)."""
    missing = sorted(set(per_hw) - set(costs))
    if missing:
        raise KvsimError("--gpu-cost", f"no price for {', '.join(missing)} (give --gpu-cost NAME=PRICE for each)")
    return sum(n * costs[name] for name, n in per_hw.items())


def search_layouts(layouts: list[Layout], data_of: Callable[[Layout], dict], scenario_of: Callable[[Layout], Scenario],
                   run: Runner, max_replicas: int, workers: int, costs: dict[str, float] | None = None
                   ) -> dict[str, Any]:
    """Every layout's fewest replicas and GPUs (``data_of``: its scenario mapping for the search,
    ``scenario_of``: the same, validated), and the best: ``{"layout", "replicas", "gpus", ["cost_per_hour"],
    "layouts": [...]}``; the best's fields are None where no layout meets the SLOs."""
    rows: list[dict[str, Any]] = []
    for layout in layouts:
        row: dict[str, Any] = {"layout": ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in layout),
                               "varied": dict(layout)}
        try:
            answer = search_replicas(data_of(layout), run, max_replicas, workers)
        except KvsimError as e:   # no fleet meets the SLOs (or none can run): this layout is out
            row.update(replicas=None, gpus=None, reason=e.one_line().removeprefix("error: "), candidates=[])
            rows.append(row)
            continue
        gpus, per_hw = gpus_of(scenario_of(layout), answer)
        row.update({k: answer[k] for k in ("replicas", "prefill", "decode") if k in answer})
        row.update(gpus=gpus, gpus_by_hardware=per_hw)
        if costs is not None:
            row["cost_per_hour"] = cost_of(per_hw, costs)
        row["candidates"] = answer["candidates"]
        rows.append(row)
    met = [r for r in rows if r["gpus"] is not None]
    key = "cost_per_hour" if costs is not None else "gpus"
    best = min(met, key=lambda r: r[key]) if met else None   # (min keeps the first of equals)
    out: dict[str, Any] = {"layout": best["layout"] if best else None,
                           "replicas": best["replicas"] if best else None, "gpus": best["gpus"] if best else None}
    if costs is not None:
        out["cost_per_hour"] = best["cost_per_hour"] if best else math.nan
    out["layouts"] = rows
    return out
