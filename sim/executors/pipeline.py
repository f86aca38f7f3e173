"""Pipeline parallelism (``hardware.pipeline_parallel`` = p): a step priced as vLLM v1 runs p batches in flight.

vLLM puts each stage's layers on its own tensor-parallel group (sim/pipeline_stages.py) and keeps up to p
batches in flight (the engine's batch queue), each with its own token budget (``max_num_batched_tokens``); a
stage hands its hidden states and residual to the next over ``hardware.pipeline_link``. A request is in one
batch at a time, so it gets a token once its batch has crossed every stage. kvsim keeps one plan a step for
the whole running batch (its token budget p x the per-batch one: ``sim/runner.py``) and prices it as the steady
state of that pipeline (a request's chunk is at most one batch's, as vLLM does not pipeline one request's
chunks: vllm-project/vllm issue 41682):

- the plan is cut into k <= p microbatches of about equal tokens (longest first into the lightest): decodes
  and prefill chunks whole (a chunk over the per-batch budget, which the scheduler does not make, in pieces);
- each microbatch i is priced on each stage s by the cost model of that stage's layers, t[s][i] (the LM head
  and the sampler on the last stage alone; each stage pays its own per-step costs), and each hop between
  stages costs the link's latency plus 2 x tokens x hidden x 2 bytes / (TP x bandwidth) (vLLM sends the hidden
  states and the residual, each TP rank a 1/TP slice);
- the step takes max(the busiest stage's sum over microbatches, the slowest microbatch's way through every
  stage and hop): a full pipeline gives each batch's requests a token once a period, a short one (fewer
  microbatches than stages) once a microbatch has gone all the way.

The breakdown is a stage's mean share of each part, and ``pipeline``: the rest of the step (stages idle
waiting for each other, and the hops). A lone request's decode costs every stage in turn, as it does on one
GPU group holding all layers, plus the hops; p full microbatches cost about one stage's time each.
Not modelled: batches that the queue leaves unbalanced (vLLM keeps a request in the batch it first joined,
so its batches can stay unequal, issues 27462 and 15330; here they are balanced, the best case).
"""

from __future__ import annotations

import heapq
from typing import Any

from sim.executors.cost_model import CostModelExecutor
from sim.executors.engine_params import EngineParams
from sim.pipeline_stages import stage_layers, stage_model
from sim.sched.base import batched_tokens
from sim.sched.plan import ScheduledRequest, StepPlan, StepResult
from sim.specs import HardwareSpec, ModelSpec

HOP_TENSORS = 2   # hidden states and residual cross each stage boundary


