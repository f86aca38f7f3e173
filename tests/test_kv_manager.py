"""KVCacheManager (paged): on-demand allocation, exact block tables, slot accounting."""

from sim.kv.manager import KVCacheManager
from sim.request import Request


def req(i, prompt, out):
    return Request(req_id=i, arrival_s=0.0, prompt_len=prompt, output_len=out)


def test_on_demand_blocks_exact_ids():
    m = KVCacheManager(num_blocks=11, block_size=16)
    a, b = req(0, 20, 5), req(1, 16, 40)
    assert m.allocate_slots(a, 20)          # 20 tokens -> 2 blocks
    assert m.allocate_slots(b, 16)          # 16 tokens -> exactly 1 block
    assert m.get_block_table(0) == [0, 1]
    assert m.get_block_table(1) == [2]
    a.num_computed_tokens, b.num_computed_tokens = 20, 16
    m.note_computed(36)
    assert m.allocate_slots(a, 1)           # token 21 fits in block 1 (slots 16..31)
    assert m.get_block_table(0) == [0, 1]
    assert m.allocate_slots(b, 1)           # token 17 needs a new block
    assert m.get_block_table(1) == [2, 3]
    assert m.num_free_blocks() == 7
    m.check_integrity()


def test_refuses_when_full_and_keeps_state():
    m = KVCacheManager(num_blocks=2, block_size=4)
    a = req(0, 8, 3)
    assert m.allocate_slots(a, 8)
    b = req(1, 4, 2)
    assert not m.allocate_slots(b, 4)
    assert m.block_tables[1] == []
    m.check_integrity()


def test_free_returns_tail_first():
    m = KVCacheManager(num_blocks=4, block_size=4)
    a = req(0, 12, 1)
    m.allocate_slots(a, 12)
    m.free(a)
    assert m.pool.free_order() == [3, 2, 1, 0]


def test_slot_accounting_by_hand():
    # block 4; prompt 5, output 4 -> final KV length 5 + 4 - 1 = 8 tokens = 2 blocks
    m = KVCacheManager(num_blocks=4, block_size=4)
    a = req(0, 5, 4)
    m.allocate_slots(a, 5)                   # 2 blocks = 8 slots for 5 tokens
    assert m.memory_slots() == (0, 8, 0, 0, 8)
    a.num_computed_tokens = 5
    m.note_computed(5)
    assert m.memory_slots() == (5, 3, 0, 0, 8)
    # prompt 6, output 1 -> final 6 tokens in 2 blocks: 2 slots never filled
    b = req(1, 6, 1)
    m.allocate_slots(b, 6)
    b.num_computed_tokens = 6
    m.note_computed(6)
    assert m.memory_slots() == (11, 3, 2, 0, 0)
    m.check_integrity()
    m.free(b)
    assert m.memory_slots() == (5, 3, 0, 0, 8)


def test_can_ever_fit():
    m = KVCacheManager(num_blocks=2, block_size=4)
    assert m.can_ever_fit(req(0, 5, 4))      # 8 tokens of KV
    assert not m.can_ever_fit(req(1, 5, 5))  # 9 tokens
