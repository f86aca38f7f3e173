"""Property tests (hypothesis stateful) for KVCacheManager, driven the way a scheduler drives it:
admit (with prefix-cache hits), compute a step (sample, fork n sequences or redraw beams, copy-on-write), preempt by
recompute or by swap, swap back in, finish. Random sequences of these must keep every invariant:

- each block's ref count equals the number of block tables (every sequence's) holding it; the prefix
  cache's hold is its findability, not a reference: a cached block is referenced or free;
- free + used = total; no block is both free and referenced; swap blocks likewise;
- the manager's own ``check_integrity`` (slot accounting, cache maps) passes;
- when every request is gone, no GPU or CPU block is referenced and no token slot is held.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sim.kv.manager import KVCacheManager
from sim.request import Request

SETTINGS = settings(max_examples=150, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m: KVCacheManager | None = None
        self.waiting: dict[int, Request] = {}
        self.running: dict[int, Request] = {}   # between steps: every computed token's KV is in place
        self.swapped: dict[int, Request] = {}
        self.next_id = 0

    @initialize(num_blocks=st.integers(4, 24), block_size=st.sampled_from([1, 2, 4, 8]),
                cpu_blocks=st.sampled_from([0, 3, 16]), prefix_caching=st.booleans())
    def setup(self, num_blocks: int, block_size: int, cpu_blocks: int, prefix_caching: bool) -> None:
        self.m = KVCacheManager(num_blocks, block_size, cpu_blocks, prefix_caching)

    # ------------------------------------------------------------ helpers
    def _width(self, req: Request) -> int:
        return self.m.seq_width_now(req.req_id) if req.req_id in self.m.block_tables else 1

    def _allocate(self, req: Request, cached: list[int] | None = None) -> int:
        """Allocate ``req``'s next tokens (its whole remainder, as without a token budget); 0 if no room."""
        bs = self.m.block_size
        num_new = req.num_tokens - req.num_computed_tokens - (len(cached) * bs if cached else 0)
        if not self.m.allocate_slots(req, num_new, cached or None):
            return 0
        if cached:
            event("prefix-cache hit")
        if self.m.take_copies():
            event("copy-on-write")
        return req.num_tokens - req.num_computed_tokens

    def _preempt(self, rid: int, swap: bool) -> None:
        req = self.running.pop(rid)
        if swap and self.m.can_swap_out(req):
            held = len(self.m.block_tables[rid])
            pairs = self.m.swap_out(req)
            assert len(pairs) == held and len({c for _, c in pairs}) == held
            self.swapped[rid] = req
            event("swapped out")
            return
        self.m.free(req)
        req.num_computed_tokens = 0
        self.waiting[rid] = req

    # ------------------------------------------------------------ rules
    @rule(prompt=st.integers(1, 24), output=st.integers(1, 12), n=st.sampled_from([1, 1, 2, 3]),
          beams=st.sampled_from([1, 1, 1, 2, 3]), group=st.sampled_from([-1, 0, 0, 1]), prefix=st.integers(2, 23))
    def arrive(self, prompt: int, output: int, n: int, beams: int, group: int, prefix: int) -> None:
        req = Request(self.next_id, 0.0, prompt, output, n=n if beams == 1 else 1, prefix_group=group,
                      prefix_len=min(prefix, prompt - 1) if group >= 0 else 0)
        req.beam_width = beams
        self.next_id += 1
        if self.m.can_ever_fit(req):
            self.waiting[req.req_id] = req

    @precondition(lambda self: self.running or self.waiting or self.swapped)
    @rule(data=st.data(), swap=st.booleans())
    def engine_step(self, data, swap: bool) -> None:
        """One step as a continuous-batching scheduler plans it, then computes it:
        swapped requests resume, running ones get their next tokens (preempting a not-yet-planned victim,
        possibly itself, when blocks run out), waiting ones are admitted (with prefix hits) if nobody was
        preempted; then every planned token is computed and caught-up requests sample (and fork)."""
        m = self.m
        planned: dict[int, int] = {}
        for rid in data.draw(st.permutations(sorted(self.swapped))):
            req = self.swapped[rid]
            num_new = req.num_tokens - req.num_computed_tokens
            if m.can_swap_in(req, num_new):
                pairs = m.swap_in(req)
                assert [g for _, g in pairs] == m.block_tables[rid]
                assert m.allocate_slots(req, num_new), "swap-in checked the blocks it needs"
                m.take_copies()
                planned[rid] = num_new
                self.running[rid] = self.swapped.pop(rid)
        preempted = False
        todo = [rid for rid in data.draw(st.permutations(sorted(self.running))) if rid not in planned]
        while todo:
            rid = todo[0]
            got = self._allocate(self.running[rid])
            if got:
                planned[rid] = got
                todo.pop(0)
                continue
            event("out of blocks")
            victim = data.draw(st.sampled_from(todo))
            todo.remove(victim)
            self._preempt(victim, swap)
            preempted = True
        if not preempted:
            for rid in data.draw(st.permutations(sorted(self.waiting))):
                req = self.waiting[rid]
                cached = m.match_prefix(req) if m.prefix_cache is not None else []
                got = self._allocate(req, cached)
                if got:
                    planned[rid] = got
                    self.running[rid] = self.waiting.pop(rid)
        computed = 0
        for rid, num_new in planned.items():
            req = self.running[rid]
            computed += num_new * self._width(req)
            req.num_computed_tokens += num_new
            assert req.num_computed_tokens == req.num_tokens
            req.num_generated += 1
        m.note_computed(computed)
        for rid in planned:
            req = self.running[rid]
            if req.num_generated >= req.output_len:
                m.free(self.running.pop(rid))
            elif req.n > 1 or req.beam_width > 1:
                m.on_token(req)
                event("forked" if req.n > 1 else "beam step")

    @precondition(lambda self: self.running)
    @rule(data=st.data(), swap=st.booleans())
    def preempt_between_steps(self, data, swap: bool) -> None:
        """A round-robin turn ending: a running request gives way by swap or recompute."""
        self._preempt(data.draw(st.sampled_from(sorted(self.running))), swap)

    @rule()
    def drain(self) -> None:
        """Every request leaves (finished or cancelled): nothing may stay referenced."""
        for rid in list(self.running):
            self.m.free(self.running.pop(rid))
        for rid in list(self.swapped):  # a swapped request that is dropped gives back its CPU blocks
            req = self.swapped.pop(rid)
            if hasattr(self.m.swap, "drop"):
                self.m.swap.drop(rid)
            else:
                self.m.swap.pool.free(self.m.swap.tables.pop(rid))
            del req
        self.waiting.clear()
        m = self.m
        assert m.pool.num_used == 0, f"{m.pool.num_used} blocks still referenced after every request left"
        assert m.swap.num_used == 0
        token_states, reserved, internal, external, free = m.memory_slots()
        assert (token_states, reserved, internal, external) == (0, 0, 0, 0) and free == m.capacity_slots

    # ------------------------------------------------------------ invariants
    @invariant()
    def ref_counts_equal_holders(self) -> None:
        m = self.m
        if m is None:
            return
        holders: Counter[int] = Counter()
        for rid in m.block_tables:
            for table in m.seq_tables(rid):
                holders.update(table)
        refs = m.pool.ref_counts
        for b in range(m.num_blocks):
            assert refs[b] == holders.get(b, 0), f"block {b}: ref {refs[b]}, held by {holders.get(b, 0)} tables"
        free = set(m.pool.free_order())
        assert all((refs[b] == 0) == (b in free) for b in range(m.num_blocks)), "free and referenced"
        assert m.pool.num_free + m.pool.num_used == m.num_blocks
        if m.prefix_cache is not None:
            for b in m.prefix_cache.hash_of:
                assert refs[b] > 0 or b in free
        # only running requests hold GPU blocks; only swapped ones hold CPU blocks
        assert {rid for rid, t in m.block_tables.items() if t} <= set(self.running)
        assert set(m.swap.tables) == set(self.swapped)
        assert m.swap.num_used == sum(len(t) for t in m.swap.tables.values())
        m.check_integrity()


ManagerMachine.TestCase.settings = SETTINGS
TestManager = ManagerMachine.TestCase
