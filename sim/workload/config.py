"""The ``workload:`` section of a scenario (pydantic, extra="forbid").

Exactly one of ``trace``, ``synthetic`` or ``requests`` is given. Reshaping keys (limit, start_s,
duration_s, time_scale, rate, max_model_len) apply to any of them, in that order. ``arrival`` gives a
trace new arrival times (a length-only trace needs it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArrivalConfig(_Strict):
    process: Literal["poisson", "gamma", "constant", "burst"] = "poisson"
    rate: float | None = Field(default=None, gt=0)  # requests per second (not for burst)
    cv: float = Field(default=1.0, gt=0)            # gamma: coefficient of variation of inter-arrival times

    @model_validator(mode="after")
    def _need_rate(self) -> ArrivalConfig:
        if self.process != "burst" and self.rate is None:
            raise ValueError(f"arrival process {self.process!r} needs a rate")
        return self


class LengthConfig(_Strict):
    dist: Literal["fixed", "uniform", "lognormal", "zipf", "empirical"] = "fixed"
    value: int | None = Field(default=None, ge=1)   # fixed
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)
    mean: float | None = Field(default=None, gt=0)  # lognormal: mean and std of the lengths themselves
    std: float | None = Field(default=None, gt=0)
    a: float | None = Field(default=None, gt=1)     # zipf exponent
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
    groups: int = Field(default=1, ge=1)
    length: int = Field(ge=1)


class PriorityConfig(_Strict):
    dist: Literal["uniform", "fixed"] = "uniform"
    min: int = 0
    max: int = 0
    value: int = 0


class SyntheticConfig(_Strict):
    num_requests: int = Field(ge=1)
    arrival: ArrivalConfig = ArrivalConfig(process="burst")
    prompt_len: LengthConfig
    output_len: LengthConfig
    shared_prefix: SharedPrefixConfig | None = None
    n: int = Field(default=1, ge=1)
    beam_width: int = Field(default=1, ge=1)
    priority: PriorityConfig | None = None


class InlineRequest(_Strict):
    arrival: float = Field(default=0.0, ge=0)
    prompt_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    priority: int = 0
    n: int = Field(default=1, ge=1)
    beam_width: int = Field(default=1, ge=1)
    prefix_group: int = -1
    prefix_len: int = Field(default=0, ge=0)


class WorkloadConfig(_Strict):
    trace: str | None = None
    format: Literal["azure", "mooncake", "vidur", "burstgpt", "csv", "jsonl"] | None = None
    columns: dict[str, str] | None = None         # csv/jsonl: field -> column name
    time_unit: Literal["s", "ms", "us"] = "s"     # csv/jsonl: unit of a numeric arrival column
    model_filter: str | None = None               # burstgpt: keep rows of this Model only
    arrival: ArrivalConfig | None = None          # trace: replaces (or supplies, for length-only files) arrival times
    synthetic: SyntheticConfig | None = None
    requests: list[InlineRequest] | None = None
    limit: int | None = Field(default=None, ge=1)
    start_s: float | None = Field(default=None, ge=0)
    duration_s: float | None = Field(default=None, gt=0)
    time_scale: float = Field(default=1.0, gt=0)
    rate: float | None = Field(default=None, gt=0)
    max_model_len: int | None = Field(default=None, ge=2)

    @model_validator(mode="after")
    def _exactly_one(self) -> WorkloadConfig:
        given = [k for k in ("trace", "synthetic", "requests") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of trace, synthetic, requests (got {', '.join(given) or 'none'})")
        if self.trace is not None and self.format is None:
            raise ValueError("a trace needs a format (azure, mooncake, vidur, burstgpt, csv, jsonl)")
        if self.arrival is not None and self.trace is None:
            raise ValueError("workload.arrival applies to a trace; a synthetic workload has synthetic.arrival")
        return self
