"""What one engine step does (StepPlan) and what it cost (StepResult): the executor's whole input and output."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ScheduledRequest:
    req_id: int
    num_new_tokens: int         # tokens computed this step (1 for a decode step)
    num_context_tokens: int     # tokens already in the KV cache before this step
    block_ids: list[int]        # the request's block table after allocation (shared, do not mutate)


@dataclass
class StepPlan:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # who runs, in batch order
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)      # copy-on-write (src, dst)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu block, cpu block)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)   # (cpu block, gpu block)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def is_empty(self) -> bool:
        return not (self.scheduled or self.blocks_to_copy or self.blocks_to_swap_out or self.blocks_to_swap_in)


@dataclass
class StepResult:
    duration_s: float                                          # simulated time the step takes
    breakdown: dict[str, float] = field(default_factory=dict)  # e.g. linear, attention, swap, overhead (s)
