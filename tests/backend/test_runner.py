"""StepRunner: slot mapping into the right blocks, layer scaling, breakdown arithmetic (CPU path)."""

import math

import pytest

torch = pytest.importorskip("torch")

from backend.runner import SeqWork, StepRunner  # noqa: E402
from backend.shapes import ModelShape  # noqa: E402

SHAPE = ModelShape(name="t", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                   intermediate_size=128, vocab_size=100, max_model_len=256)


def _runner(**kw):
    r = StepRunner(SHAPE, device="cpu", block_size=16, num_gpu_blocks=8, num_cpu_blocks=2, **kw)
    for t in r.kv.k + r.kv.v:
        t.fill_(float("nan"))
    return r


def _written(cache):
    """Slots (block, offset) that hold finite values."""
    ok = torch.isfinite(cache).all(-1).all(-1)
    return {(int(b), int(o)) for b, o in ok.nonzero()}


def test_prefill_then_decode_write_exactly_their_slots():
    r = _runner()
    r.run([SeqWork(20, 0, [5, 2]), SeqWork(3, 0, [7])])
    want = {(5, i) for i in range(16)} | {(2, 0), (2, 1), (2, 2), (2, 3)} | {(7, 0), (7, 1), (7, 2)}
    for layer in range(r.num_layers):
        assert _written(r.kv.k[layer]) == want and _written(r.kv.v[layer]) == want
    t = r.run([SeqWork(1, 20, [5, 2]), SeqWork(0, 7, [7]), SeqWork(4, 3, [7])])  # decode, idle, extend
    want |= {(2, 4), (7, 3), (7, 4), (7, 5), (7, 6)}
    assert _written(r.kv.k[0]) == want
    assert t.total_s > 0 and math.isclose(t.total_s, sum(t.breakdown.values()))


def test_layer_scaling_and_breakdown_by_hand():
    r = _runner(num_layers=1)                                   # 1 of 4 layers built: scale 4
    assert r.num_layers == 1 and r.layer_scale == 4.0
    ops = {"embed": 0.5, "attn_pre_proj": 1.0, "attention": 2.0, "mlp_act": 0.25, "lm_head": 0.125, "swap": 1.0}
    t = r._summarize(ops)
    assert t.breakdown == {"linear": 4.125, "attention": 8.0, "swap": 4.0, "copy": 0.0, "other": 1.5}
    assert t.total_s == 4.125 + 8.0 + 4.0 + 1.5
    assert t.per_layer["attention"] == 2.0 and "embed" not in t.per_layer


def test_swap_and_copy_only_step():
    r = _runner()
    r.kv.k[0][3].fill_(1.5)
    t = r.run([], copies=[(3, 6)], swap_out=[(3, 1)])
    assert torch.equal(r.kv.k[0][6], r.kv.k[0][3]) and t.breakdown["swap"] > 0 and t.breakdown["copy"] > 0
    assert t.breakdown["attention"] == 0.0


def test_short_block_table_is_an_error():
    with pytest.raises(ValueError, match="cannot hold"):
        _runner().run([SeqWork(17, 0, [1])])
