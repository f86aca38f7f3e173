"""The flash-attention inner step shared by the decode and prefill kernels (Triton, inlined at compile time).

Scores are in base 2 (already multiplied by log2(e) / sqrt(head_dim)); masked entries are -inf. After
every tile: m = running row max, l = running sum of exp2(s - m), acc = running sum of exp2(s - m) V,
so the output is acc / l once every tile is seen.
"""

import triton
import triton.language as tl


@triton.jit
def qk_scores(q, k, IEEE: tl.constexpr):
    """q [M, D] x k [N, D]^T in fp32 (IEEE: exact fp32 products, for the fp32 caches)."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    return s


@triton.jit
def online_softmax_step(acc, m_i, l_i, s, v, IEEE: tl.constexpr):
    """Fold one tile of base-2 scores ``s`` [M, N] and values ``v`` [N, D] into (acc, m, l)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i
