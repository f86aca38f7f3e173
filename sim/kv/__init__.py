"""KV-cache memory: the block pool, the paged manager, the CPU swap space and the contiguous baselines."""

from __future__ import annotations

from sim.kv.block_pool import BlockPool
from sim.kv.contiguous import ContiguousKVManager
from sim.kv.manager import KVCacheManager
from sim.kv.sliding_only import SlidingKVCacheManager
from sim.kv.window_pages import WindowedKVCacheManager


def make_kv_manager(kv_config, num_gpu_blocks: int, num_cpu_blocks: int, max_model_len: int,
                    host_blocks: int = 0, window: tuple | None = None) -> KVCacheManager:
    """The KV manager a scenario's ``kv_cache`` section asks for (``host_blocks``: its prefix cache's host tier,
    sim/kv/host_tier.py; ``window``: what a model's local layers see, their pages a logical block and the most
    tokens a step computes, for window pages, sim/kv/window_pages.py; no pages: every layer is local, and each
    table is cut to the window, sim/kv/sliding_only.py)."""
    if kv_config.allocator != "paged":
        return ContiguousKVManager(num_gpu_blocks, kv_config.block_size, kv_config.allocator, max_model_len)
    if window is not None and not window[1]:
        local, _, step_tokens = window
        return SlidingKVCacheManager(num_gpu_blocks, kv_config.block_size, local, step_tokens, kv_config.prefix_caching)
    if window is not None:
        return WindowedKVCacheManager(num_gpu_blocks, kv_config.block_size, *window, kv_config.prefix_caching)
    return KVCacheManager(num_gpu_blocks, kv_config.block_size, num_cpu_blocks, kv_config.prefix_caching,
                          host_blocks)


__all__ = ["BlockPool", "ContiguousKVManager", "KVCacheManager", "SlidingKVCacheManager", "WindowedKVCacheManager",
           "make_kv_manager"]
