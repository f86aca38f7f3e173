"""Test-wide settings: every simulation checks all KV invariants after every step."""

import os

os.environ.setdefault("KVSIM_CHECK_INTEGRITY", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
