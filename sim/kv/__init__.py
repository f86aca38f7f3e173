"""KV-cache memory: the block pool, the paged manager, and (later) prefix cache and contiguous baselines."""

from __future__ import annotations

from sim.kv.block_pool import BlockPool
from sim.kv.manager import KVCacheManager


def make_kv_manager(kv_config, num_gpu_blocks: int, num_cpu_blocks: int, max_model_len: int) -> KVCacheManager:
    """The KV manager a scenario's ``kv_cache`` section asks for."""
    if kv_config.allocator != "paged":
        raise NotImplementedError(f"allocator {kv_config.allocator!r} is not built yet")
    return KVCacheManager(num_gpu_blocks, kv_config.block_size)


__all__ = ["BlockPool", "KVCacheManager", "make_kv_manager"]