class PipelineExecutor:
    """Prices a step over ``len(stages)`` pipeline stages (``stages[s]``: the cost model of stage s)."""

    supports_decode_runs = False   # (each step split into microbatches: priced one at a time)
    shareable = True               # pure pricers below: the engines of one scenario may share one
    drafter = None

    def __init__(self, stages: list[CostModelExecutor], model: ModelSpec, hardware: HardwareSpec,
                 batch_tokens: int, chunked: bool) -> None:
        self.stages = stages
        self.model, self.hardware = model, hardware
        self.batch_tokens = batch_tokens   # a microbatch's token budget (the per-batch max_num_batched_tokens)
        self.chunked = chunked             # prefill chunks may be cut into pieces of at most batch_tokens
        bw, self.hop_latency_s = hardware.pipeline_link_figures()
        self.hop_s_per_token = (HOP_TENSORS * model.hidden_size * model.activation_bytes   # (16-bit under W8A8)
                                / (hardware.tensor_parallel * bw))
        self.swap_s_per_block = 0.0   # (swap and a host tier are refused with a pipeline: scenario.py)

    @classmethod
    def build(cls, model: ModelSpec, hardware: HardwareSpec, params: Any, block_size: int,
              engine: EngineParams | None, scheduler: Any, **describe: Any) -> PipelineExecutor:
        """One cost model a kind of stage (its layer count, and whether it is the last), each on a group of
        ``hardware.tensor_parallel`` GPUs; the first and middle stages compute no logits and sample nothing."""
        p = hardware.pipeline_parallel
        one = hardware.model_copy(update={"pipeline_parallel": 1})
        kinds: dict[tuple[int, bool], CostModelExecutor] = {}
        stages = []
        for i, layers in enumerate(stage_layers(model.num_layers, p)):
            last = i == p - 1
            key = (layers, last)
            if key not in kinds:
                eng = engine
                if engine is not None and not last:
                    eng = EngineParams.from_dict({**engine.to_dict(), "sampler_s": 0.0})
                kinds[key] = CostModelExecutor(stage_model(model, layers, i, p), one, params, block_size, eng,
                                               lm_head=last, **describe)
            stages.append(kinds[key])
        budget = batched_tokens(scheduler, model.max_model_len) if scheduler is not None else 2048
        chunked = bool(getattr(scheduler, "chunked_prefill", False))
        return cls(stages, model, hardware, budget, chunked)

    def microbatches(self, plan: StepPlan) -> list[list[ScheduledRequest]]:
        """The plan cut into at most p microbatches of about equal tokens (see the module docstring)."""
        units: list[tuple[int, int, ScheduledRequest]] = []
        cap = self.batch_tokens
        for s in plan.scheduled:
            n, c = s.num_new_tokens, s.num_context_tokens
            if self.chunked and n > cap and not s.num_draft_tokens:
                for off in range(0, n, cap):
                    m = min(cap, n - off)
                    units.append((m, len(units), ScheduledRequest(s.req_id, m, c + off, [])))
            else:
                units.append((n, len(units), ScheduledRequest(s.req_id, n, c, [], s.num_draft_tokens)))
        k = min(len(self.stages), len(units))
        bins: list[list[ScheduledRequest]] = [[] for _ in range(k)]
        lightest = [(0, i) for i in range(k)]   # (tokens, bin): a heap
        for n, _, entry in sorted(units, key=lambda u: (-u[0], u[1])):
            tokens, i = heapq.heappop(lightest)
            bins[i].append(entry)
            heapq.heappush(lightest, (tokens + n, i))
        return bins

    def execute(self, plan: StepPlan) -> StepResult:
        if plan.blocks_to_copy or plan.blocks_to_swap_in or plan.blocks_to_swap_out:
            raise ValueError("a pipeline prices no block copies or swaps (refused with pipeline_parallel)")
        bins = self.microbatches(plan)
        if not bins:
            return self.stages[-1].execute(plan)
        priced: dict[int, list[StepResult]] = {}   # per stage kind (by identity): each microbatch's result
        for stage in self.stages:
            if id(stage) not in priced:
                priced[id(stage)] = [stage.execute(StepPlan(scheduled=b)) for b in bins]
        per_stage = [priced[id(stage)] for stage in self.stages]
        hops = len(self.stages) - 1
        busiest = max(sum(r.duration_s for r in results) for results in per_stage)
        through = max(sum(results[i].duration_s for results in per_stage)
                      + hops * (self.hop_latency_s + self.hop_s_per_token * sum(e.num_new_tokens for e in b))
                      for i, b in enumerate(bins))
        period = max(busiest, through)
        breakdown: dict[str, float] = {}
        for results in per_stage:
            for r in results:
                for key, value in r.breakdown.items():
                    breakdown[key] = breakdown.get(key, 0.0) + value / len(self.stages)
        breakdown["pipeline"] = period - sum(breakdown.values())
        return StepResult(duration_s=period, breakdown=breakdown)

    def describe(self) -> dict[str, Any]:
        """The last stage's cost model, and the pipeline's shape."""
        bw, lat = self.hardware.pipeline_link_figures()
        return {**self.stages[-1].describe(), "pipeline_parallel": len(self.stages),
                "stage_layers": stage_layers(self.model.num_layers, len(self.stages)),
                "pipeline_link": {"bandwidth_gb_s": bw / 1e9, "latency_s": lat}}
