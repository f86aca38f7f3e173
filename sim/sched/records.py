"""What a scheduler records for the results, in typed columns rather than Python tuples: the timeline's
state changes (``Transitions``, 17 bytes a record) and the inter-token gaps (``TokenGaps``: one pair a
step for the regular gaps, 16 bytes, and a float for each other gap). ``transition_intervals`` and
``intervals_frame`` turn the state changes into the timeline table (req_id, phase, start_s, end_s).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import pandas as pd
import pyarrow as pa


class Phase(IntEnum):
    """What a request is doing, for the timeline."""

    WAITING = 0     # queued, never run
    PREFILL = 1     # computing its prompt (or recomputing prompt + generated tokens)
    DECODE = 2      # generating one token a step
    PREEMPTED = 3   # preempted by recompute, queued again
    SWAPPED = 4     # preempted by swap, its KV in CPU memory
    IDLE = 5        # finished but still holding its memory (static batching)
    DONE = 6        # finished, memory released
    HOST_LOAD = 7   # its prefix coming back from the host tier (kv_cache.cpu_offload_gib), then queued again


class StepGaps:
    """(step duration, tokens with that gap) pairs in two typed columns (16 bytes a pair, not a tuple of
    Python objects): ``append((duration, n))``, ``extend(pairs)``; iterating gives the pairs back in order."""

    __slots__ = ("durations", "counts")

    def __init__(self) -> None:
        self.durations = array("d")
        self.counts = array("q")

    def append(self, pair: tuple[float, int]) -> None:
        d, n = pair
        self.durations.append(d)
        self.counts.append(n)

    def extend(self, pairs: Iterable[tuple[float, int]]) -> None:
        if isinstance(pairs, StepGaps):
            self.durations.extend(pairs.durations)
            self.counts.extend(pairs.counts)
            return
        durations, counts = self.durations, self.counts
        for d, n in pairs:
            durations.append(d)
            counts.append(n)

    def extend_arrays(self, durations: np.ndarray, counts: np.ndarray) -> None:
        """The pairs of two equally long arrays (a decode run's steps), appended as their bytes."""
        self.durations.frombytes(np.ascontiguousarray(durations, dtype=np.float64).tobytes())
        self.counts.frombytes(np.ascontiguousarray(counts, dtype=np.int64).tobytes())

    def __len__(self) -> int:
        return len(self.durations)

    def __iter__(self) -> Iterator[tuple[float, int]]:
        return zip(self.durations, self.counts)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(durations float64, counts int64), views of the columns (no copies; while a view is alive the
        columns cannot grow, so take them once recording is over)."""
        return (np.frombuffer(self.durations, dtype=np.float64) if self.durations else np.zeros(0),
                np.frombuffer(self.counts, dtype=np.int64) if self.counts else np.zeros(0, dtype=np.int64))


class JoinedStepGaps:
    """Several engines' ``StepGaps`` read as one, in their order (a cluster's summary): ``arrays()`` joins
    their columns once, with no growing copy of each."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[StepGaps]) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = [p.arrays() for p in self.parts]
        return (np.concatenate([d for d, _ in pairs]) if pairs else np.zeros(0),
                np.concatenate([c for _, c in pairs]) if pairs else np.zeros(0, dtype=np.int64))


@dataclass
class TokenGaps:
    """Inter-token gaps without one object per token: regular gaps (one step apart) are counted per step."""

    step_gaps: StepGaps = field(default_factory=StepGaps)                 # (step duration, tokens with that gap)
    other_gaps: array = field(default_factory=lambda: array("d"))        # gaps spanning a preemption or a pause


def joined_gaps(parts: list[TokenGaps]) -> TokenGaps:
    """The engines' gaps as one ``TokenGaps``: every regular gap in the engines' order, then every other
    gap in the engines' order (what extending one by each in turn holds)."""
    others = [np.frombuffer(g.other_gaps, dtype=np.float64) for g in parts if len(g.other_gaps)]
    return TokenGaps(JoinedStepGaps([g.step_gaps for g in parts]),   # type: ignore[arg-type]
                     np.concatenate(others) if others else np.zeros(0))   # type: ignore[arg-type]


class Transitions:
    """The timeline's ``(req_id, time, Phase)`` records in three typed columns (17 bytes a record)."""

    __slots__ = ("req_id", "time", "phase")

    def __init__(self) -> None:
        self.req_id = array("q")
        self.time = array("d")
        self.phase = array("b")

    def append(self, record: tuple[int, float, int]) -> None:
        rid, t, phase = record
        self.req_id.append(rid)
        self.time.append(t)
        self.phase.append(phase)

    def __len__(self) -> int:
        return len(self.req_id)

    def __iter__(self) -> Iterator[tuple[int, float, int]]:
        return zip(self.req_id, self.time, self.phase)


PHASE_NAMES = [p.name.lower() for p in Phase]


def transition_intervals(tr: Transitions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The state intervals as columns (req_id, phase index into ``PHASE_NAMES``, start_s, end_s), sorted
    by request then start (stable: records of one request at one time keep their order), each ending
    where the next of its request begins; the final DONE of a request is a point (end_s = start_s)."""
    if not len(tr):
        return (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8), np.zeros(0), np.zeros(0))
    rid = np.frombuffer(tr.req_id, dtype=np.int64)
    start = np.frombuffer(tr.time, dtype=np.float64)
    order = np.lexsort((start, rid))          # stable
    rid = rid[order]
    start = start[order]
    phase = np.frombuffer(tr.phase, dtype=np.int8)[order]
    del order
    end = start.copy()
    same = rid[1:] == rid[:-1]
    end[:-1][same] = start[1:][same]
    return rid, phase, start, end


def labels(codes: np.ndarray, names: list[str]) -> pd.api.extensions.ExtensionArray:
    """``names[codes]`` as a string column (pandas' "str" dtype), decoded from a dictionary array by Arrow:
    no Python string per row."""
    table = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(names, type=pa.string()))
    return pd.array(table.dictionary_decode(), dtype="str")


def intervals_frame(req_id: np.ndarray, phase: np.ndarray, start_s: np.ndarray, end_s: np.ndarray,
                    names: list[str]) -> pd.DataFrame:
    """The timeline table (req_id, phase, start_s, end_s) from columns; ``phase`` holds indices into ``names``."""
    return pd.DataFrame({"req_id": req_id, "phase": labels(phase, names), "start_s": start_s, "end_s": end_s},
                        copy=False)
