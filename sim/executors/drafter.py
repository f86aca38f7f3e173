"""The GPU time of a step's speculative proposals (sim/speculative.py): ``k`` passes of the drafter.

A draft model (or an EAGLE head: one decoder layer of the target's width and an LM head) proposes k tokens
a step, one pass after another, as vLLM's proposer runs them with its padded drafter batch (the default
since 0.11): the first pass over the tokens the target verified in the step (each verifying sequence's last
sampled token and its d drafts: 1 + d queries reading its context + 1 + d tokens, a row of logits each
sequence), then k - 1 passes of one token a sequence, pass j reading each context + j. Each pass is priced
by the drafter's own cost model (the same hardware, tensor-parallel degree and calibration as the target's)
as the GPU work of such a step: its GEMMs, attention, elementwise kernels and all-reduces. Its CPU side,
sampler and per-step gap are the target step's, counted once there. Prompt lookup (``ngram``) has no
drafter: it runs on the CPU, inside the target step's CPU time.

An EAGLE head's layers besides (vLLM's llama_eagle.py, llama_eagle3.py), priced as GEMMs of the drafter's
executor on each pass's tokens (``extra_s``; the fusion layers are replicated on every GPU, the QKV
projection sharded as the target's):

    eagle    every pass: the fusion layer, [embedding, hidden state] (2H) -> H
    eagle3   the first pass: the fusion layer of three of the target's hidden states, 3H -> H; every pass:
             its QKV projection reads [embedding, hidden state], 2H instead of H (priced as that GEMM at 2H
             less the same at H, which the decoder layer's pricing holds)
"""

from __future__ import annotations

from typing import Any


class Drafter:
    """Prices a step's ``k`` draft passes over ``seqs`` verifying sequences with ``drafts`` drafts in all, whose
    contexts (each with its last sampled token) sum to ``ctx_sum``."""

    def __init__(self, executor: Any, k: int, method: str = "draft_model") -> None:
        self.executor = executor   # a CostModelExecutor of the drafter's model, or None (ngram)
        self.k = k
        self.method = method
        self._extra: dict[tuple[int, int], float] = {}

    def price(self, seqs: int, ctx_sum: int, drafts: int) -> float:
        """Seconds of GPU work for the step's k passes (the module docstring)."""
        if self.executor is None or seqs == 0:
            return 0.0
        return self.executor.draft_work_s(seqs, drafts, ctx_sum, self.k) + self.extra_s(seqs, drafts)

    def extra_s(self, seqs: int, drafts: int) -> float:
        """Seconds of an EAGLE head's layers outside its decoder layer and LM head, for one step's k passes
        (the first over ``seqs`` + ``drafts`` tokens, the others over ``seqs``; 0.0 for a draft model)."""
        key = (seqs, drafts)
        hit = self._extra.get(key)
        if hit is None:
            hit = self._extra[key] = self._extra_terms(seqs, seqs + drafts)
        return hit

    def _extra_terms(self, seqs: int, first: int) -> float:
        ex = self.executor
        if self.method not in ("eagle", "eagle3", "mtp"):
            return 0.0
        h = ex.model.hidden_size
        if self.method in ("eagle", "mtp"):   # (a multi-token-prediction layer's projection is EAGLE's fusion)
            return ex.gemm_s(first, h, 2 * h) + (self.k - 1) * ex.gemm_s(seqs, h, 2 * h)
        op, k_in, n_qkv = ex._shapes[0]   # (attn_pre_proj: the QKV projection on one shard)

        def wider(tokens: int) -> float:
            return ex.gemm_s(tokens, n_qkv, 2 * k_in, op) - ex.gemm_s(tokens, n_qkv, k_in, op)
        return ex.gemm_s(first, h, 3 * h) + wider(first) + (self.k - 1) * wider(seqs)

    def size_terms(self, seqs: int, drafts: int) -> tuple[float, ...]:
        """What the compiled core prices the passes from (sim/csrc/core.c ``draft_price``): the drafter's size
        terms of the first pass and of the others (``CostModelExecutor.pass_terms``), and ``extra_s``."""
        ex = self.executor
        return (*ex.pass_terms(seqs + drafts, seqs), *ex.pass_terms(seqs, seqs), self.extra_s(seqs, drafts))

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
