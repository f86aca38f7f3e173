"""The running batch's decodes as arrays: one step of them costs numpy calls, not a Python pass each.

A continuous scheduler's running batch, in plan order (chunked prefill: decodes first), is

    decodes:   requests past their prompt, one token a step     -> arrays (this lane)
    prefills:  requests still computing their prompt (a few)    -> a list, the general path

A step of the lane: every decode computes one token (its computed count c0_i is its context) and
samples one; the few at a block boundary (c0_i % block_size == 0) call ``allocate_slots`` in batch
order, exactly where the per-request loop would; the executor reads the lane's size and context sum;
``update`` advances the arrays at once. The requests' own counters are written back lazily (``sync``):
for the requests that finish or take a block, as they do, and for all whenever the lane is dropped or
anything else is about to read them (a decode run planned from the requests, the integrity checks, the
run's end). A decode run of the lane's batch is planned from its arrays and moves them on as it applies
(``advance``: k tokens each, its finished requests out), its own write-back syncing them.

Invariants while the lane is held (``ContinuousScheduler._lane``):
- ``reqs`` are the running requests not in their prefill, in running order (ascending ``rank``: the
  order in which they joined ``running``); ``prefills`` the others, in running order;
- once synced, ``comp[i] == reqs[i].num_computed_tokens``, ``gen[i] == reqs[i].num_generated``, and
  ``last`` their last token times; always ``comp[i] == prompt_len + gen[i] - 1``, ``gen[i] >= 1``;
- ``last`` is every request's last token time, or None with ``last_all`` their common time;
- ``left == min(out - gen)`` over the decodes (tokens still to sample; 0 after the step that finishes one);
- ``comp_sum == sum(comp)`` (the lane's contexts summed, exact: the pricers read it every step).
Whatever else changes the batch (preemption, rotation, swap, forks, a decode run planned without the
lane) drops the lane; the scheduler rebuilds it from ``running`` at its next step.
"""

from __future__ import annotations

import numpy as np

from sim.native import native
from sim.request import Request

# the integer columns, rows of one (5, n) array: a request joins or leaves all of them in one numpy call
IDS, COMP, GEN, OUT, RANK = range(5)
_STEP = np.array([[0], [1], [1], [0], [0]], dtype=np.int64)   # a decode step: computed and generated + 1
_STEPS: dict[int, np.ndarray] = {}   # lane size -> _STEP as a full (5, n) array (numpy adds it in half the
                                     # time of a broadcast); at most one per batch size


def _step_of(n: int) -> np.ndarray:
    """``_STEP`` broadcast to a lane of ``n`` decodes (cached, never written)."""
    step = _STEPS.get(n)
    if step is None:
        step = _STEPS[n] = np.repeat(_STEP, n, axis=1)
        step.flags.writeable = False
    return step


