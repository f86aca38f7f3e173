"""Runs one engine step for real (swaps, copies, forward pass) and times every operator.

Independent of the simulator's types (the GPU box may lack pydantic/simpy): a step is a list of
``SeqWork(num_new_tokens, num_context_tokens, block_ids)`` plus the block pairs to swap and copy.

Timing: on CUDA a CUDA event is recorded after each operator and the gaps are read after one
synchronize; on the CPU, perf_counter laps. Host-side input preparation is not timed (model it with
the executor's step overhead). Per-layer operators are summed over the layers run and scaled by
model layers / layers run; so are swap and copy (their bytes scale with the layers). The first time
a kernel configuration appears on CUDA the forward pass runs once untimed, so Triton compiles are
never measured (the rerun stores the same K/V into the same slots: idempotent).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from backend.kv_cache import PagedKVCache
from backend.model import AttnBatch, DecoderModel
from backend.shapes import TORCH_DTYPES, ModelShape

LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "lm_head")
LAYER_OPS = ("norm", "attn_pre_proj", "rope", "attention", "attn_post_proj", "mlp_up_proj", "mlp_act",
             "mlp_down_proj")


@dataclass(slots=True)
class SeqWork:
    num_new_tokens: int        # tokens computed this step
    num_context_tokens: int    # tokens already cached
    block_ids: list[int]       # block table covering context + new tokens


@dataclass(slots=True)
class StepTiming:
    total_s: float                                                    # the step, scaled to all layers
    breakdown: dict[str, float] = field(default_factory=dict)         # linear/attention/swap/copy/other
    per_layer: dict[str, float] = field(default_factory=dict)         # mean seconds per layer per op


class _Laps:
    """Operator laps: CUDA events on a GPU, perf_counter on the CPU; ``finish`` -> {op: seconds}."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.names: list[str] = []
        self.marks: list = []
        self.start()

    def start(self) -> None:
        self.names.clear()
        self.marks.clear()
        self.marks.append(self._mark())

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def __call__(self, name: str) -> None:
        self.names.append(name)
        self.marks.append(self._mark())

    def finish(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.cuda and self.names:
            self.marks[-1].synchronize()
        for i, name in enumerate(self.names):
            a, b = self.marks[i], self.marks[i + 1]
            dt = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            out[name] = out.get(name, 0.0) + dt
        return out


class StepRunner:
    """The model, its KV cache and the timer. ``run`` performs a step and returns its StepTiming."""

    def __init__(self, shape: ModelShape, device: str = "cuda", block_size: int = 16, num_gpu_blocks: int = 1024,
                 num_cpu_blocks: int = 0, num_layers: int | None = None, seed: int = 0,
                 dtype: str | None = None, cpu_threads: int | None = 1, warmup: bool = True) -> None:
        self.shape = shape
        self.device = torch.device(device)
        if self.device.type == "cpu" and cpu_threads:
            # tiny CPU steps: one thread is faster and far steadier than an oversubscribed pool
            torch.set_num_threads(cpu_threads)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("cuda, but no CUDA device is available (use device: cpu)")
        name = dtype or (shape.dtype if self.device.type == "cuda" else "fp32")
        self.dtype = getattr(torch, TORCH_DTYPES.get(name, "float16"))
        self.num_layers = min(num_layers or shape.num_layers, shape.num_layers)
        self.layer_scale = shape.num_layers / self.num_layers
        self.block_size = block_size
        self.model = DecoderModel(shape, self.num_layers, self.device, self.dtype, seed)
        self.kv = PagedKVCache(self.num_layers, num_gpu_blocks, block_size, shape.num_kv_heads, shape.head_dim,
                               self.dtype, self.device, num_cpu_blocks)
        self.rng = np.random.default_rng(seed)
        self._seen: set[tuple] = set()
        if warmup and num_gpu_blocks >= 2:
            self.warmup()

    def warmup(self) -> None:
        """An untimed prefill and decode in blocks 0-1 (garbage until the simulator writes them), so
        one-time costs (allocator, library handles, kernel compiles) stay out of the first steps."""
        bs = self.block_size
        self.run([SeqWork(bs + 1, 0, [0, 1])])
        self.run([SeqWork(1, bs + 1, [0, 1])])

    def _prepare(self, seqs: list[SeqWork]) -> tuple[torch.Tensor, torch.Tensor, AttnBatch, tuple]:
        """Token ids, positions and attention metadata; prefill/extend sequences first, then decodes."""
        bs = self.block_size
        seqs = [s for s in seqs if s.num_new_tokens > 0]
        pre = [s for s in seqs if not (s.num_new_tokens == 1 and s.num_context_tokens > 0)]
        dec = [s for s in seqs if s.num_new_tokens == 1 and s.num_context_tokens > 0]
        positions, slots, last = [], [], []
        n = 0
        for s in pre + dec:
            pos = np.arange(s.num_context_tokens, s.num_context_tokens + s.num_new_tokens)
            need = -(-(s.num_context_tokens + s.num_new_tokens) // bs)
            if len(s.block_ids) < need:
                raise ValueError(f"block table of {len(s.block_ids)} blocks cannot hold {pos[-1] + 1} tokens")
            table = np.asarray(s.block_ids[:need], dtype=np.int64)
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            n += s.num_new_tokens
            last.append(n - 1)
        dev = self.device

        def tables(group: list[SeqWork]) -> torch.Tensor:
            width = max(-(-(s.num_context_tokens + s.num_new_tokens) // bs) for s in group)
            width = -(-width // 16) * 16                       # few distinct strides, few compiles
            t = np.zeros((len(group), width), dtype=np.int32)
            for i, s in enumerate(group):
                ids = s.block_ids[: -(-(s.num_context_tokens + s.num_new_tokens) // bs)]
                t[i, : len(ids)] = ids
            return torch.from_numpy(t).to(dev)

        def i32(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=dev)

        pos_all = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
        n_pre = sum(s.num_new_tokens for s in pre)
        batch = AttnBatch(
            slot_mapping=torch.from_numpy(np.concatenate(slots) if slots else np.zeros(0, np.int64)).to(dev),
            num_prefill_tokens=n_pre,
            prefill_cu_seqlens=i32([0, *np.cumsum([s.num_new_tokens for s in pre]).tolist()]) if pre else None,
            prefill_context_lens=i32([s.num_context_tokens for s in pre]) if pre else None,
            prefill_block_tables=tables(pre) if pre else None,
            prefill_max_new=max((s.num_new_tokens for s in pre), default=0),
            decode_context_lens=i32([s.num_context_tokens + 1 for s in dec]) if dec else None,
            decode_block_tables=tables(dec) if dec else None,
            last_token_index=torch.tensor(last, dtype=torch.long, device=dev),
        )
        tokens = torch.from_numpy(self.rng.integers(0, self.shape.vocab_size, size=n)).to(dev)
        key = (bool(pre), self._decode_key(len(dec), batch.decode_block_tables))
        return tokens, torch.from_numpy(pos_all).to(dev), batch, key

    def _decode_key(self, num_seqs: int, tables: torch.Tensor | None) -> tuple[int, int]:
        """The decode kernels' compile/autotune variant: (tuning bucket, merge kernel's power of two)."""
        if tables is None or self.device.type != "cuda":
            return (0, 0)
        from backend.kernels.decode import decode_split_plan, decode_tune_bucket
        splits, _, _ = decode_split_plan(num_seqs, self.shape.num_kv_heads, self.shape.head_dim,
                                         self.block_size, tables.shape[1], self.device)
        return decode_tune_bucket(num_seqs, splits), 1 << (splits - 1).bit_length()

    def run(self, seqs: list[SeqWork], copies: list[tuple[int, int]] = (),
            swap_out: list[tuple[int, int]] = (), swap_in: list[tuple[int, int]] = ()) -> StepTiming:
        laps = _Laps(self.device)
        ops: dict[str, float] = {}
        if swap_out or swap_in:
            self.kv.swap_out(list(swap_out))
            self.kv.swap_in(list(swap_in))
            laps("swap")
        if copies:
            self.kv.copy(list(copies))
            laps("copy")
        ops.update(laps.finish())
        if seqs and sum(s.num_new_tokens for s in seqs) > 0:
            tokens, positions, batch, key = self._prepare(seqs)
            if self.device.type == "cuda" and key not in self._seen:
                self.model.forward(tokens, positions, batch, self.kv.k, self.kv.v, lambda _: None)
                self._seen.add(key)
            laps.start()
            self.model.forward(tokens, positions, batch, self.kv.k, self.kv.v, laps)
            ops.update(laps.finish())
        return self._summarize(ops)

    def _summarize(self, ops: dict[str, float]) -> StepTiming:
        scaled = {k: v * (self.layer_scale if k in LAYER_OPS or k in ("swap", "copy") else 1.0)
                  for k, v in ops.items()}
        linear = sum(scaled.get(k, 0.0) for k in LINEAR_OPS)
        breakdown = {"linear": linear, "attention": scaled.get("attention", 0.0),
                     "swap": scaled.get("swap", 0.0), "copy": scaled.get("copy", 0.0)}
        breakdown["other"] = sum(scaled.values()) - sum(breakdown.values())
        per_layer = {k: ops[k] / self.num_layers for k in LAYER_OPS if k in ops}
        return StepTiming(total_s=sum(scaled.values()), breakdown=breakdown, per_layer=per_layer)
