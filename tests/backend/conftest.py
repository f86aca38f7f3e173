"""Backend tests: without CUDA, Triton kernels run under the interpreter (set before triton is imported)."""

import os

try:
    import torch
except ImportError:  # the simulator runs without torch; so do its tests
    torch = None

if torch is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

collect_ignore_glob = [] if torch is not None else ["test_*.py"]
