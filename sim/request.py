"""A request and its lifecycle.

    WAITING -> RUNNING -> (PREEMPTED | SWAPPED -> RUNNING)* -> FINISHED
    WAITING -> REJECTED (it can never fit; ``reject_reason`` says why)
    WAITING | RUNNING | PREEMPTED -> ABORTED (its client gave up: ``workload.timeout_s``; the reason says so)

Token accounting follows vLLM: ``num_tokens = prompt_len + num_generated``; ``num_computed_tokens``
catches up with it. A step that brings ``num_computed_tokens`` up to ``num_tokens`` samples one new
token (``num_generated += 1``). The last generated token's KV is never computed, so a request holds
at most ``prompt_len + output_len - 1`` tokens of KV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum


class RequestStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    SWAPPED = 3
    FINISHED = 4
    REJECTED = 5
    ABORTED = 6   # its client gave up (workload.timeout_s) before it finished


@dataclass(slots=True)
class Request:
    # --- workload fields (immutable during a run) ---
    req_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    priority: int = 0                      # lower value is served first by the priority policy
    n: int = 1                             # parallel samples
    prefix_group: int = -1                 # requests of one group share their first prefix_len tokens
    prefix_len: int = 0
    hash_ids: tuple[int, ...] | None = None  # Mooncake: one id per hash_block_tokens prompt tokens
    hash_block_tokens: int = 512
    beam_width: int = 1                    # beam search: beams kept per step (memory pattern only)
    sample_of: int = -1                    # fanned out (scheduler.parallel_sampling: fanout): one of the samples
                                           # of this workload request, whose prompt (its token ids) it repeats
    lora_id: int = -1                      # the LoRA adapter it names (sim/lora.py); -1: the base model
    # --- state (owned by the scheduler) ---
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_generated: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int = 0             # prompt tokens served from the prefix cache at first admission
    first_scheduled_s: float = math.nan
    first_token_s: float = math.nan
    last_token_s: float = math.nan
    finish_s: float = math.nan
    reject_reason: str = ""
    turn_start_step: int = 0               # round-robin: the step at which the current turn began
    kv_received: bool = False              # prefill/decode: handed to a decode replica with its prompt's KV,
                                           # not yet admitted there (its first step there is a decode)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_generated

    @property
    def max_kv_tokens(self) -> int:
        """The most tokens of KV this request ever holds (the last sampled token is never cached)."""
        return self.prompt_len + self.output_len - 1

    @property
    def is_finished(self) -> bool:
        return self.num_generated >= self.output_len
