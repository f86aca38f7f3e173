"""Workloads: trace files (azure, mooncake, vidur, burstgpt, csv, jsonl), synthetic generators and
inline request lists, all reshaped the same way and turned into Requests sorted by arrival."""

from sim.workload.build import Workload, build_workload
from sim.workload.config import WorkloadConfig

__all__ = ["Workload", "WorkloadConfig", "build_workload"]
