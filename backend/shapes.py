"""The model shape the backend needs, and the presets, with or without pydantic.

The backend reads only plain fields of a ModelSpec / HardwareSpec. On a GPU box without pydantic
(the simulator's dependency), ``model_preset`` and ``hardware_presets`` still work: they evaluate the
preset tables of sim/specs.py from its source with light stand-ins, so the numbers keep one home.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SPECS_SOURCE = Path(__file__).resolve().parent.parent / "sim" / "specs.py"
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(slots=True, frozen=True)
class ModelShape:
    """A decoder's dimensions; q_size = heads x head_dim, kv_size = kv_heads x head_dim."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    gated_mlp: bool = True
    dtype: str = "fp16"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def of(cls, spec: Any) -> ModelShape:
        """From a ModelSpec (or any object with its fields)."""
        if isinstance(spec, ModelShape):
            return spec
        return cls(**{f: getattr(spec, f) for f in cls.__slots__ if hasattr(spec, f)})


def _presets_from_source() -> tuple[dict[str, Any], dict[str, Any]]:
    """Evaluate MODEL_PRESETS / HARDWARE_PRESETS (and their helpers) from sim/specs.py without pydantic."""
    tree = ast.parse(SPECS_SOURCE.read_text())
    ns: dict[str, Any] = {"ModelSpec": lambda **kw: SimpleNamespace(**kw),
                          "HardwareSpec": lambda **kw: SimpleNamespace(**kw)}
    keep = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "_llama":
            keep.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in ("GiB", "MODEL_PRESETS", "HARDWARE_PRESETS")
                   for t in targets):
                keep.append(node)
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(SPECS_SOURCE), "exec"), ns)  # noqa: S102
    return ns["MODEL_PRESETS"], ns["HARDWARE_PRESETS"]


def _presets() -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        from sim.specs import HARDWARE_PRESETS, MODEL_PRESETS
    except ImportError:
        return _presets_from_source()
    return MODEL_PRESETS, HARDWARE_PRESETS


def model_preset(name: str) -> ModelShape:
    models, _ = _presets()
    if name.lower() not in models:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(models))}")
    return ModelShape.of(models[name.lower()])


def hardware_presets() -> dict[str, Any]:
    """name -> object with hbm_bandwidth (bytes/s) and peak_flops (FLOP/s)."""
    return dict(_presets()[1])


def hardware_for_device(device_name: str) -> tuple[str, Any] | None:
    """Guess the preset from a CUDA device name ("NVIDIA H200" -> h200-141gb); None when unknown or a CPU."""
    low = device_name.lower()
    presets = hardware_presets()
    for key, tag in (("h200", "h200"), ("h100", "h100"), ("l40s", "l40s")):
        if tag in low and any(k.startswith(key) for k in presets):
            name = next(k for k in presets if k.startswith(key))
            return name, presets[name]
    if "a100" in low:
        name = "a100-40gb" if "40gb" in low.replace(" ", "") else "a100-80gb"
        return name, presets.get(name)
    if low in ("cpu", ""):
        return "cpu", presets.get("cpu")
    return None
