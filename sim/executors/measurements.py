"""Operator timings from files, in one long table, whatever format they came in.

Two formats, recognised by their columns:

- Vidur per-operator CSVs (``time_stats.{OP}.{min,max,mean,median,std}`` in ms, plus n_head, n_kv_head,
  n_embd, n_expanded_embd, vocab_size, use_gated_mlp, num_tokens, num_tensor_parallel_workers). One row
  is one (num_tokens, TP) point of one model; the operators ran on one TP shard. The median is used.
- Vidur all-reduce CSVs (``time_stats.all_reduce.*`` in ms, ``size`` in bytes, ``num_workers``,
  ``devices_per_node``): single-node rows become ``all_reduce`` rows with ``num_tokens`` = bytes and
  ``tp`` = workers.
- The project's profile CSV (``model,device,kind,batch_size,num_tokens,context_len,operator,time_ms``),
  written by ``kvsim profile``; ``model`` is a preset name.

The long table has one row per (point, operator): ``source, model, tp, kind, batch_size, num_tokens,
context_len, operator, time_s``, the model's shape ``hidden, heads, kv_heads, head_dim, inter, vocab,
gated, dtype_bytes`` and ``device`` (the profile's ``cuda`` or ``cpu``; ``cuda`` for Vidur's GPU tables).
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import KvsimError
from sim.specs import ModelSpec

LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
VIDUR_OPS = LINEAR_OPS + ELEMENTWISE_OPS
PROFILE_COLUMNS = ["model", "device", "kind", "batch_size", "num_tokens", "context_len", "operator", "time_ms"]
PROFILE_OPS = LINEAR_OPS + ("attention", "step")
VIDUR_SHAPE = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
               "num_tensor_parallel_workers"]
COLUMNS = ["source", "model", "tp", "kind", "batch_size", "num_tokens", "context_len", "operator", "time_s",
           "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "gated", "dtype_bytes", "device"]


def read_csv_checked(path: Path) -> pd.DataFrame:
    """A CSV as a DataFrame, or a KvsimError naming the file and line: missing, a directory, not UTF-8,
    empty, header only, or unparsable. Blank lines are kept (as rows of NaN) so row i is line i + 2."""
    if path.is_dir():
        raise KvsimError(str(path), "is a directory, not a CSV file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise KvsimError(str(path), f"cannot read ({exc.strerror or exc})") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise KvsimError(f"{path}:{line}", f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {col})") from exc
    try:
        df = pd.read_csv(io.StringIO(text), skip_blank_lines=False)
    except pd.errors.EmptyDataError as exc:
        raise KvsimError(f"{path}:1", "empty file: no header and no rows") from exc
    except pd.errors.ParserError as exc:
        raise KvsimError(str(path), f"cannot parse CSV ({' '.join(str(exc).split())})") from exc
    if df.empty:
        raise KvsimError(f"{path}:2", "header only: no data rows")
    return df


def require_numbers(df: pd.DataFrame, columns: list[str], path: Path) -> None:
    """Raise a KvsimError at the first cell of ``columns`` that is empty, NaN, infinite or not a number."""
    for col in columns:
        values = pd.to_numeric(df[col], errors="coerce").astype(float)
        bad = ~np.isfinite(values.to_numpy())
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raw = df[col].iloc[i]
            missing = raw is None or (isinstance(raw, float) and math.isnan(raw)) or str(raw).strip().lower() == "nan"
            what = "missing value (empty or NaN)" if missing else f"{str(raw)!r} is not a finite number"
            raise KvsimError(f"{path}:{i + 2}", f"column {col}: {what}")


def _vidur(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    missing = [c for c in VIDUR_SHAPE if c not in df.columns]
    if missing:
        raise KvsimError(str(path), f"Vidur CSV lacks columns {', '.join(missing)}")
    require_numbers(df, [c for c in VIDUR_SHAPE if c != "use_gated_mlp"]
                    + [f"time_stats.{op}.median" for op in VIDUR_OPS if f"time_stats.{op}.median" in df.columns], path)
    name = path.stem.removesuffix("_mlp")
    name = name.split("_", 1)[1] if "_" in name else name  # "a100_Llama-2-7b-hf" -> "Llama-2-7b-hf"
    parts = []
    for op in VIDUR_OPS:
        col = f"time_stats.{op}.median"
        if col not in df.columns:
            continue
        parts.append(pd.DataFrame({
            "source": str(path), "model": name, "tp": df.num_tensor_parallel_workers.astype(int), "kind": "mixed",
            "batch_size": 0, "num_tokens": df.num_tokens.astype(int), "context_len": 0, "operator": op,
            "time_s": df[col].astype(float) / 1e3, "hidden": df.n_embd.astype(int), "heads": df.n_head.astype(int),
            "kv_heads": df.n_kv_head.astype(int), "head_dim": (df.n_embd // df.n_head).astype(int),
            "inter": df.n_expanded_embd.astype(int), "vocab": df.vocab_size.astype(int),
            "gated": df.use_gated_mlp.astype(str).str.lower().isin(["true", "1"]), "dtype_bytes": 2,
            "device": "cuda"}))
    if not parts:
        raise KvsimError(str(path), "Vidur CSV has no time_stats columns for the projections")
    return pd.concat(parts, ignore_index=True)


def _allreduce(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    need = ["time_stats.all_reduce.median", "size", "num_workers"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise KvsimError(str(path), f"all-reduce CSV lacks columns {', '.join(missing)}")
    require_numbers(df, need + [c for c in ("devices_per_node",) if c in df.columns], path)
    if "devices_per_node" in df.columns:
        df = df[df.devices_per_node == df.num_workers]  # one node: NVLink, no network
    g = df.groupby(["num_workers", "size"])["time_stats.all_reduce.median"].median().reset_index()
    return pd.DataFrame({
        "source": str(path), "model": "all_reduce", "tp": g.num_workers.astype(int), "kind": "collective",
        "batch_size": 0, "num_tokens": g["size"].astype(int), "context_len": 0, "operator": "all_reduce",
        "time_s": g["time_stats.all_reduce.median"].astype(float) / 1e3, "hidden": 0, "heads": 0, "kv_heads": 0,
        "head_dim": 0, "inter": 0, "vocab": 0, "gated": False, "dtype_bytes": 2, "device": "cuda"})


def _profile(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    require_numbers(df, ["batch_size", "num_tokens", "context_len", "time_ms"], path)
    bad = sorted(set(df.operator) - set(PROFILE_OPS))
    if bad:
        raise KvsimError(str(path), f"unknown operators {', '.join(bad)}; known: {', '.join(PROFILE_OPS)}")
    specs = {}
    for name in df.model.unique():
        try:
            specs[name] = ModelSpec.from_name(str(name))
        except KeyError as exc:
            raise KvsimError(str(path), str(exc).strip("\"'")) from exc
    out = pd.DataFrame({
        "source": str(path), "model": df.model.astype(str), "tp": 1, "kind": df.kind.astype(str),
        "batch_size": df.batch_size.astype(int), "num_tokens": df.num_tokens.astype(int),
        "context_len": df.context_len.astype(int), "operator": df.operator.astype(str),
        "time_s": df.time_ms.astype(float) / 1e3, "device": df.device.astype(str)})
    for col, attr in [("hidden", "hidden_size"), ("heads", "num_heads"), ("kv_heads", "num_kv_heads"),
                      ("head_dim", "head_dim"), ("inter", "intermediate_size"), ("vocab", "vocab_size"),
                      ("gated", "gated_mlp"), ("dtype_bytes", "dtype_bytes")]:
        out[col] = [getattr(specs[m], attr) for m in out.model]
    return out


def check_device(df: pd.DataFrame, hardware: str) -> None:
    """KvsimError unless every row of ``df`` was measured on the kind of device ``hardware`` names (the
    CPU for ``cpu``, a GPU for any other preset): a CPU profile says nothing of a GPU's kernels."""
    want_cpu = hardware.lower() == "cpu"
    wrong = df[(df.device == "cpu") != want_cpu]
    if len(wrong):
        row = wrong.iloc[0]
        where = "on the CPU" if row.device == "cpu" else f"on device {row.device}"
        fix = ("profile on the GPU (kvsim profile --device cuda) or calibrate --hardware cpu" if row.device == "cpu"
               else "give measurements taken on the CPU (kvsim profile --device cpu)")
        raise KvsimError(str(row.source), f"measured {where}, not on {hardware}: {fix}")


def read_measurements(paths: list[str | Path]) -> pd.DataFrame:
    """Read and concatenate measurement files; rows with a non-positive time are dropped.

    Every number the tables need must be present and finite: an empty, NaN or non-numeric cell is a
    KvsimError naming the file and line (so are unreadable, non-UTF-8 and header-only files)."""
    if not paths:
        raise KvsimError("--measurements", "no measurement files given")
    frames = []
    for p in paths:
        path = Path(p)
        df = read_csv_checked(path)
        if list(df.columns[: len(PROFILE_COLUMNS)]) == PROFILE_COLUMNS:
            frames.append(_profile(df, path))
        elif "time_stats.all_reduce.median" in df.columns:
            frames.append(_allreduce(df, path))
        elif any(c.startswith("time_stats.") for c in df.columns):
            frames.append(_vidur(df, path))
        else:
            raise KvsimError(str(path), "unrecognised columns: expected a Vidur per-operator CSV or "
                                        f"{','.join(PROFILE_COLUMNS)}")
    out = pd.concat(frames, ignore_index=True)[COLUMNS]
    return out[np.isfinite(out.time_s) & (out.time_s > 0)].reset_index(drop=True)
