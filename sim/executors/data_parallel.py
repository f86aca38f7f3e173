"""A data-parallel group's step prices (``cluster.data_parallel``; sim/cluster/data_parallel.py runs the group).

vLLM's data-parallel deployment of a mixture of experts (``--data-parallel-size D``): D engines (ranks), each
a tensor-parallel group of T GPUs with its own scheduler and KV cache, run attention and the dense layers on
their own requests, while the expert layers span all D x T GPUs: each expert split over them (vLLM's
default, an expert layer tensor-parallel over D x T) or, with ``hardware.expert_parallel``, placed whole
(EP over D x T). The ranks step in lockstep: every expert layer is a collective of all of them, and a rank
with nothing to do runs a dummy pass while the others work.

One step of the group, as priced here (``group_step``):

    tokens   every rank's tokens padded to the largest rank's, N (vLLM pads each rank's batch to the
             largest across DP ranks, so that the collectives and CUDA graphs agree); graphs only when
             every rank's would run in one (N within the captured sizes and no rank prefilling)
    rank r   its step priced as a single engine's, its dense GEMMs, elementwise kernels and all-reduces
             on N tokens, attention and the CPU side on its own requests
    experts  each expert layer on all D x N rows (the router's gate on a rank's own N), over D x T GPUs
    gather   each expert layer all-gathers the ranks' hidden states and reduce-scatters the outputs
             (vLLM's default all2all backend, allgather_reducescatter): an all-reduce's traffic of D x N
             hidden states over the D ranks, from the NCCL table
    step     the slowest rank's time; the others wait for it (their wait is in their overhead column)

Not modelled: DeepEP's or pplx's all-to-all kernels, expert load balancing (uniform routing, as
sim/expert_parallel.py), and groups across nodes.
"""

from __future__ import annotations

from sim.executors.cost_model import CostModelExecutor
from sim.executors.layer_terms import mlp_shapes
from sim.executors.roofline import allreduce_time
from sim.sched.plan import LaneEntries, StepPlan, StepResult


class DataParallelPricer(CostModelExecutor):
    """Prices one rank's steps inside a group of ``dp`` ranks (each rank's hardware the group's tensor-parallel
    GPUs); ``group_step`` prices a step of the whole group. Its memoised prices are its own (they depend on
    ``dp``), keyed by the group's padded token count."""

    supports_decode_runs = False   # the group steps one step at a time

    def __init__(self, base: CostModelExecutor, dp: int, block_size: int) -> None:
        if base.engine is None:
            raise ValueError("a data-parallel group is priced with the engine-level terms "
                             "(a shipped calibration, or executor.engine not false)")
        super().__init__(base.model, base.hardware, base.params, block_size=block_size, engine=base.engine,
                         calibration=base.calibration, derived_from=base.derived_from,
                         calibrated_for=base.calibrated_for)
        self.dp = dp
        tp = base.hardware.tensor_parallel
        gpus = dp * tp
        m = base.model
        if base.hardware.expert_parallel:   # whole experts over the group's GPUs; the busiest one sets the pace
            self._ep = gpus
            self._expert_shapes = mlp_shapes(m, m.intermediate_size, 1)
        else:                               # each expert split over the group's GPUs
            self._ep = 1
            self._expert_shapes = mlp_shapes(m, m.intermediate_size, gpus)
        self._moe_layers = m.num_layers - m.dense_layers
        # (prices of this group alone: they depend on dp, unlike those of a single engine of the same model)
        self._eng_linear_cache: dict = {}
        self._eng_fixed_cache: dict = {}
        self._linear_cache: dict = {}
        # the compiled core prices its steps only as a group's (core.c lockstep.inc), never as one engine's
        self.group_core_priced = self._core_priced
        self._core_priced = False
        self._native_consts = None
        self._group_tokens = 0        # the largest rank's tokens this step
        self._group_prefill = False   # some rank prefills this step
        self.last_waits: list[float] = []   # each rank's wait for the slowest in the last group step (0: none)
        self.last_tokens: list[int] = []    # each rank's tokens in the last group step (0: a dummy pass)

    def _moe_mlp_time(self, tokens: int) -> float:
        """The expert layer of the group: the gate on this rank's ``tokens``, the experts on every rank's."""
        return self._moe_time(tokens, self.dp * tokens)

    def _engine_linear(self, padded: int, graph: bool) -> tuple[float, float]:
        """The single engine's GEMMs and all-reduces on ``padded`` tokens, and each expert layer's all-gather
        and reduce-scatter of the group's D x ``padded`` hidden states."""
        key = (padded, graph)
        hit = self._eng_linear_cache.get(key)
        if hit is None:
            layers, comm = super()._engine_linear(padded, graph)
            hw = self.hardware
            gather = float(allreduce_time(self.dp * padded * self._act_bytes, self.dp, hw.interconnect_bandwidth,
                                          hw.interconnect_latency_s, self.params))
            hit = self._eng_linear_cache[key] = (layers, comm + self._moe_layers * gather)
        return hit

    def _engine_fixed(self, tokens: int, seqs: int, has_prefill: bool) -> tuple[float, float, float, float, float]:
        """The token-dependent parts on the group's padded tokens (``group_step`` sets them)."""
        key = (self._group_tokens, seqs, self._group_prefill)
        hit = self._eng_fixed_cache.get(key)
        if hit is None:
            hit = self._eng_fixed_cache[key] = self._engine_fixed_terms(*key)
        return hit

    def group_step(self, plans: list[StepPlan | None]) -> list[StepResult | None]:
        """One lockstep step of the group: each rank's result (None where it has no plan: a dummy pass), every
        one lasting the slowest rank's time, what a rank waits for the others in its ``overhead``."""
        tokens = self.last_tokens = [0 if p is None else p.num_tokens for p in plans]
        self._group_tokens = max(tokens)
        self._group_prefill = any(p is not None and _prefills(p) for p in plans)
        results = [None if p is None else self.execute(p) for p in plans]
        duration = max(r.duration_s for r in results if r is not None)
        out: list[StepResult | None] = []
        self.last_waits = []
        for r in results:
            if r is None:
                out.append(None)
                self.last_waits.append(0.0)
                continue
            parts = dict(r.breakdown)
            parts["overhead"] += duration - r.duration_s
            self.last_waits.append(duration - r.duration_s)
            out.append(StepResult(duration_s=duration, breakdown=parts))
        return out

    def describe(self) -> dict:
        out = super().describe()
        out["data_parallel"] = self.dp
        return out


def _prefills(plan: StepPlan) -> bool:
    """Whether ``plan`` computes a prompt's tokens (anything but one new token over a cached context)."""
    entries = plan.scheduled
    if type(entries) is LaneEntries:   # (the lane's entries are all decodes)
        entries = entries.rest
    return any(s.num_new_tokens != 1 or s.num_context_tokens == 0 for s in entries)
