"""The device KV block pool (per layer, K and V) and the CPU swap pool.

Layout per layer and per K/V: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, so
one block is one contiguous slab and block id b is the same block in every layer::

    layer 0  K: [ blk0 | blk1 | blk2 | ... ]   V: [ blk0 | blk1 | ... ]
    layer 1  K: [ blk0 | blk1 | blk2 | ... ]   V: ...

The swap pool has the same layout with ``num_cpu_blocks`` blocks; with a CUDA device it is pinned
(DMA copies) and allocated up front, on the CPU on first use. Pools are allocated with torch.empty:
untouched pages cost no host memory, and a block holds garbage until written. Invariant: swap out then swap in of the same
blocks, or a block copy, leaves the copied bytes bit-identical.
"""

from __future__ import annotations

import torch

from backend import reference


class PagedKVCache:
    """K and V block pools for ``num_layers`` layers on ``device``, plus a CPU swap pool."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: str | torch.device, num_cpu_blocks: int = 0) -> None:
        self.device = torch.device(device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self._cpu_shape = (num_cpu_blocks, block_size, num_kv_heads, head_dim)
        self._cpu_k: list[torch.Tensor] | None = None
        self._cpu_v: list[torch.Tensor] | None = None
        if self.device.type == "cuda" and num_cpu_blocks:
            self._cpu_pool()  # pinning is slow: do it now, not inside a timed swap

    @property
    def num_layers(self) -> int:
        return len(self.k)

    def block_nbytes(self) -> int:
        """Bytes of one block over all layers, K and V."""
        return 2 * self.num_layers * self.k[0][0].numel() * self.k[0].element_size()

    def _cpu_pool(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The swap pool, allocated on first use (pinned when CUDA is available)."""
        if self._cpu_k is None or self._cpu_v is None:
            pin = torch.cuda.is_available() and self.device.type == "cuda"
            dtype = self.k[0].dtype
            self._cpu_k = [torch.empty(self._cpu_shape, dtype=dtype, pin_memory=pin) for _ in self.k]
            self._cpu_v = [torch.empty(self._cpu_shape, dtype=dtype, pin_memory=pin) for _ in self.v]
        return self._cpu_k, self._cpu_v

    def _check(self, pairs: list[tuple[int, int]], src_n: int, dst_n: int) -> None:
        for s, d in pairs:
            if not (0 <= s < src_n and 0 <= d < dst_n):
                raise IndexError(f"block pair ({s}, {d}) out of range ({src_n}, {dst_n})")

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to CPU blocks: pairs of (gpu block, cpu block)."""
        if not pairs:
            return
        self._check(pairs, self.num_blocks, self.num_cpu_blocks)
        cpu_k, cpu_v = self._cpu_pool()
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=self.device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long)
        for dev, host in zip(self.k + self.v, cpu_k + cpu_v, strict=True):
            host[dst] = dev.index_select(0, src).to("cpu", non_blocking=False)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy CPU blocks to device blocks: pairs of (cpu block, gpu block)."""
        if not pairs:
            return
        self._check(pairs, self.num_cpu_blocks, self.num_blocks)
        cpu_k, cpu_v = self._cpu_pool()
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=self.device)
        for dev, host in zip(self.k + self.v, cpu_k + cpu_v, strict=True):
            staged = host.index_select(0, src)
            if self.device.type == "cuda":
                staged = staged.pin_memory().to(self.device, non_blocking=True)
            dev.index_copy_(0, dst, staged)

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: device block dst := block src in every layer (Triton on CUDA, torch elsewhere)."""
        if not pairs:
            return
        self._check(pairs, self.num_blocks, self.num_blocks)
        mapping = torch.tensor(pairs, dtype=torch.long, device=self.device)
        if self.device.type == "cuda":
            from backend.kernels import copy_blocks
        else:
            copy_blocks = reference.copy_blocks
        copy_blocks(self.k + self.v, mapping)
