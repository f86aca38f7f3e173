"""What one engine step does (StepPlan) and what it cost (StepResult): the executor's whole input and output."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ScheduledRequest:
    req_id: int
    num_new_tokens: int         # tokens computed this step (1 for a decode step)
    num_context_tokens: int     # tokens already in the KV cache before this step
    block_ids: list[int]        # the request's block table after allocation (shared, do not mutate)
    num_draft_tokens: int = 0   # speculative decoding: of the new tokens, drafts to verify (after the last sampled)


class LaneEntries:
    """``StepPlan.scheduled`` of a step with a decode lane (sim/sched/decode_lane.py): the lane's
    requests ``ids``, one new token each over contexts ``ctx`` (numpy arrays) that sum to ``ctx_sum``, then
    the explicit entries ``rest``. Iterates, indexes and measures as the list of ScheduledRequests it stands
    for (the lane's entries are built on demand); pricers read ``ids``/``ctx``/``ctx_sum`` directly."""

    __slots__ = ("ids", "ctx", "ctx_sum", "tables", "rest")

    def __init__(self, ids, ctx, tables: dict[int, list[int]], rest: list[ScheduledRequest] | None = None,
                 ctx_sum: int | None = None) -> None:
        self.ids = ids
        self.ctx = ctx
        self.ctx_sum = int(ctx.sum()) if ctx_sum is None else ctx_sum
        self.tables = tables
        self.rest = [] if rest is None else rest

    def __len__(self) -> int:
        return len(self.ids) + len(self.rest)

    def __bool__(self) -> bool:
        return len(self.ids) > 0 or bool(self.rest)

    def __iter__(self):
        tables = self.tables
        for rid, c in zip(self.ids.tolist(), self.ctx.tolist()):
            yield ScheduledRequest(rid, 1, c, tables.get(rid, []))
        yield from self.rest

    def __getitem__(self, i: int) -> ScheduledRequest:
        if i < 0 and -i <= len(self.rest):
            return self.rest[i]
        return list(self)[i]

    def append(self, entry: ScheduledRequest) -> None:
        self.rest.append(entry)

    def extend(self, entries) -> None:
        self.rest.extend(entries)


@dataclass
class StepPlan:
    scheduled: list[ScheduledRequest] | LaneEntries = field(default_factory=list)  # who runs, in batch order
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)      # copy-on-write (src, dst)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu block, cpu block)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)   # (cpu block, gpu block)
    # LoRA serving (sim/lora.py): distinct adapters of the batch, tokens of its requests that name one, and the
    # seconds the adapters' loads into GPU slots take before the step runs
    lora_adapters: int = 0
    lora_tokens: int = 0
    lora_load_s: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def is_empty(self) -> bool:
        return not (self.scheduled or self.blocks_to_copy or self.blocks_to_swap_out or self.blocks_to_swap_in)


@dataclass
class StepResult:
    duration_s: float                                          # simulated time the step takes
    breakdown: dict[str, float] = field(default_factory=dict)  # e.g. linear, attention, swap, overhead (s)
