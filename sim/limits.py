"""The bounds kvsim works within; inputs beyond them are refused up front with one line naming the key.

They keep a run's memory and time bounded (each request, block and grid point costs memory) and keep
every count and time inside int64 / finite float arithmetic. README.md ("Limits") lists them.
"""

from __future__ import annotations

MAX_REQUESTS = 2_000_000            # requests in one run (synthetic num_requests, inline list, trace rows)
MAX_TOKENS = 10_000_000             # tokens in one prompt or one output (and max_model_len, token budgets)
MAX_BLOCKS = 50_000_000             # GPU blocks, and CPU (swap) blocks, in one run
MAX_SWAP_GB = 65_536.0              # kv_cache.swap_space_gb (per GPU)
MAX_GB = 65_536.0                   # other sizes in GB (activation_reserve_gb)
MAX_TRACE_BYTES = 1 << 30           # 1 GiB: a trace file
MAX_SEED = 2**63 - 1
MIN_RATE = 1e-6                     # requests per second
MAX_RATE = 1e9
MAX_TIME_S = 1e12                   # any time in seconds (arrivals, windows)
MIN_TIME_SCALE = 1e-9
MAX_TIME_SCALE = 1e9
MAX_SAMPLES = 256                   # n and beam_width of one request
MAX_PRIORITY = 2**31 - 1            # |priority|
MAX_SEQS = 1_000_000                # scheduler.max_num_seqs
MAX_WATCHDOG_STEPS = 10**9
MAX_GRID_RUNS = 10_000              # grid points x repeats in one sweep
MAX_TP = 64                         # hardware.tensor_parallel
