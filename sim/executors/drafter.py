"""The GPU time of a step's speculative proposals (sim/speculative.py): ``k`` passes of the drafter.

A draft model (or an EAGLE head: one decoder layer of the target's width and an LM head) proposes k tokens
a step, one pass after another, each an all-decode pass over the verifying sequences one token further than
the last. Each pass is priced by the drafter's own cost model (the same hardware, tensor-parallel degree and
calibration as the target's) as the GPU work of such a step: its GEMMs, attention, elementwise kernels and
all-reduces. Its CPU side, sampler and per-step gap are the target step's, counted once there. Prompt lookup
(``ngram``) has no drafter: it runs on the CPU, inside the target step's CPU time.

An EAGLE head's layers besides (vLLM's llama_eagle.py, llama_eagle3.py), priced as GEMMs of the drafter's
executor on the verifying sequences (``extra_s``; the fusion layers are replicated on every GPU, the QKV
projection sharded as the target's):

    eagle    every pass: the fusion layer, [embedding, hidden state] (2H) -> H
    eagle3   once a step: the fusion layer of three of the target's hidden states, 3H -> H; every pass: its
             QKV projection reads [embedding, hidden state], 2H instead of H (priced as that GEMM at 2H less
             the same at H, which the decoder layer's pricing holds)
"""

from __future__ import annotations

from typing import Any


class Drafter:
    """Prices ``k`` draft passes over ``seqs`` sequences whose contexts (each with its last sampled token) sum
    to ``ctx_sum``."""

    def __init__(self, executor: Any, k: int, method: str = "draft_model") -> None:
        self.executor = executor   # a CostModelExecutor of the drafter's model, or None (ngram)
        self.k = k
        self.method = method
        self._extra: dict[int, float] = {}

    def price(self, seqs: int, ctx_sum: int) -> float:
        """Seconds of GPU work for the step's k passes (pass j: every context + j)."""
        if self.executor is None or seqs == 0:
            return 0.0
        return self.executor.decode_work_s(seqs, ctx_sum, self.k) + self.extra_s(seqs)

    def extra_s(self, seqs: int) -> float:
        """Seconds of an EAGLE head's layers outside its decoder layer and LM head, for one step's k passes
        over ``seqs`` sequences (the module docstring; 0.0 for a draft model)."""
        hit = self._extra.get(seqs)
        if hit is None:
            hit = self._extra[seqs] = self._extra_terms(seqs)
        return hit

    def _extra_terms(self, seqs: int) -> float:
        ex = self.executor
        if self.method not in ("eagle", "eagle3"):
            return 0.0
        h = ex.model.hidden_size
        if self.method == "eagle":
            return self.k * ex.gemm_s(seqs, h, 2 * h)
        op, k_in, n_qkv = ex._shapes[0]   # (attn_pre_proj: the QKV projection on one shard)
        wider = ex.gemm_s(seqs, n_qkv, 2 * k_in, op) - ex.gemm_s(seqs, n_qkv, k_in, op)
        return ex.gemm_s(seqs, h, 3 * h) + self.k * wider

    def size_terms(self, seqs: int) -> tuple[float, ...]:
        """What the compiled core prices the passes from (sim/csrc/core.c ``draft_price``): the drafter's
        size terms (``CostModelExecutor._size_terms``) and ``extra_s``."""
        return (*self.executor._size_terms(seqs), self.extra_s(seqs))

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
    return Drafter(executor, cfg.num_speculative_tokens, cfg.method)
