"""The GPU time of a step's speculative proposals (sim/speculative.py): ``k`` passes of the drafter.

A draft model (or an EAGLE head: one decoder layer of the target's width and its LM head) proposes k tokens
a step, one pass after another, each an all-decode pass over the verifying sequences one token further than
the last. Each pass is priced by the drafter's own cost model (the same hardware, tensor-parallel degree and
calibration as the target's) as the GPU work of such a step: its GEMMs, attention, elementwise kernels and
all-reduces. Its CPU side, sampler and per-step gap are the target step's, counted once there. Prompt lookup
(``ngram``) has no drafter: it runs on the CPU, inside the target step's CPU time.
"""

from __future__ import annotations

from typing import Any


class Drafter:
    """Prices ``k`` draft passes over ``seqs`` sequences whose contexts (each with its last sampled token) sum
    to ``ctx_sum``."""

    def __init__(self, executor: Any, k: int) -> None:
        self.executor = executor   # a CostModelExecutor of the drafter's model, or None (ngram)
        self.k = k

    def price(self, seqs: int, ctx_sum: int) -> float:
        """Seconds of GPU work for the step's k passes (pass j: every context + j)."""
        if self.executor is None or seqs == 0:
            return 0.0
        return self.executor.decode_work_s(seqs, ctx_sum, self.k)

    def describe(self) -> dict[str, Any]:
        """What prices the drafts (the summary's ``step_model``)."""
        if self.executor is None:
            return {"drafter": None}
        return {"drafter": self.executor.model.name, "passes": self.k}


def make_drafter(scn: Any) -> Drafter:
    """The drafter of ``scn.speculative``: its model priced on the scenario's hardware with the executor
    settings of the target (the shipped calibration of the hardware unless one is named)."""
    from sim.executors.cost_model import make_cost_model_executor
    from sim.speculative import drafter_model

    cfg = scn.speculative
    target = scn.model_spec
    spec = drafter_model(cfg, target)
    executor = None
    if spec is not None:
        executor = make_cost_model_executor(model=spec, hardware=scn.hardware_spec, config=scn.executor,
                                            kv=scn.kv_cache, base_dir=scn.base_dir, scheduler=scn.scheduler)
    return Drafter(executor, cfg.num_speculative_tokens)
