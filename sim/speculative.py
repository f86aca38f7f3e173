"""Speculative decoding: the scenario's ``speculative`` section, the draft model it implies, and the draws
that decide how many drafted tokens the target accepts.

Each decode step of a running request proposes ``d = min(k, tokens left - 1)`` draft tokens (k =
``num_speculative_tokens``); the target verifies the last sampled token and the d drafts in one pass of
1 + d query tokens, accepts the first a drafts (a leading run), and samples one more token from its own
distribution at the first rejection (or after the last draft): 1 + a tokens a step. The KV of the
rejected drafts is discarded (their slots are given back).

Acceptance (Leviathan et al., 2023): draft position i is accepted with probability ``acceptance_rate``
(a number: the same at every position), or the i-th of a list (one per position, each conditional on the
ones before it being accepted, as vLLM's per-position acceptance metrics read). One uniform draw a
verification decides a: a >= j exactly when u < a_1 x ... x a_j. The draws come from their own stream,
seeded by the scenario's seed and the replica, so the same scenario gives the same run bit for bit.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim.specs import ModelSpec, check_preset, complete_from_preset, group_kv_bytes_per_block

MAX_SPECULATIVE_TOKENS = 16
# an EAGLE-3 head's own vocabulary where none is given: the published heads of Llama-3.1-8B and -70B
# (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, -70B: draft_vocab_size 32,000, mapped onto the target's by d2t)
EAGLE3_DRAFT_VOCAB = 32000
# vocabularies that differ by at most this many entries can be one tokenizer's, padded differently (Qwen2.5's
# 1.5B has 151,936 rows, its 7B 152,064); a larger difference is another tokenizer
VOCAB_PADDING = 1024


class SpeculativeConfig(BaseModel):
    """``speculative:``, vLLM's ``--speculative-config``. ``method``: ``ngram`` (prompt lookup, on the CPU:
    no GPU time), ``draft_model`` (a smaller model of the same tokenizer, ``model``, run k times a step),
    ``eagle`` (an EAGLE head: a fusion layer of the token's embedding and the last hidden state, one decoder
    layer of the target's width and the target's LM head, run k times a step) or ``eagle3`` (an EAGLE-3
    head: a fusion layer of three of the target's hidden states, once a step, then k passes of one decoder
    layer whose attention reads twice the width, and an LM head over its own ``draft_vocab_size``
    tokens) or ``mtp`` (the target's own multi-token-prediction layer, DeepSeek-V3's: a projection of the
    token's embedding and the last hidden state, one of the target's decoder layers and its LM head, run k
    times a step; priced as an EAGLE head, which has that shape)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = True   # false: the section is read and checked, the engine decodes without drafts
    method: Literal["ngram", "draft_model", "eagle", "eagle3", "mtp"]
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPECULATIVE_TOKENS)
    acceptance_rate: float | list[float] | None = None
    # instead of acceptance_rate: the tokens a verifying step gives a request on average (1 + accepted drafts, vLLM's
    # "mean acceptance length"), read as the same rate at every position
    mean_acceptance_length: float | None = Field(default=None, ge=1.0, le=MAX_SPECULATIVE_TOKENS + 1)
    model: str | ModelSpec | None = None   # method draft_model: a preset, a Hugging Face id or a mapping
    # method eagle3: the head's own vocabulary (its LM head's rows; default EAGLE3_DRAFT_VOCAB, at most the target's)
    draft_vocab_size: int | None = Field(default=None, ge=1)

    @field_validator("acceptance_rate")
    @classmethod
    def _rates(cls, v: float | list[float] | None) -> float | list[float] | None:
        if v is None:
            return v
        rates = v if isinstance(v, list) else [v]
        if not rates:
            raise ValueError("give one rate, or one per draft position")
        for r in rates:
            if not 0.0 <= r <= 1.0:
                raise ValueError(f"an acceptance rate is a probability in [0, 1], got {r}")
        return v

    @field_validator("model", mode="before")
    @classmethod
    def _model_from_preset(cls, v: Any) -> Any:
        return complete_from_preset(v, ModelSpec) if v is not None else v

    @field_validator("model")
    @classmethod
    def _model_preset(cls, v: str | ModelSpec | None) -> str | ModelSpec | None:
        return check_preset(v, ModelSpec) if v is not None else v

    def rates(self) -> list[float]:
        """The acceptance probability of each draft position, 1 to ``num_speculative_tokens``."""
        a = self.acceptance_rate
        if a is None:
            a = rate_for_length(self.mean_acceptance_length, self.num_speculative_tokens)
        return list(a) if isinstance(a, list) else [float(a)] * self.num_speculative_tokens

    def draft_vocab(self, target: ModelSpec) -> int:
        """The rows of an EAGLE-3 head's LM head: ``draft_vocab_size``, else EAGLE3_DRAFT_VOCAB (at most the
        target's vocabulary)."""
        return self.draft_vocab_size or min(EAGLE3_DRAFT_VOCAB, target.vocab_size)

    def draft_spec(self) -> ModelSpec | None:
        """The ``model`` given (method draft_model), as a ModelSpec."""
        m = self.model
        return None if m is None else ModelSpec.from_name(m) if isinstance(m, str) else m


