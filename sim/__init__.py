"""kvsim: replay LLM request traces through a simulated serving engine with a paged KV cache.

    from sim import load_scenario, run_scenario
    result = run_scenario(load_scenario("scenarios/quickstart.yaml"))
    result.summary, result.requests, result.steps
"""

from sim.runner import Result, run_scenario
from sim.scenario import Scenario, load_scenario, scenario_from_dict

__all__ = ["Result", "Scenario", "load_scenario", "run_scenario", "scenario_from_dict"]
