"""A benchmark-only stand-in for the cost model's vectorised ``execute_decode_run`` (the lead adds the
real one to sim/executors/cost_model.py): today's ``execute`` formula for an all-decode plan, as numpy
arrays over j = 0..k-1, in the same operation order so that entry j equals ``execute`` of the step-j plan
bit for bit. ``install()`` checks every entry against ``execute`` for the first ``full_checks`` runs and
the first and last entry of every ``sample``-th later run, and raises on any difference."""

from __future__ import annotations

import numpy as np

from sim.executors.base import DecodeRun
from sim.executors.cost_model import CostModelExecutor
from sim.sched.plan import ScheduledRequest, StepPlan


def decode_run(self: CostModelExecutor, plan: StepPlan, k: int) -> DecodeRun:
    sched = plan.scheduled
    n = len(sched)
    ctx = sum(s.num_context_tokens for s in sched) + n
    dec_ctx = ctx + n * np.arange(k, dtype=np.int64)
    lin, comm = self._linear(n)
    linear = lin + self._lm_head(n)
    per_layer = np.maximum(self._attn_flops_per_pair * dec_ctx / self._attn_peak,
                           self._attn_kv_s * dec_ctx + self._attn_new_bytes * n / self._attn_bw) \
        + self.params.kernel_latency_s
    attention = self._layers * (per_layer + n * self._attn_seq + 0 * self._attn_pre_seq)
    elementwise = self._layers * (n * self._elem_s_per_token + self._elem_fixed)
    swap = 0 * self._swap_s_per_block
    copy = 0 * self._copy_s_per_block
    dur = linear + attention + elementwise + comm + swap + copy + self._overhead
    full = np.full(k, 1.0)
    return DecodeRun(dur, {"linear": linear * full, "attention": attention, "elementwise": elementwise * full,
                           "allreduce": comm * full, "swap": swap * full, "copy": copy * full,
                           "overhead": self._overhead * full})


def _check(self: CostModelExecutor, plan: StepPlan, run: DecodeRun, js: list[int]) -> None:
    for j in js:
        shifted = StepPlan([ScheduledRequest(s.req_id, 1, s.num_context_tokens + j, s.block_ids)
                            for s in plan.scheduled])
        ref = self.execute(shifted)
        if ref.duration_s != run.durations[j] or any(ref.breakdown[key] != run.breakdown[key][j]
                                                     for key in ref.breakdown):
            raise AssertionError(f"vectorised pricing differs from execute at j={j}")


def install(full_checks: int = 100, sample: int = 100) -> None:
    calls = [0]

    def checked(self: CostModelExecutor, plan: StepPlan, k: int) -> DecodeRun:
        run = decode_run(self, plan, k)
        calls[0] += 1
        if calls[0] <= full_checks:
            _check(self, plan, run, list(range(k)))
        elif calls[0] % sample == 0:
            _check(self, plan, run, [0, k - 1])
        return run

    CostModelExecutor.execute_decode_run = checked