def rate_for_length(length: float, k: int) -> float:
    """The acceptance rate a, the same at every position, whose mean acceptance length with ``k`` drafts is
    ``length``: 1 + a + a^2 + ... + a^k = length (increasing in a; bisection to float precision)."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(k + 1)) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def problem(scn: Any) -> tuple[str, str] | None:
    """(key, why) where the scenario's ``speculative`` section cannot run: in its engine, with its model, at
    its tensor-parallel degree."""
    if scn.scheduler.batching != "continuous":
        return "speculative", "needs scheduler.batching: continuous (a static batch decodes one token a step)"
    if scn.kv_cache.allocator != "paged":
        return "speculative", f"needs kv_cache.allocator: paged (the {scn.kv_cache.allocator} allocator is not " \
                              "modelled with it)"
    if scn.executor.kind != "cost_model":
        return "speculative", f"the {scn.executor.kind} executor runs no drafter; use executor.kind: cost_model"
    cfg, target, tensor_parallel = scn.speculative, scn.model_spec, scn.hardware_spec.tensor_parallel
    k = cfg.num_speculative_tokens
    length = cfg.mean_acceptance_length
    if cfg.acceptance_rate is None and length is None:
        return "speculative.acceptance_rate", "required: the rate at which drafts are accepted (one, or one per " \
                                              "draft position), or instead mean_acceptance_length"
    if cfg.acceptance_rate is not None and length is not None:
        return "speculative.mean_acceptance_length", "give acceptance_rate or mean_acceptance_length, not both"
    if length is not None and length > k + 1:
        return "speculative.mean_acceptance_length", (f"{length} tokens a step is more than {k} drafts and the "
                                                      f"target's own token give ({k + 1})")
    if isinstance(cfg.acceptance_rate, list) and len(cfg.acceptance_rate) != k:
        return "speculative.acceptance_rate", (f"{len(cfg.acceptance_rate)} rates for num_speculative_tokens "
                                               f"{k}: give one number, or one rate per draft position")
    if cfg.draft_vocab_size is not None:
        if cfg.method != "eagle3":
            return "speculative.draft_vocab_size", (f"only method eagle3 has a vocabulary of its own ({cfg.method}: "
                                                    "the target's)")
        if cfg.draft_vocab_size > target.vocab_size:
            return "speculative.draft_vocab_size", (f"{cfg.draft_vocab_size:,} is more than the target "
                                                    f"{target.name}'s vocabulary ({target.vocab_size:,})")
    if cfg.method == "eagle3" and target.latent_attention:
        return "speculative.method", ("an EAGLE-3 head of a latent-attention target is not modelled; use mtp (its "
                                      "multi-token-prediction layer), eagle or draft_model")
    if cfg.method != "draft_model":
        if cfg.model is not None:
            return "speculative.model", (f"only method draft_model takes a model ({cfg.method}: "
                                         + ("prompt lookup runs on the CPU)" if cfg.method == "ngram" else
                                            "the head is priced as one layer of the target's width)"))
        return None
    draft = cfg.draft_spec()
    if draft is None:
        return "speculative.model", "method draft_model needs the draft model (a preset, a Hugging Face id or a " \
                                    "mapping of its fields)"
    why = draft_model_problem(draft, target, tensor_parallel)
    return ("speculative.model", why) if why else None


def draft_model_problem(draft: ModelSpec, target: ModelSpec, tensor_parallel: int) -> str:
    """Why ``draft`` cannot draft for ``target`` at this tensor-parallel degree ('' where it can)."""
    if abs(draft.vocab_size - target.vocab_size) > VOCAB_PADDING:
        return (f"{draft.name} has a vocabulary of {draft.vocab_size:,} tokens, the target {target.name} "
                f"{target.vocab_size:,}: a draft model must share the target's tokenizer")
    if draft.local_layers:
        return (f"{draft.name} has sliding-window layers: a draft model's passes are priced from context sums, "
                "which a window does not keep; draft with a full-attention model, or use eagle or ngram")
    why = draft.tensor_parallel_problem(tensor_parallel)
    return f"the draft model runs at the target's tensor_parallel {tensor_parallel}: {why}" if why else ""


def drafter_model(cfg: SpeculativeConfig, target: ModelSpec) -> ModelSpec | None:
    """The model the drafter runs k times a step (None: ngram, no GPU work), its KV in the target's KV dtype
    (it lives in the target's blocks). An EAGLE head is one decoder layer of the target's shapes with the
    target's vocabulary (its LM head is the target's); an EAGLE-3 head the same with its own vocabulary
    (sim/executors/drafter.py prices their fusion layers and EAGLE-3's wider attention input besides)."""
    if cfg.method == "ngram":
        return None
    if cfg.method in ("eagle", "mtp"):
        return _layers_of(target, 1, name=f"{target.name}-{'eagle-head' if cfg.method == 'eagle' else 'mtp-layer'}")
    if cfg.method == "eagle3":
        return _layers_of(target, 1, name=f"{target.name}-eagle3-head", vocab_size=cfg.draft_vocab(target))
    return cfg.draft_spec().model_copy(update={"kv_dtype": target.kv_dtype})


def _layers_of(target: ModelSpec, layers: int, **update) -> ModelSpec:
    """``target`` cut to ``layers`` layers of its kind that repeats (a mixture of experts' expert layers, none
    of its dense ones, as DeepSeek's multi-token-prediction layer is), attending the whole context (an EAGLE
    head's layer is a full-attention one)."""
    return target.model_copy(update={"num_layers": layers, "dense_layers": 0, "dense_intermediate_size": 0,
                                     "sliding_window": 0, "sliding_layers": None, **update})


def drafter_weight_bytes(cfg: SpeculativeConfig, target: ModelSpec) -> int:
    """HBM the drafter's weights take over the tensor-parallel group: a draft model's whole weights; an
    EAGLE head's decoder layer (the target's per-layer bytes) and its fusion layer (2H x H, the dtype), its
    embedding and LM head shared with the target (as vLLM loads them); an EAGLE-3 head's decoder layer with
    its QKV projection reading 2H (H x (q + 2 kv) more), its fusion layer (3H x H) and its own LM head
    (draft vocabulary x H), the embedding shared; none for ngram."""
    if cfg.method == "ngram":
        return 0
    if cfg.method in ("eagle", "eagle3", "mtp"):
        one = _layers_of(target, 1).weight_bytes()
        two = _layers_of(target, 2).weight_bytes()
        h, b = target.hidden_size, target.dtype_bytes
        if cfg.method in ("eagle", "mtp"):
            return (two - one) + 2 * h * h * b
        qkv = (target.num_heads + 2 * target.num_kv_heads) * target.head_dim
        return (two - one) + h * qkv * b + 3 * h * h * b + cfg.draft_vocab(target) * h * b
    return cfg.draft_spec().weight_bytes()


def drafter_bytes(cfg: SpeculativeConfig, target: ModelSpec, hardware, block_size: int) -> tuple[int, int]:
    """(the drafter's weights, its KV bytes per block) over the tensor-parallel group: its layers' K and V of a
    block's tokens, in the target's KV dtype; vLLM keeps them in the same blocks as the target's, so each block
    costs both."""
    spec = drafter_model(cfg, target)
    block = 0 if spec is None else group_kv_bytes_per_block(spec, hardware, block_size)
    return drafter_weight_bytes(cfg, target), block


class Speculation:
    """A scheduler's speculative decoding: ``k`` drafts a step at most, the acceptance draws, and what was
    drafted and accepted (the summary's ``speculative``)."""

    def __init__(self, cfg: SpeculativeConfig, seed: int, replica: int = 0) -> None:
        self.k = cfg.num_speculative_tokens
        self.method = cfg.method
        survival = []
        p = 1.0
        for r in cfg.rates():
            p *= r
            survival.append(p)
        self._survival = survival   # P(a >= j) for j = 1..k, non-increasing
        self.stream = random.Random(f"speculative/{seed}/{replica}")   # (the compiled core draws from its state)
        self._random = self.stream.random
        self.verifications = 0      # (request, step) pairs that verified at least one draft
        self.drafted = 0
        self.accepted = 0
        self.by_request: dict[int, list[int]] = {}   # req_id -> [drafted, accepted] (requests.csv's columns)

    def accept(self, req_id: int, drafts: int) -> int:
        """How many of request ``req_id``'s ``drafts`` leading drafts the target accepts (one draw)."""
        u = self._random()
        survival = self._survival
        a = 0
        while a < drafts and u < survival[a]:
            a += 1
        self.verifications += 1
        self.drafted += drafts
        self.accepted += a
        counts = self.by_request.get(req_id)
        if counts is None:
            self.by_request[req_id] = [drafts, a]
        else:
            counts[0] += drafts
            counts[1] += a
        return a

    def summary(self) -> dict[str, Any]:
        """``speculative`` of summary.json: the configuration and the measured acceptance."""
        return summary_of([self])


def add_request_columns(reqs, parts: list[Speculation]) -> None:
    """``draft_tokens`` and ``accepted_tokens`` of each request (its drafts verified and accepted, on every
    replica it ran on) as columns of the requests table ``reqs``."""
    totals: dict[int, list[int]] = {}
    for part in parts:
        for rid, (drafted, accepted) in part.by_request.items():
            t = totals.setdefault(rid, [0, 0])
            t[0] += drafted
            t[1] += accepted
    ids = reqs["req_id"].to_numpy()
    reqs["draft_tokens"] = [totals.get(int(i), (0, 0))[0] for i in ids]
    reqs["accepted_tokens"] = [totals.get(int(i), (0, 0))[1] for i in ids]


def summary_of(parts: list[Speculation]) -> dict[str, Any]:
    """The summary's ``speculative`` over one or more schedulers (a cluster's replicas): drafted and accepted
    tokens, the acceptance rate (accepted / drafted) and the mean acceptance length (tokens a verifying step
    gives a request: 1 + accepted drafts, vLLM's "mean acceptance length")."""
    ver = sum(p.verifications for p in parts)
    drafted = sum(p.drafted for p in parts)
    accepted = sum(p.accepted for p in parts)
    return {"method": parts[0].method, "num_speculative_tokens": parts[0].k, "verifications": ver,
            "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else float("nan"),
            "mean_acceptance_length": 1.0 + accepted / ver if ver else float("nan")}
