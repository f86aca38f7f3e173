"""End-to-end fidelity: replay measured serving runs (sim/data/ground_truth) and compare."""

from sim.fidelity.runs import MeasuredStage, read_runs

__all__ = ["MeasuredStage", "read_runs"]
