"""Synthetic token ids, derived on demand from a Request's fields (no token lists are ever stored).

A token's id is a 62-bit mix of where its content comes from:

    position p of sequence s         source key                       equal ids when
    -----------------------------    -------------------------------  -------------------------------
    p < prefix_len (prefix_group g)  (PREFIX, g, p)                   same group, same position
    p < prompt_len, hash_ids given   (CHUNK, hash_ids[p // C], p % C)  same Mooncake chunk id (C = 512)
    other prompt positions           (PROMPT, req_id, p)              never across requests
      of a sample (``sample_of`` w)  (SAMPLED, w, p)                  the samples of one workload request
    p >= prompt_len (generated)      (OUTPUT, req_id, s, p)           never across requests or samples

So requests of one prefix group share their first ``prefix_len`` token ids, Mooncake requests whose
``hash_ids`` agree share those 512-token chunks, the samples a request fans out into (vLLM v1's parallel
sampling: sim/workload/fanout.py) share its whole prompt, and a preempted request that comes back regenerates
the same ids for its own generated tokens (they are a function of position, not of a random draw).

``block_hashes`` chains full blocks the vLLM v1 way: hash(block i) = H(hash(block i-1), tokens of i),
with H built from integer mixing and Python's hash of tuples of ints, which (unlike str hashing) is
not salted per process: the same workload gives the same hashes in every run.
"""

from __future__ import annotations

import numpy as np

from sim.native import native

_PREFIX, _CHUNK, _PROMPT, _OUTPUT, _SAMPLED = 1, 2, 3, 4, 5
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_MASK62 = np.uint64((1 << 62) - 1)
ROOT_HASH = 0x5EED  # the parent hash of a sequence's first block
_LORA = 6           # (keys the chain of a request that names a LoRA adapter: ``root_hash``)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on uint64 (wraps modulo 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _ids(tag: int, a: int, b: int | np.ndarray, pos: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        seed = np.uint64((tag * 0x1000193 + (a & 0xFFFFFFFFFFFF) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF)
        x = _mix(pos.astype(np.uint64) * _GOLD ^ seed)
        x = _mix(x ^ (np.asarray(b).astype(np.uint64) * _M2))
    return (x & _MASK62).astype(np.int64)


def prompt_source(req) -> tuple[int, int]:
    """(tag, key) of ``req``'s own prompt tokens: its own, or the workload request's it is a sample of."""
    return (_SAMPLED, req.sample_of) if req.sample_of >= 0 else (_PROMPT, req.req_id)


