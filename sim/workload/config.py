"""The ``workload:`` section of a scenario (pydantic, extra="forbid").

Exactly one of ``trace``, ``synthetic`` or ``requests`` is given. Reshaping keys (limit, start_s,
duration_s, time_scale, rate, max_model_len) apply to any of them, in that order. ``arrival`` gives a
trace new arrival times (a length-only trace needs it).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim import limits as L

HASH_ID_MAX = 2**62 - 1   # a content id fits the token ids' 62 bits


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ArrivalConfig(_Strict):
    process: Literal["poisson", "gamma", "constant", "burst"] = "poisson"
    rate: float | None = Field(default=None, ge=L.MIN_RATE, le=L.MAX_RATE)  # requests per second (not burst)
    cv: float = Field(default=1.0, ge=1e-3, le=1e3)            # gamma: coefficient of variation of inter-arrival times

    @model_validator(mode="after")
    def _need_rate(self) -> ArrivalConfig:
        if self.process != "burst" and self.rate is None:
            raise ValueError(f"arrival process {self.process!r} needs a rate")
        return self


class LengthConfig(_Strict):
    dist: Literal["fixed", "uniform", "lognormal", "zipf", "empirical"] = "fixed"
    value: int | None = Field(default=None, ge=1, le=L.MAX_TOKENS)   # fixed
    min: int = Field(default=1, ge=1, le=L.MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=L.MAX_TOKENS)
    mean: float | None = Field(default=None, gt=0, le=L.MAX_TOKENS)  # lognormal: mean and std of the lengths themselves
    std: float | None = Field(default=None, gt=0, le=L.MAX_TOKENS)
    a: float | None = Field(default=None, gt=1, le=100)     # zipf exponent
    trace: str | None = None                        # empirical: resample from this trace's lengths
    format: str | None = None

    @model_validator(mode="after")
    def _need_params(self) -> LengthConfig:
        need = {"fixed": ["value"], "uniform": ["max"], "lognormal": ["mean", "std"], "zipf": ["a"],
                "empirical": ["trace"]}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"length dist {self.dist!r} needs {', '.join(missing)}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class SharedPrefixConfig(_Strict):
    groups: int = Field(default=1, ge=1, le=L.MAX_REQUESTS)
    length: int = Field(ge=1, le=L.MAX_TOKENS)


class PriorityConfig(_Strict):
    dist: Literal["uniform", "fixed"] = "uniform"
    min: int = Field(default=0, ge=-L.MAX_PRIORITY, le=L.MAX_PRIORITY)
    max: int = Field(default=0, ge=-L.MAX_PRIORITY, le=L.MAX_PRIORITY)
    value: int = Field(default=0, ge=-L.MAX_PRIORITY, le=L.MAX_PRIORITY)


class SyntheticConfig(_Strict):
    num_requests: int = Field(ge=1, le=L.MAX_REQUESTS)
    arrival: ArrivalConfig = ArrivalConfig(process="burst")
    prompt_len: LengthConfig
    output_len: LengthConfig
    shared_prefix: SharedPrefixConfig | None = None
    n: int = Field(default=1, ge=1, le=L.MAX_SAMPLES)
    # a request's samples: all as long as its output_len, or (fanned out: scheduler.parallel_sampling) each
    # of the others drawing its own from output_len, as samples that stop at their own end of sequence do
    sample_lengths: Literal["same", "independent"] = "same"
    beam_width: int = Field(default=1, ge=1, le=L.MAX_SAMPLES)
    priority: PriorityConfig | None = None


class InlineRequest(_Strict):
    arrival: float = Field(default=0.0, ge=0, le=L.MAX_TIME_S)
    prompt_len: int = Field(ge=1, le=L.MAX_TOKENS)
    output_len: int = Field(ge=1, le=L.MAX_TOKENS)
    priority: int = Field(default=0, ge=-L.MAX_PRIORITY, le=L.MAX_PRIORITY)
    n: int = Field(default=1, ge=1, le=L.MAX_SAMPLES)
    beam_width: int = Field(default=1, ge=1, le=L.MAX_SAMPLES)
    lora: int = Field(default=-1, ge=-1, le=L.MAX_REQUESTS)   # its LoRA adapter (the lora section, adapters: 0)
    prefix_group: int = Field(default=-1, ge=-1, le=L.MAX_REQUESTS)
    prefix_len: int = Field(default=0, ge=0, le=L.MAX_TOKENS)
    # the prompt's content, one id per workload.hash_block_tokens tokens (as Mooncake's hash_ids): requests
    # whose ids agree over their first chunks share those tokens (and their prefix-cache blocks)
    hash_ids: list[Annotated[int, Field(ge=0, le=HASH_ID_MAX)]] | None = Field(default=None, max_length=L.MAX_TOKENS)


class ConcurrencyStep(_Strict):
    """From ``from_s`` on (by a request's arrival), at most ``limit`` requests in flight."""

    from_s: float = Field(ge=0, le=L.MAX_TIME_S)
    limit: int = Field(ge=1, le=L.MAX_REQUESTS)


class WorkloadConfig(_Strict):
    trace: str | None = None
    format: Literal["azure", "mooncake", "vidur", "burstgpt", "csv", "jsonl"] | None = None
    columns: dict[str, str] | None = None         # csv/jsonl: field -> column name
    time_unit: Literal["s", "ms", "us"] = "s"     # csv/jsonl: unit of a numeric arrival column
    model_filter: str | None = None               # burstgpt: keep rows of this Model only
    arrival: ArrivalConfig | None = None          # trace: replaces (or supplies, for length-only files) arrival times
    synthetic: SyntheticConfig | None = None
    requests: list[InlineRequest] | None = Field(default=None, max_length=L.MAX_REQUESTS)
    limit: int | None = Field(default=None, ge=1, le=L.MAX_REQUESTS)
    start_s: float | None = Field(default=None, ge=0, le=L.MAX_TIME_S)
    duration_s: float | None = Field(default=None, gt=0, le=L.MAX_TIME_S)
    time_scale: float = Field(default=1.0, ge=L.MIN_TIME_SCALE, le=L.MAX_TIME_SCALE)
    rate: float | None = Field(default=None, ge=L.MIN_RATE, le=L.MAX_RATE)
    max_model_len: int | None = Field(default=None, ge=2, le=L.MAX_TOKENS)
    hash_block_tokens: int | None = Field(default=None, ge=1, le=L.MAX_TOKENS)   # inline hash_ids: tokens an id (512)
    # a client with at most this many requests in flight: each is sent at max(its arrival, a free slot); or
    # stages of limits, each for the requests arriving from its from_s on (the first from 0)
    max_concurrency: Annotated[int, Field(ge=1, le=L.MAX_REQUESTS)] | list[ConcurrencyStep] | None = None
    think_time_s: float = Field(default=0.0, ge=0, le=L.MAX_TIME_S)   # a slot's pause after its response
    think_time_dist: Literal["fixed", "exponential"] = "fixed"        # that pause: always, or its mean
    # the client gives up on a request not finished this long after it was sent: the engine aborts it at its
    # next step (vLLM aborts a request whose client disconnected), its KV freed
    timeout_s: float | None = Field(default=None, gt=0, le=L.MAX_TIME_S)

    @model_validator(mode="after")
    def _exactly_one(self) -> WorkloadConfig:
        given = [k for k in ("trace", "synthetic", "requests") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of trace, synthetic, requests (got {', '.join(given) or 'none'})")
        if self.trace is not None and self.format is None:
            raise ValueError("a trace needs a format (azure, mooncake, vidur, burstgpt, csv, jsonl)")
        if self.hash_block_tokens is not None and self.requests is None:
            raise ValueError("workload.hash_block_tokens applies to inline requests' hash_ids (a Mooncake trace "
                             "has 512 tokens an id)")
        steps = self.max_concurrency
        if isinstance(steps, list):
            if not steps or steps[0].from_s != 0:
                raise ValueError("workload.max_concurrency: the first stage starts at from_s: 0")
            if any(b.from_s <= a.from_s for a, b in zip(steps, steps[1:])):
                raise ValueError("workload.max_concurrency: the stages' from_s must increase")
        if (self.think_time_s or self.think_time_dist != "fixed") and self.max_concurrency is None:
            raise ValueError("workload.think_time_s is the pause of a client slot: it needs workload.max_concurrency")
        if self.arrival is not None and self.trace is None:
            raise ValueError("workload.arrival applies to a trace; a synthetic workload has synthetic.arrival")
        return self
