"""Synthetic token ids and chained block hashes: equal exactly where the workload says content is equal,
and the same in every process (no salted hashing)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from sim.request import Request
from sim.workload.tokens import ROOT_HASH, block_hashes, token_ids


def test_prefix_group_tokens_are_shared_and_the_rest_is_not():
    a = Request(0, 0.0, 50, 10, prefix_group=3, prefix_len=40)
    b = Request(1, 0.0, 60, 10, prefix_group=3, prefix_len=40)
    c = Request(2, 0.0, 50, 10, prefix_group=4, prefix_len=40)
    ta, tb, tc = token_ids(a, 0, 50), token_ids(b, 0, 50), token_ids(c, 0, 50)
    assert (ta[:40] == tb[:40]).all()
    assert (ta[40:] != tb[40:]).all()
    assert (ta[:40] != tc[:40]).all()
    assert (token_ids(a, 10, 45) == ta[10:45]).all()          # any window gives the same ids


def test_generated_tokens_differ_per_sample_and_repeat_per_request():
    a = Request(0, 0.0, 8, 10)
    assert (token_ids(a, 8, 12, seq=0) == token_ids(a, 8, 12, seq=0)).all()
    assert (token_ids(a, 8, 12, seq=0) != token_ids(a, 8, 12, seq=1)).all()


def test_mooncake_chunks_share_ids_by_hash_id():
    a = Request(0, 0.0, 1024 + 100, 5, hash_ids=(7, 8, 9))
    b = Request(1, 0.0, 1024, 5, hash_ids=(7, 8))
    c = Request(2, 0.0, 1024, 5, hash_ids=(7, 5))
    assert (token_ids(a, 0, 1024) == token_ids(b, 0, 1024)).all()
    assert (token_ids(a, 0, 512) == token_ids(c, 0, 512)).all()
    assert not (token_ids(a, 512, 1024) == token_ids(c, 512, 1024)).any()
    # chunk 9 covers a's last 100 tokens only; ids beyond the prompt are generated tokens
    assert token_ids(a, 1100, 1130).shape == (30,)


def test_block_hashes_chain_over_the_parent():
    a = Request(0, 0.0, 64, 5, prefix_group=0, prefix_len=40)
    b = Request(1, 0.0, 64, 5, prefix_group=0, prefix_len=40)
    ha, hb = block_hashes(a, 0, 4, 16, ROOT_HASH), block_hashes(b, 0, 4, 16, ROOT_HASH)
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]
    assert block_hashes(a, 2, 4, 16, ha[1]) == ha[2:]          # extending a chain continues it
    # the same content after a different parent is a different block
    assert block_hashes(a, 1, 2, 16, ROOT_HASH) != ha[1:2]


def test_hashes_are_the_same_in_another_process():
    code = ("from sim.request import Request; from sim.workload.tokens import block_hashes, ROOT_HASH; "
            "print(block_hashes(Request(5, 0.0, 100, 5, prefix_group=1, prefix_len=64), 0, 6, 16, ROOT_HASH))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1
    here = block_hashes(Request(5, 0.0, 100, 5, prefix_group=1, prefix_len=64), 0, 6, 16, ROOT_HASH)
    assert outs.pop().strip() == str(here)
    assert np.unique(here).size == 6


def reference_block_hashes(req: Request, first: int, end: int, bs: int, parent: int, seq: int = 0) -> list[int]:
    """Block by block, as the module's table reads: the key of a block from one source is (source,
    offset), of a straddling block the digest of its token ids, chained through Python's hash."""
    from sim.workload import tokens as t

    plen = req.prefix_len if req.prefix_group >= 0 else 0
    c = req.hash_block_tokens
    chunked_end = min(req.prompt_len, len(req.hash_ids) * c) if req.hash_ids else 0
    out, h = [], parent
    for i in range(first, end):
        s, e = i * bs, (i + 1) * bs
        if s >= req.prompt_len:
            key = (t._OUTPUT, req.req_id, seq, s)
        elif e <= plen:
            key = (t._PREFIX, req.prefix_group, s)
        elif s >= max(plen, chunked_end) and e <= req.prompt_len:
            key = (t._PROMPT, req.req_id, s)
        elif s >= plen and e <= chunked_end and s // c == (e - 1) // c:
            key = (t._CHUNK, req.hash_ids[s // c], s % c)
        else:
            ids = token_ids(req, s, e, seq).astype(np.uint64)
            with np.errstate(over="ignore"):
                key = int((t._mix(ids) * t._W[:bs]).sum(dtype=np.uint64))
        h = hash((h, key))
        out.append(h)
    return out


def test_block_hashes_equal_the_block_by_block_reference_compiled_or_not(monkeypatch):
    from sim.workload import tokens

    rng = np.random.default_rng(3)
    reqs = [Request(7, 0.0, 100, 40, prefix_group=2, prefix_len=37),             # prefix ends mid-block
            Request(8, 0.0, 96, 40, prefix_group=2, prefix_len=64),              # prefix ends on a block
            Request(9, 0.0, 1500, 30, hash_ids=(5, 9, 11)),                      # 512-token chunks, own tail
            Request(10, 0.0, 1000, 30, hash_ids=(5, 9), hash_block_tokens=40),  # chunks straddle blocks
            Request(11, 0.0, 700, 30, prefix_group=1, prefix_len=100, hash_ids=(4, 6)),
            Request(12, 0.0, 16, 64)]
    cases = []
    for req in reqs:
        total = (req.prompt_len + req.output_len) // 16
        for _ in range(6):
            first = int(rng.integers(0, total))
            cases.append((req, first, int(rng.integers(first, total + 1)), int(rng.integers(-2**62, 2**62)),
                          int(rng.integers(0, 3))))
        cases.append((req, 0, total, ROOT_HASH, 0))
    for req, first, end, parent, seq in cases:
        expected = reference_block_hashes(req, first, end, 16, parent, seq)
        assert block_hashes(req, first, end, 16, parent, seq) == expected
        with monkeypatch.context() as m:
            m.setattr(tokens, "native", None)
            assert block_hashes(req, first, end, 16, parent, seq) == expected
