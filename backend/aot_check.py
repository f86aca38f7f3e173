"""Compile every Triton kernel for a GPU target without a GPU: ``python -m backend.aot_check [--arch 90]``.

The interpreter (the CPU test path) accepts code that the GPU compiler rejects (dot shapes, layouts,
shared memory); this builds the kernels' PTX/cubin for sm_<arch> with Triton's bundled ptxas, so such
errors show up in CI. Arguments get the specialization a real launch gives them (pointers and
strides divisible by 16), and the attention kernels' PTX must load K/V with 16-byte vector loads
(cp.async or ld.global.v4): the bandwidth goal depends on it. Run with TRITON_INTERPRET unset.
Exit 0 when every variant compiles and vectorizes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

NOT_DIVISIBLE = {"num_heads", "split_len", "num_splits", "tune_bucket", "scale_log2"}  # not specialized / odd
VECTOR_LOADS = re.compile(r"cp\.async\.c[ga]\.shared\.global.*?(?:, 16|, 0x10)\b|ld\.global(?:\.\w+)*\.v4")
KERNEL_PTRS = {"q_ptr", "k_ptr", "v_ptr", "out_ptr", "key_ptr", "value_ptr", "cache_ptr"}


def _signature(fn, dtype: str, consts: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in KERNEL_PTRS:
            sig[name] = f"*{dtype}"
        elif name in ("bt_ptr", "lens_ptr", "cu_ptr"):
            sig[name] = "*i32"
        elif name in ("slot_ptr", "map_ptr"):
            sig[name] = "*i64"
        elif name in ("part_out_ptr", "part_lse_ptr"):
            sig[name] = "*fp32"
        elif name == "scale_log2":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def variants(full: bool) -> list[tuple]:
    """(kernel, dtype, constexprs, options): the shapes the backend launches (a subset unless full)."""
    from backend.kernels import cache_ops, decode, prefill

    out = []
    dec = [("fp16", 128, 4, 64, 4, 2, False), ("bf16", 64, 8, 32, 4, 4, True)]
    if full:
        dec += [("fp16", 128, 4, 128, 8, 2, True), ("fp32", 128, 1, 64, 4, 3, True)]
    for dt, d, g, bn, w, st, single in dec:
        consts = dict(GROUP=g, BLOCK_G=max(16, g), HEAD_DIM=d, BLOCK_D=d, BLOCK_SIZE=16, BLOCK_N=bn, SINGLE=single,
                      IEEE=dt == "fp32")
        out.append((decode._decode_split_kernel, dt, consts, {"num_warps": w, "num_stages": st}))
    out.append((decode._decode_merge_kernel, "fp16", dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_SPLITS=8),
                {"num_warps": 4}))
    pre = [("fp16", 128, 4)] + ([("fp32", 64, 1), ("bf16", 128, 8)] if full else [])
    for dt, d, g in pre:
        consts = dict(GROUP=g, HEAD_DIM=d, BLOCK_D=d, BLOCK_SIZE=16, BLOCK_M=64, BLOCK_N=64, IEEE=dt == "fp32")
        out.append((prefill._prefill_kernel, dt, consts, {"num_warps": 8 if d > 64 else 4, "num_stages": 2}))
    out.append((cache_ops._store_kv_kernel, "fp16",
                dict(NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128, BLOCK_SIZE=16), {"num_warps": 4}))
    out.append((cache_ops._copy_blocks_kernel, "fp16", dict(BLOCK=4096), {"num_warps": 4}))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.aot_check", description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (80: A100, 90: H100/H200)")
    p.add_argument("--full", action="store_true", help="every variant (slower)")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: unset TRITON_INTERPRET to compile for a GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", args.arch, 32)
    status = 0
    for fn, dtype, consts, opts in variants(args.full):
        t0 = time.perf_counter()
        sig = _signature(fn, dtype, consts)
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                 if sig[n] != "constexpr" and n not in NOT_DIVISIBLE}
        src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                        attrs=attrs)
        kernel = triton.compile(src, target=target, options=opts)
        vec = len(VECTOR_LOADS.findall(kernel.asm["ptx"]))
        must = fn.__name__ in ("_decode_split_kernel", "_prefill_kernel")
        print(f"sm_{args.arch} {fn.__name__:<22} {dtype:<5} shared={kernel.metadata.shared:>6} B "
              f"16-byte loads={vec:<3} ({time.perf_counter() - t0:.1f} s) {consts}")
        if must and not vec:
            print(f"error: {fn.__name__} ({dtype}) loads K/V without 16-byte vectors", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