class DecodeLane:
    __slots__ = ("reqs", "cols", "last", "last_all", "prefills", "prefill_ranks", "synced", "left", "comp_sum")

    def __init__(self, reqs: list[Request], cols: np.ndarray, last: np.ndarray, prefills: list[Request],
                 prefill_ranks: list[int]) -> None:
        """The lane of decodes ``reqs`` with their columns ``cols`` (5 x n: IDS, COMP, GEN, OUT, RANK) and last
        token times ``last``, beside the requests still in their prefill."""
        self.reqs = reqs
        self.cols = cols
        self.last: np.ndarray | None = last
        self.last_all = 0.0
        self.prefills = prefills
        self.prefill_ranks = prefill_ranks
        self.synced = True   # the requests' counters equal the arrays
        self.left = self._fewest_left()
        self.comp_sum = int(self.cols[COMP].sum())

    def _fewest_left(self) -> int:
        """The fewest tokens any decode has left to sample (``left``: no decode finishes before that many
        steps; a large number when there are none)."""
        cols = self.cols
        return int(np.minimum.reduce(cols[OUT] - cols[GEN])) if cols.shape[1] else 1 << 62

    @staticmethod
    def build(running: list[Request], prefilling: set[int], ranks: dict[int, int]) -> DecodeLane | None:
        """The lane of ``running`` (None when a request that is not prefilling has other than one token
        to compute: the general path handles that step)."""
        reqs = [r for r in running if r.req_id not in prefilling] if prefilling else list(running)
        n = len(reqs)
        cols = np.empty((5, n), dtype=np.int64)
        last = np.empty(n, dtype=np.float64)
        if native is not None:   # (compiled: the columns and every request's check in one pass)
            if not native.lane_columns(reqs, ranks, cols, last):
                return None
        else:
            for r in reqs:
                if r.num_generated <= 0 or r.prompt_len + r.num_generated - r.num_computed_tokens != 1:
                    return None
            cols[:] = np.fromiter((x for r in reqs for x in (r.req_id, r.num_computed_tokens, r.num_generated,
                                                             r.output_len, ranks[r.req_id])),
                                  np.int64, 5 * n).reshape(n, 5).T
            last[:] = np.fromiter((r.last_token_s for r in reqs), np.float64, n)
        prefills = [r for r in running if r.req_id in prefilling] if prefilling else []
        return DecodeLane(reqs, cols, last, prefills, [ranks[r.req_id] for r in prefills])

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def ids(self) -> np.ndarray:
        return self.cols[IDS]

    @property
    def comp(self) -> np.ndarray:
        """Computed tokens (each decode's context before its step)."""
        return self.cols[COMP]

    @property
    def gen(self) -> np.ndarray:
        return self.cols[GEN]

    @property
    def out(self) -> np.ndarray:
        return self.cols[OUT]

    @property
    def rank(self) -> np.ndarray:
        return self.cols[RANK]

    def last_times(self) -> np.ndarray:
        if self.last is None:
            return np.full(len(self.reqs), self.last_all)
        return self.last

    def boundary(self, idx: np.ndarray, block_size: int) -> tuple[list[int], list[int]]:
        """For the decodes at positions ``idx`` (each computed count a multiple of ``block_size``): their
        computed counts, and the positions among them whose next block is their table's final one, with
        slots past the request's last KV token.

        With comp = m x block_size and r = out - gen >= 1 tokens of KV still to come (max_kv = prompt +
        output - 1 = comp + r), the table of m + 1 blocks is the final one iff r <= block_size, and that
        block has slots to spare iff r is not a multiple of block_size: both iff r < block_size."""
        sub = self.cols[:, idx]
        final = sub[OUT] - sub[GEN] < block_size
        return sub[COMP].tolist(), idx[final].tolist()

    # ------------------------------------------------------------ changes the lane follows
    def joined(self, req: Request, rank: int) -> None:
        """``req`` joined the end of ``running`` in its prefill."""
        self.prefills.append(req)
        self.prefill_ranks.append(rank)

    def prefilled(self, req: Request) -> bool:
        """``req`` (one of ``prefills``) sampled its first token: it moves to the decodes at its running
        position. False when it is not one of them (the lane is then dropped)."""
        i = _index(self.prefills, req)
        if i < 0 or req.num_generated <= 0 or req.prompt_len + req.num_generated - req.num_computed_tokens != 1:
            return False
        del self.prefills[i]
        rank = self.prefill_ranks.pop(i)
        ranks = self.cols[RANK]
        n = len(ranks)
        # (usually it joined running after every decode: its place is the end)
        at = n if n == 0 or rank > int(ranks[n - 1]) else int(ranks.searchsorted(rank))
        if self.last is not None or req.last_token_s != self.last_all:   # else: still one common time
            self.last = _put(self.last_times(), at, req.last_token_s)
        self.reqs.insert(at, req)
        self.cols = _put_column(self.cols, at, (req.req_id, req.num_computed_tokens, req.num_generated,
                                                req.output_len, rank))
        self.left = min(self.left, req.output_len - req.num_generated)
        self.comp_sum += req.num_computed_tokens
        return True

    def finished_prefill(self, req: Request) -> bool:
        """``req``, one of ``prefills``, finished with its first token (an output of one token)."""
        i = _index(self.prefills, req)
        if i < 0:
            return False
        del self.prefills[i]
        del self.prefill_ranks[i]
        return True

    def finished(self) -> list[int]:
        """Positions of the decodes that sampled their last token (generated == output), ascending."""
        cols = self.cols
        if native is not None:   # (compiled: one pass)
            return native.lane_finished(cols[GEN], cols[OUT])
        return (cols[GEN] >= cols[OUT]).nonzero()[0].tolist()

    def drop(self, at: list[int]) -> None:
        """Drop the decodes at positions ``at`` (ascending, not empty): they finished."""
        reqs = self.reqs
        for i in reversed(at):
            del reqs[i]
        if self.last is None and self._compact(at):
            return
        cols = self.cols
        comp = cols[COMP]
        for i in at:
            self.comp_sum -= comp.item(i)
        mask = np.ones(cols.shape[1], dtype=bool)
        mask[at] = False
        self.cols = cols[:, mask]
        if self.last is not None:
            self.last = self.last[mask]
        self.left = self._fewest_left()

    def _compact(self, at: list[int], k: int = 0) -> bool:
        """The columns without the decodes at positions ``at`` (ascending), the others ``k`` tokens on, with
        ``left`` and ``comp_sum`` to match, in one compiled pass; False, nothing done, where it is not built
        (or the columns are not contiguous): the caller's numpy path applies."""
        cols = self.cols
        if native is None or not cols.flags.c_contiguous:
            return False
        new = np.empty((5, cols.shape[1] - len(at)), dtype=np.int64)
        self.left, gone = native.lane_compact(cols, at, new, k)
        self.comp_sum += k * new.shape[1] - gone
        self.cols = new
        return True

    def step(self, now: float) -> None:
        """Every decode computed one token and sampled one at ``now`` (the arrays; the requests at ``sync``)."""
        self.cols = self.cols + _step_of(self.cols.shape[1])   # (a new array: the step's plan keeps its contexts)
        self.comp_sum += self.cols.shape[1]
        self.left -= 1
        self.last = None
        self.last_all = now
        self.synced = False

    def advance(self, k: int, end: float, keep: np.ndarray) -> None:
        """A decode run of ``k`` steps (sim/sched/decode_run_apply.py) moved every decode ``k`` tokens on, all
        sampled last at ``end``; those where ``keep`` is False finished in it and leave. The requests'
        counters are the run's to write (``synced`` False until it does)."""
        cols = self.cols
        at = [] if np.count_nonzero(keep) == len(keep) else (~keep).nonzero()[0].tolist()
        reqs = self.reqs
        for i in reversed(at):
            del reqs[i]
        if not self._compact(at, k):
            if at:
                cols = cols[:, keep]
            self.cols = cols + k * _STEP
            self.comp_sum = int(self.cols[COMP].sum())
            self.left = self._fewest_left()
        self.last = None
        self.last_all = end
        self.synced = False

    def sync(self) -> None:
        """Write the arrays back to the requests."""
        if self.synced:
            return
        last = self.last_times().tolist()
        for req, c, g, t in zip(self.reqs, self.cols[COMP].tolist(), self.cols[GEN].tolist(), last):
            req.num_computed_tokens = c
            req.num_generated = g
            req.last_token_s = t
        self.synced = True

    def write(self, at: list[int]) -> None:
        """Write the arrays back to the requests at positions ``at`` (about to be read or to leave)."""
        if self.synced:
            return
        reqs, comp, gen, last = self.reqs, self.cols[COMP], self.cols[GEN], self.last
        for i in at:
            req = reqs[i]
            req.num_computed_tokens = int(comp[i])
            req.num_generated = int(gen[i])
            req.last_token_s = self.last_all if last is None else float(last[i])


def _put(a: np.ndarray, at: int, value) -> np.ndarray:
    """``a`` with ``value`` inserted before position ``at`` (np.insert without its generality's cost)."""
    out = np.empty(len(a) + 1, dtype=a.dtype)
    out[:at] = a[:at]
    out[at] = value
    out[at + 1:] = a[at:]
    return out


def _put_column(a: np.ndarray, at: int, values: tuple) -> np.ndarray:
    """The 2-D ``a`` with the column ``values`` inserted before column ``at``."""
    rows, n = a.shape
    out = np.empty((rows, n + 1), dtype=a.dtype)
    out[:, :at] = a[:, :at]
    out[:, at] = values
    out[:, at + 1:] = a[:, at:]
    return out


def _index(reqs: list[Request], req: Request) -> int:
    """Position of ``req`` (by identity) in a short list, or -1."""
    for i, r in enumerate(reqs):
        if r is req:
            return i
    return -1