def token_ids(req, start: int, end: int, seq: int = 0) -> np.ndarray:
    """Token ids of positions ``start .. end-1`` of sequence ``seq`` of ``req`` (int64 array)."""
    pos = np.arange(start, end, dtype=np.int64)
    out = np.empty(len(pos), dtype=np.int64)
    prompt = req.prompt_len
    plen = req.prefix_len if req.prefix_group >= 0 else 0
    hashes = req.hash_ids
    c = req.hash_block_tokens
    chunked_end = min(prompt, len(hashes) * c) if hashes else 0

    m = pos < plen
    if m.any():
        out[m] = _ids(_PREFIX, req.prefix_group, 0, pos[m])
    m2 = ~m & (pos < chunked_end)
    if m2.any():
        p = pos[m2]
        chunk = np.asarray(hashes, dtype=np.int64)[p // c]
        out[m2] = _ids(_CHUNK, 0, chunk, p % c)
    m3 = ~m & ~m2 & (pos < prompt)
    if m3.any():
        out[m3] = _ids(*prompt_source(req), 0, pos[m3])
    m4 = pos >= prompt
    if m4.any():
        out[m4] = _ids(_OUTPUT, req.req_id, seq, pos[m4])
    return out


_W = _mix(np.arange(1, 1025, dtype=np.uint64) * _GOLD)  # per-slot weights of the block digest


def _mixed_digest(req, start: int, end: int, seq: int) -> int:
    toks = token_ids(req, start, end, seq).astype(np.uint64)
    with np.errstate(over="ignore"):
        return int((_mix(toks) * _W[: end - start]).sum(dtype=np.uint64))


def root_hash(req) -> int:
    """The parent hash of ``req``'s first block: ``ROOT_HASH``, or for a request naming a LoRA adapter one of that
    adapter's own, so that no block of it equals another adapter's or the base model's (vLLM keys every block
    hash with the request's adapter: their KV differs)."""
    return ROOT_HASH if req.lora_id < 0 else hash((ROOT_HASH, _LORA, req.lora_id))


def block_hashes(req, first_block: int, end_block: int, block_size: int, parent: int, seq: int = 0) -> list[int]:
    """Chained hashes of full blocks ``first_block .. end_block-1``; ``parent`` is block first_block-1's
    hash (``ROOT_HASH`` for block 0): block i's is ``hash((hash of block i-1, key of block i))``.

    A block whose tokens all come from one source (see the table above) is keyed by (source, offset):
    its ids are a function of exactly that, so equal keys mean equal ids, without making the ids. A
    block that straddles two sources is keyed by its ids' digest (one numpy pass). The blocks of a run
    from one source are hashed in one call (compiled where sim._native is built: the same tuples, hashed
    by the interpreter, so the same values)."""
    out: list[int] = []
    h = parent
    bs = block_size
    for tag, a, b, start, count, chunks in _runs(req, first_block, end_block, bs, seq):
        if tag == _MIXED:
            h = hash((h, a))
            out.append(h)
        else:
            part = _chain(h, tag, a, b, start, bs, count, chunks, req.hash_block_tokens)
            out += part
            h = part[-1]
    return out


def shareable_blocks(req, block_size: int) -> int:
    """Full blocks of ``req`` before the first that holds a token of its own (its own prompt's or its
    output's, keyed by its req_id): only these can equal another request's blocks."""
    own_from = req.prefix_len if req.prefix_group >= 0 else 0
    if req.hash_ids:
        own_from = max(own_from, min(req.prompt_len, len(req.hash_ids) * req.hash_block_tokens))
    if req.sample_of >= 0:   # (a sample's whole prompt is its siblings')
        own_from = req.prompt_len
    return own_from // block_size


def block_hash_array(req, end_block: int, block_size: int) -> np.ndarray:
    """``block_hashes(req, 0, end_block, block_size, root_hash(req))`` as an int64 array, each run of blocks
    from one source written into it at once where sim._native is built (no Python int a hash)."""
    if native is None:
        return np.array(block_hashes(req, 0, end_block, block_size, root_hash(req)), dtype=np.int64)
    out = np.empty(end_block, dtype=np.int64)
    h = root_hash(req)
    i = 0
    for tag, a, b, start, count, chunks in _runs(req, 0, end_block, block_size, 0):
        if tag == _MIXED:
            h = out[i] = hash((h, a))
        else:
            h = native.chain_hashes(h, tag, a, b, start, block_size, count, chunks, req.hash_block_tokens or 0,
                                    out[i:i + count])
        i += count
    return out


_MIXED = 0   # a block's key is its ids' digest (``a`` in _runs)


def _runs(req, first_block: int, end_block: int, bs: int, seq: int):
    """(tag, a, b, first token, blocks, chunk ids or None) per run of blocks from one source, in order:

    blocks:  [ prefix ... | chunk ... | own prompt ... | output ... ]   (a straddling block: _MIXED)
    """
    prompt = req.prompt_len
    group = req.prefix_group
    plen = req.prefix_len if group >= 0 else 0
    hashes = req.hash_ids
    c = req.hash_block_tokens
    chunked_end = min(prompt, len(hashes) * c) if hashes else 0
    own_from = max(plen, chunked_end)
    rid = req.req_id
    i = first_block
    k = min(end_block, plen // bs)          # blocks inside the shared prefix
    if i < k:
        yield _PREFIX, group, None, i * bs, k - i, None
        i = k
    while i < end_block:
        start = i * bs
        end = start + bs
        if start >= prompt:                  # generated tokens, to the end
            yield _OUTPUT, rid, seq, start, end_block - i, None
            return
        if start >= own_from and end <= prompt:   # the request's own prompt tokens (its samples')
            k = min(end_block, prompt // bs)
            tag, key = prompt_source(req)
            yield tag, key, None, start, k - i, None
        elif start >= plen and end <= chunked_end and start // c == (end - 1) // c:   # inside one chunk
            k = min(end_block, chunked_end // bs) if c % bs == 0 else i + 1   # (aligned: none straddles)
            yield _CHUNK, 0, None, start, k - i, hashes
        else:
            k = i + 1
            yield _MIXED, _mixed_digest(req, start, end, seq), None, start, 1, None
        i = k


def _chain(parent: int, tag: int, a: int, b: int | None, start: int, step: int, count: int, chunks, c: int
           ) -> list[int]:
    """``count`` chained hashes from ``parent``; block j's key (first token s = start + j x step) is
    (tag, chunks[s // c], s % c) with chunks, else (tag, a, s), or (tag, a, b, s) where b is given."""
    if native is not None:
        return native.chain_hashes(parent, tag, a, b, start, step, count, chunks, c or 0)
    starts = range(start, start + count * step, step)
    if chunks is not None:
        keys = [(tag, chunks[s // c], s % c) for s in starts]
    elif b is None:
        keys = [(tag, a, s) for s in starts]
    else:
        keys = [(tag, a, b, s) for s in starts]
    out: list[int] = []
    h = parent
    for key in keys:
        h = hash((h, key))
        out.append(h)
    return out
