"""The scenario file: a strict pydantic schema, YAML loading with line numbers, and --set overrides.

Every error becomes a KvsimError naming the file, the key path and (when known) the YAML line.
Paths inside a scenario are relative to the scenario file (``Scenario.base_dir``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from sim import limits as L
from sim.cluster.config import ClusterConfig
from sim.errors import KvsimError
from sim.hf_config import is_config_path, load_hf_config
from sim.lora import LoraConfig, lora_problem
from sim.specs import MODEL_PRESETS, HardwareSpec, ModelSpec, check_preset, complete_from_preset, preset_named
from sim.speculative import SpeculativeConfig
from sim.speculative import problem as speculative_problem
from sim.workload.config import WorkloadConfig
from sim.yamlfile import parse_yaml, read_text_bounded

# Frontend latencies fitted to the calibration runs (sim/data/frontend.json, written by
# scripts/fit_engine.py; docs/fidelity.md)
_FRONTEND = json.loads((Path(__file__).resolve().parent / "data" / "frontend.json").read_text())
FRONTEND_INPUT_S = float(_FRONTEND["input_latency_s"])
FRONTEND_OUTPUT_S = float(_FRONTEND["output_latency_s"])
FRONTEND_TOKEN_S = float(_FRONTEND["token_latency_s"])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class KVCacheConfig(_Strict):
    block_size: int = Field(default=16, ge=1, le=1024, json_schema_extra={"enum": [1 << k for k in range(11)]})
    num_gpu_blocks: int | None = Field(default=None, ge=1, le=L.MAX_BLOCKS)     # overrides the capacity computed from HBM
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    activation_reserve_gb: float | None = Field(default=None, ge=0, le=L.MAX_GB)
    swap_space_gb: float = Field(default=4.0, ge=0, le=L.MAX_SWAP_GB)  # per GPU, as in vLLM
    allocator: Literal["paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle"] = "paged"
    prefix_caching: bool = False
    # host memory for CPU copies of the prefix cache's blocks (vLLM's --kv-offloading-size: the total over
    # the tensor-parallel group, in GiB); a prefix evicted from the GPU is loaded back instead of recomputed
    cpu_offload_gib: float = Field(default=0.0, ge=0, le=L.MAX_SWAP_GB)
    # the cached K and V's element type (vLLM's --kv-cache-dtype): auto = the model's dtype; fp8 halves an fp16
    # model's KV bytes (capacity, attention reads, swaps), the weights and activations keep the model's dtype
    dtype: Literal["auto", "fp16", "bf16", "fp8", "fp32"] = "auto"
    # a model with local-attention layers (a sliding window, or Llama 4's chunks): their blocks are freed once
    # no query sees them, as vLLM's hybrid KV cache manager does (sim/kv/window_pages.py); false keeps every
    # token of every layer (vLLM's --disable-hybrid-kv-cache-manager). No effect on other models
    hybrid_manager: bool = True

    @field_validator("block_size")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"block_size must be a power of two, got {v}")
        return v


class SchedulerConfig(_Strict):
    batching: Literal["static", "continuous"] = "continuous"
    policy: Literal["fcfs", "round_robin", "priority", "longest_prefix_first"] = "fcfs"
    max_num_seqs: int = Field(default=256, ge=1, le=L.MAX_SEQS)
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=L.MAX_TOKENS)  # default: max(max_model_len, 2048)
    chunked_prefill: bool = False
    preemption: Literal["recompute", "swap"] = "recompute"
    victim: Literal["latest_arrival", "most_generated"] = "latest_arrival"
    rr_quantum_steps: int = Field(default=16, ge=1, le=L.MAX_WATCHDOG_STEPS)
    max_steps_without_progress: int = Field(default=100_000, ge=1, le=L.MAX_WATCHDOG_STEPS)  # watchdog
    # vLLM v1's default: step n+1 is planned while step n runs (CPU work overlaps the GPU), so an arrival
    # at a busy engine waits one more step to be admitted (sim/engine.py)
    async_scheduling: bool = True
    multi_step: bool = True  # price runs of identical decode steps at once (same results; sim/sched/decode_run.py)
    # a request's n samples: one request whose sequences fork its block tables (the PagedAttention paper's,
    # vLLM v0's) or n requests of its prompt (vLLM v1's; sim/workload/fanout.py)
    parallel_sampling: Literal["fork", "fanout"] = "fork"


class ExecutorConfig(_Strict):
    kind: str = "cost_model"
    calibration: str | None = None          # a calibration JSON (relative to the scenario file)
    device: Literal["cuda", "cpu"] = "cuda"  # gpu executor only
    num_layers: int | None = Field(default=None, ge=1, le=10_000)  # gpu executor: run fewer layers, scale the time
    step_overhead_s: float | None = Field(default=None, ge=0, le=3600)
    # cost model: price steps as the engine runs them (the calibration's `engine` section: CUDA graphs,
    # fused kernels, custom all-reduce, CPU overlap); false: the sum of isolated operators
    engine: bool = True


class FrontendConfig(_Strict):
    """The API server in front of the engine (HTTP, tokenisation, detokenisation, streaming).

    A request reaches the engine ``input_latency_s`` after the client sent it; each token reaches the
    client ``output_latency_s`` after the engine sampled it, plus ``token_latency_s`` per earlier output
    token of the request (a streaming backlog). Defaults: fitted to real vLLM 0.15.1 runs on H100 (see
    docs/fidelity.md); ``enabled: false`` gives engine-only latencies.
    """

    enabled: bool = True
    input_latency_s: float = Field(default=FRONTEND_INPUT_S, ge=0, le=60)
    output_latency_s: float = Field(default=FRONTEND_OUTPUT_S, ge=0, le=60)
    token_latency_s: float = Field(default=FRONTEND_TOKEN_S, ge=0, le=1)

    def latencies(self) -> tuple[float, float, float]:
        """(input, output, per-token) seconds; zeros when disabled."""
        if not self.enabled:
            return 0.0, 0.0, 0.0
        return self.input_latency_s, self.output_latency_s, self.token_latency_s


class OutputConfig(_Strict):
    plots: bool = True
    dir: str | None = None  # kvsim run: the results folder when --out is not given (relative to the file)


class Scenario(_Strict):
    name: str = "scenario"
    seed: int = Field(default=0, ge=0, le=L.MAX_SEED)
    model: str | ModelSpec = "llama-2-13b"
    hardware: str | HardwareSpec = "a100-80gb"
    kv_cache: KVCacheConfig = KVCacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    workload: WorkloadConfig
    executor: ExecutorConfig = ExecutorConfig()
    frontend: FrontendConfig = FrontendConfig()
    output: OutputConfig = OutputConfig()
    cluster: ClusterConfig | None = None   # several replicas behind a router (sim/cluster/)
    speculative: SpeculativeConfig | None = None   # speculative decoding (sim/speculative.py)
    lora: LoraConfig | None = None   # multi-LoRA serving (sim/lora.py)

    _base_dir: Path = PrivateAttr(default=Path("."))
    _source: str = PrivateAttr(default="<scenario>")
    # a prefill or decode pool's scenario whose replicas are one data-parallel engine's ranks: how many
    # (sim/cluster/replica.py pool_scenario; 1 otherwise)
    _pool_ranks: int = PrivateAttr(default=1)
    # each key path's line in the file, and the command-line flag that last set a key (for errors found later)
    _lines: dict = PrivateAttr(default_factory=dict)
    _overridden: dict = PrivateAttr(default_factory=dict)

    @field_validator("model", mode="before")
    @classmethod
    def _model_from_preset(cls, v: Any) -> Any:
        return complete_from_preset(v, ModelSpec)

    @field_validator("hardware", mode="before")
    @classmethod
    def _hardware_from_preset(cls, v: Any) -> Any:
        return complete_from_preset(v, HardwareSpec)

    @field_validator("model")
    @classmethod
    def _model_preset(cls, v: str | ModelSpec) -> str | ModelSpec:
        return check_preset(v, ModelSpec)

    @field_validator("hardware")
    @classmethod
    def _hardware_preset(cls, v: str | HardwareSpec) -> str | HardwareSpec:
        return check_preset(v, HardwareSpec)

    @property
    def model_spec(self) -> ModelSpec:
        """The model (a preset, or the mapping given), with ``kv_cache.dtype`` as its KV dtype unless auto, and
        without the hybrid manager's paging where ``kv_cache.hybrid_manager`` is false."""
        spec = ModelSpec.from_name(self.model) if isinstance(self.model, str) else self.model
        update: dict[str, Any] = {}
        if self.kv_cache.dtype != "auto":
            update["kv_dtype"] = self.kv_cache.dtype
        if not self.kv_cache.hybrid_manager and spec.hybrid_kv and spec.local_layers:
            update["hybrid_kv"] = False
        return spec.model_copy(update=update) if update else spec

    @property
    def hardware_spec(self) -> HardwareSpec:
        return HardwareSpec.from_name(self.hardware) if isinstance(self.hardware, str) else self.hardware

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def source(self) -> str:
        return self._source

    def resolve_path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self._base_dir / p

    def key_error(self, key: str, what: str, name_flag: bool = True) -> KvsimError:
        """The error of ``key`` (a dotted path, e.g. ``executor.device``) found after loading, located as loading
        locates its own: ``FILE:LINE`` of the key (or of the nearest mapping above it that the file has), or the
        file (and, with ``name_flag``, the flag) where a command-line override set it."""
        return _key_error(key, what, self._source, self._lines, self._overridden, name_flag)


# ---------------------------------------------------------------- loading


def _key_lines(node: yaml.Node, prefix: tuple = ()) -> dict[tuple, int]:
    """Map every key path in a composed YAML document to its 1-based line number."""
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            path = prefix + (k.value,)
            lines[path] = k.start_mark.line + 1
            lines.update(_key_lines(v, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            lines[prefix + (i,)] = v.start_mark.line + 1
            lines.update(_key_lines(v, prefix + (i,)))
    return lines


def _parse_yaml(text: str, source: str) -> tuple[dict, dict[tuple, int]]:
    data, node = parse_yaml(text, source)
    if data is None:
        raise KvsimError(source, "the file is empty")
    if not isinstance(data, dict):
        raise KvsimError(source, "a scenario must be a mapping of keys (name, model, workload, ...)")
    return data, (_key_lines(node) if node is not None else {})


def parse_override(text: str) -> tuple[list[str], Any]:
    """``key.path=value`` -> (["key", "path"], value parsed as a YAML scalar or list)."""
    if "=" not in text:
        raise KvsimError("--set", f"expected key.path=value, got {text!r}")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise KvsimError("--set", f"bad key path {key!r}")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _preset_mapping(section: str, name: Any, base_dir: Path | str = ".") -> Any:
    """A preset name (model or hardware) as the mapping naming it, or a model's config.json as its mapping, so
    one field of it can be overridden (``hardware.name`` then switches presets and keeps the other fields set)."""
    if section not in ("model", "hardware") or not isinstance(name, str | None):
        return name
    name = name if name is not None else Scenario.model_fields[section].default
    if section == "model" and is_config_path(name):
        return load_hf_config(Path(base_dir) / name).model_dump()
    try:
        spec = ModelSpec.from_name(name) if section == "model" else HardwareSpec.from_name(name)
    except KeyError as e:
        raise KvsimError("--set", f"{section}: {e.args[0]}") from None
    if section == "model" and spec.name not in MODEL_PRESETS:   # a quantized checkpoint's id: every field
        return spec.model_dump()
    return {"name": spec.name}   # completed from the preset when validated (specs.complete_from_preset)


def _position(node: list, part: str, path: list[str]) -> int:
    """The item of a list that a key path's ``part`` names (``cluster.groups.1.replicas``: 0-based)."""
    if not part.isdigit() or int(part) >= len(node):
        raise KvsimError("--set", f"{'.'.join(path)}: {part} is not an item of its list (0 .. {len(node) - 1})")
    return int(part)


def _copy_along(data: dict, path: list[str]) -> None:
    """Replace each mapping (or list) on ``path`` below ``data`` by a shallow copy, so that setting the path
    changes nothing ``data`` shares with its caller (a whole deep copy would copy every inline request)."""
    node: Any = data
    for part in path[:-1]:
        key: Any = _position(node, part, path) if isinstance(node, list) else part
        child = node[key] if isinstance(node, list) else node.get(part)
        if not isinstance(child, dict | list):
            return
        node[key] = node = type(child)(child)


def apply_override(data: dict, path: list[str], value: Any, base_dir: Path | str = ".") -> None:
    """Set ``data[path...] = value``; a model or hardware preset name (or a model's config.json, relative to
    ``base_dir``), a cluster pool's hardware preset too, becomes its mapping first, so
    ``hardware.tensor_parallel=2`` works on a scenario that names a preset. ``hardware.name`` (``model.name``)
    set to another preset switches to it, the fields set beside the name kept; set to a name that is no
    preset, it renames the preset's fields."""
    node: Any = data
    if len(path) > 1:
        node[path[0]] = _preset_mapping(path[0], node.get(path[0]), base_dir)
    for depth, part in enumerate(path[:-1]):
        key: Any = _position(node, part, path) if isinstance(node, list) else part   # (a list's item by position)
        child = node[key] if isinstance(node, list) else node.get(part)
        if part == "hardware" and depth > 0 and isinstance(child, str):   # a cluster pool's preset
            child = node[key] = _preset_mapping(part, child, base_dir)
        if isinstance(child, list):   # an item of it next, by position (e.g. cluster.groups.1.hardware)
            node = child
            continue
        if not isinstance(child, dict):
            child = {} if child is None else child
            if not isinstance(child, dict):
                raise KvsimError("--set", f"{'.'.join(path)}: {part} is not a mapping")
            node[key] = child
        if depth == len(path) - 2 and part in ("model", "hardware") and path[-1] == "name":
            spec = ModelSpec if part == "model" else HardwareSpec
            if preset_named(value, spec) is None:   # renamed: the current preset's fields under the new name
                child = node[key] = complete_from_preset(child, spec)
        node = child
    node[_position(node, path[-1], path) if isinstance(node, list) else path[-1]] = value


def _data_loc(data: object, loc: tuple, kind: str) -> tuple[tuple, bool]:
    """(``loc`` as a path through ``data``, whether a part was dropped): pydantic puts the union member it
    tried into an error's loc ('constrained-int', 'list[ConcurrencyStep]'); a part that is neither a key nor
    a position of the input there is such a tag (but a missing key, the last part of a 'missing' error)."""
    node, kept = data, []
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif kind == "missing" and i == len(loc) - 1 and isinstance(node, dict):
            pass
        else:
            continue
        kept.append(part)
    return tuple(kept), len(kept) < len(loc)


def _union_branch(errors: list, data: object) -> dict:
    """The error to report where the first lies inside a union: of the errors under the same input, the one
    whose member matched the input deepest (a list's item's key rather than "should be an integer"); among
    equals an unknown key, then an error about the value rather than its type (another member's)."""
    first = errors[0]
    head, tagged = _data_loc(data, first["loc"], first["type"])
    if not tagged:
        return first
    def rank(e: dict, loc: tuple) -> tuple:
        return len(loc), e["type"] == "extra_forbidden", not e["type"].endswith("_type")

    best, best_rank = first, rank(first, head)
    for e in errors[1:]:
        loc, in_union = _data_loc(data, e["loc"], e["type"])
        if in_union and loc[:len(head)] == head and rank(e, loc) > best_rank:
            best, best_rank = e, rank(e, loc)
    return {**best, "loc": _data_loc(data, best["loc"], best["type"])[0]}


def _origin(path: tuple, overridden: dict[tuple, str], in_file: bool = True) -> str:
    """`` (from --set)`` (or the flag that set it) where the key at ``path`` came from a command-line override:
    one that set the key or a mapping holding it, or, for a key the file does not have (``in_file``), one
    that set a key inside it (``--set foo.bar=1``: an unknown ``foo``); the last such override wins."""
    flags = [flag for key, flag in overridden.items()
             if path[:len(key)] == key or (not in_file and key[:len(path)] == path)]
    return f" (from {flags[-1]})" if flags else ""


def _explain(err: ValidationError, source: str, lines: dict[tuple, int], overridden: dict[tuple, str],
             data: object = None) -> KvsimError:
    errors = err.errors()
    first = errors[0] if data is None else _union_branch(errors, data)
    if first["type"] == "string_type" and len(first["loc"]) > 1:
        # a mapping given where a preset name or a mapping is accepted (model, hardware): report the
        # mapping branch's own error (an unknown key first), not "should be a valid string"
        head = first["loc"][:-1]
        branch = [e for e in errors[1:] if e["loc"][:len(head)] == head]
        if branch:
            first = next((e for e in branch if e["type"] == "extra_forbidden"), branch[0])
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p in ("str", "ModelSpec", "HardwareSpec")))
    # pydantic adds the union member tried ('function-after[...]', 'ModelSpec') to the loc; drop those
    loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p[:1].isupper())))
    key = ".".join(str(p) for p in loc) or "<top>"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "missing":
        msg = "required key is missing"
    msg = msg.removeprefix("Value error, ")
    line = None
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            line = lines[loc[:n]]
            break
    named = tuple(str(p) for p in loc)   # (a list item's position is an int in the loc, text in the --set path)
    via = _origin(named, overridden, loc in lines)
    where = f"{source}:{line}" if line and not via else source
    return KvsimError(where, f"{key}: {msg}{via}")


def load_scenario(path: str | Path, overrides: list[str] | None = None, varied: list[str] | None = None
                  ) -> Scenario:
    """Read, override and validate a scenario file. Raises KvsimError on any problem. ``varied``: overrides
    applied after ``overrides``, from ``kvsim compare``'s --vary (errors name that flag)."""
    path = Path(path)
    source = str(path)
    text = read_text_bounded(path, "scenario file")
    data, lines = _parse_yaml(text, source)
    return scenario_from_dict(data, base_dir=path.parent, source=source, lines=lines, overrides=overrides,
                              varied=varied)


def scenario_from_dict(
    data: dict,
    base_dir: Path | str = ".",
    source: str = "<scenario>",
    lines: dict[tuple, int] | None = None,
    overrides: list[str] | None = None,
    varied: list[str] | None = None,
) -> Scenario:
    """Validate a scenario given as a dict (notebooks build them this way); ``overrides`` (--set) and then
    ``varied`` (--vary) are ``key.path=value`` texts applied to it."""
    if isinstance(data, dict) and "grid" in data and "workload" not in data:
        raise KvsimError(source, "a sweep file (base, grid), not a scenario: run it with `kvsim sweep FILE`")
    data = dict(data)   # (the caller's dict is left as it was: overrides copy the mappings they change)
    overridden: dict[tuple, str] = {}   # each overridden key path: the flag that set it last
    for text, flag in [*((t, "--set") for t in overrides or []), *((t, "--vary") for t in varied or [])]:
        try:
            path, value = parse_override(text)
            _copy_along(data, path)
            apply_override(data, path, value, base_dir)
        except KvsimError as e:
            raise KvsimError(flag, e.what) if e.where == "--set" else e from None
        overridden.pop(tuple(path), None)
        overridden[tuple(path)] = flag
    if is_config_path(data.get("model")):   # a Hugging Face config.json (sim/hf_config.py)
        data["model"] = load_hf_config(Path(base_dir) / data["model"]).model_dump()
    try:
        scn = Scenario.model_validate(data)
    except ValidationError as e:
        raise _explain(e, source, lines or {}, overridden, data) from None
    problem = unsupported_combination(scn)
    if problem:
        raise _key_error(*problem, source, lines or {}, overridden)
    trace = None if scn.workload.trace is None else Path(base_dir) / scn.workload.trace   # (an absolute one as is)
    if trace is not None and not trace.exists():   # (checked here, where its line is known, and before any run)
        line = (lines or {}).get(("workload", "trace"))
        via = _origin(("workload", "trace"), overridden)
        raise KvsimError(f"{source}:{line}" if line and not via else source, f"workload.trace: no such file {trace}{via}")
    if scn.speculative is not None and not scn.speculative.enabled:
        scn.speculative = None   # (checked above; ``speculative.enabled: false`` runs without drafts)
    scn._base_dir = Path(base_dir)
    scn._source = source
    scn._lines = dict(lines or {})
    scn._overridden = dict(overridden)
    return scn


def _key_error(key: str, what: str, source: str, lines: dict[tuple, int], overridden: dict[tuple, str],
               name_flag: bool = True) -> KvsimError:
    """``FILE:LINE: key: what``, the line the key's (or the nearest mapping's above it that the file has); where a
    command-line override set it, ``FILE: key: what (from --set)``."""
    path = tuple(key.split("."))   # (as --set names it; the lines know a list's items by their index)
    at = tuple(int(part) if part.isdigit() else part for part in path)
    line = next((lines[at[:n]] for n in range(len(at), 0, -1) if lines.get(at[:n])), None)
    via = _origin(path, overridden)
    return KvsimError(f"{source}:{line}" if line and not via else source, f"{key}: {what}{via if name_flag else ''}")


def unsupported_combination(scn: Scenario) -> tuple[str, str] | None:
    """(key, why) for settings that cannot take effect together, rather than silently ignoring one."""
    sch, kv = scn.scheduler, scn.kv_cache
    if sch.batching == "static":
        if sch.policy in ("round_robin", "longest_prefix_first"):
            return "scheduler.policy", (f"{sch.policy} needs scheduler.batching: continuous (static batching "
                                        "orders a batch by fcfs or priority only)")
        if sch.chunked_prefill:
            return "scheduler.chunked_prefill", ("static batching prefills each batch's prompts whole; use "
                                                 "scheduler.batching: continuous or chunked_prefill: false")
        if kv.prefix_caching:
            return "kv_cache.prefix_caching", "needs scheduler.batching: continuous (static batching reserves " \
                                              "each request's memory whole)"
    syn = scn.workload.synthetic
    if syn is not None and syn.sample_lengths == "independent" and syn.n > 1 and sch.parallel_sampling == "fork":
        return "workload.synthetic.sample_lengths", ("independent needs scheduler.parallel_sampling: fanout (forked "
                                                     "samples move in lockstep, all as long as their request)")
    if kv.cpu_offload_gib and not kv.prefix_caching:
        return "kv_cache.cpu_offload_gib", "needs kv_cache.prefix_caching: true (the host tier holds copies of " \
                                           "the prefix cache's blocks)"
    if kv.prefix_caching and kv.allocator != "paged":
        return "kv_cache.prefix_caching", f"needs kv_cache.allocator: paged (the {kv.allocator} allocator " \
                                          "reserves one region per request and shares nothing)"
    if scn.speculative is not None:
        problem = speculative_problem(scn)
        if problem:
            return problem
    return (_hybrid_manager_problem(scn) or _tensor_parallel_problem(scn) or _pipeline_problem(scn)
            or _group_problem(scn) or _lora_problem(scn) or _data_parallel_problem(scn))


def _data_parallel_problem(scn: Scenario) -> tuple[str, str] | None:
    """(key, why) where a data-parallel group (``cluster.data_parallel``, or a pool's) cannot be built as given."""
    cl = scn.cluster
    if cl is None or not (cl.data_parallel or any(p is not None and p.data_parallel for p in (cl.prefill, cl.decode))):
        return None
    from sim.cluster.data_parallel import data_parallel_problem  # (lazy: sim.cluster imports this module)

    return data_parallel_problem(scn)


def _lora_problem(scn: Scenario) -> tuple[str, str] | None:
    """(key, why) where LoRA serving (the ``lora`` section, sim/lora.py) meets what it is not modelled with, or
    requests name adapters without it."""
    if scn.lora is None:
        named = scn.workload.requests is not None and any(r.lora >= 0 for r in scn.workload.requests)
        return ("workload.requests", "a request names a LoRA adapter (lora) but the scenario has no lora "
                                     "section") if named else None
    if scn.lora.adapters and scn.workload.requests is not None and any(r.lora >= 0 for r in scn.workload.requests):
        return "lora.adapters", "set it to 0 where the inline requests name their own adapters (lora)"
    why = lora_problem(scn.model_spec)
    if why:
        return "model", why
    sch, cluster = scn.scheduler, scn.cluster
    return _first_clash((
        ("hardware.pipeline_parallel", "LoRA with pipeline stages is not modelled", scn.hardware_spec.pipeline_parallel > 1),
        ("speculative", "LoRA with speculative decoding is not modelled", scn.speculative is not None),
        ("scheduler.preemption", "LoRA with preemption by swap is not modelled", sch.preemption == "swap"),
        ("scheduler.batching", "LoRA with static batching is not modelled", sch.batching == "static"),
        ("cluster", "LoRA with prefill/decode pools is not modelled", cluster is not None and cluster.disaggregated),
        ("executor.kind", f"the {scn.executor.kind} executor does not price LoRA (executor.kind: cost_model does)",
         scn.executor.kind != "cost_model"),
    ))


def _first_clash(rows: tuple[tuple[str, str, bool], ...]) -> tuple[str, str] | None:
    """(key, what) of the first of ``rows`` (key, what, whether it is set) that is set; None: none is."""
    return next(((key, what) for key, what, bad in rows if bad), None)


def _group_problem(scn: Scenario) -> tuple[str, str] | None:
    """(key, why) where a group of a mixed colocated fleet (``cluster.groups``) overrides its kv_cache or
    scheduler into settings that cannot take effect together (its key: cluster.groups.I.KEY)."""
    groups = scn.cluster.groups if scn.cluster is not None else None
    if not groups:
        return None
    from sim.cluster.replica import pool_scenario  # (lazy: sim.cluster imports this module)

    for i, group in enumerate(groups):
        if not (group.kv_cache or group.scheduler):
            continue
        sub = pool_scenario(scn, group).model_copy(update={"cluster": None})
        problem = unsupported_combination(sub)
        if problem:
            return f"cluster.groups.{i}.{problem[0]}", problem[1]
    return None


def _hybrid_manager_problem(scn: Scenario) -> tuple[str, str] | None:
    """(key, why) where a setting meets window pages (``ModelSpec.kv_pages``), which kvsim models with
    continuous batching on the paged allocator, preemption by recompute, one sequence a request (or samples
    fanned out as requests), a GPU-only prefix cache, no drafts, colocated engines."""
    model = scn.model_spec
    if model.kv_pages() is None and not model.sliding_only():
        return None
    sch, kv, syn = scn.scheduler, scn.kv_cache, scn.workload.synthetic
    forks = sch.parallel_sampling == "fork" and syn is not None and syn.n > 1
    clash = _first_clash((
        ("scheduler.batching", "static batching", sch.batching == "static"),
        ("kv_cache.allocator", f"the {kv.allocator} allocator", kv.allocator != "paged"),
        ("scheduler.preemption", "preemption by swap", sch.preemption == "swap"),
        ("kv_cache.cpu_offload_gib", "a host tier of the prefix cache", bool(kv.cpu_offload_gib)),
        ("speculative", "speculative decoding", scn.speculative is not None),
        ("cluster", "disaggregated prefill and decode pools", scn.cluster is not None and scn.cluster.disaggregated),
        ("workload.synthetic.n", "forked parallel samples", forks),
        ("workload.synthetic.beam_width", "beam search", syn is not None and syn.beam_width > 1),
    ))
    if clash is None:
        return None
    key, what = clash
    return key, (f"{what} with {model.name}'s window pages (vLLM's hybrid KV cache manager) is not "
                 "modelled; set kv_cache.hybrid_manager: false to keep every layer's KV whole "
                 "(--disable-hybrid-kv-cache-manager)")


def _tensor_parallel_problem(scn: Scenario) -> tuple[str, str] | None:
    """(key, why) where a tensor-parallel degree, the scenario's or a pool's, cannot shard the model."""
    model = scn.model_spec
    spec = scn.hardware_spec
    why = _expert_parallel_problem(scn, spec)
    if why:
        return "hardware.expert_parallel", why
    why = model.tensor_parallel_problem(spec.tensor_parallel, spec.expert_parallel)
    if why:
        return "hardware.tensor_parallel", why
    cluster = scn.cluster
    pools = [] if cluster is None else [(role, getattr(cluster, role)) for role in ("prefill", "decode")]
    pools += [] if cluster is None or not cluster.groups else [(f"groups.{i}", g) for i, g in enumerate(cluster.groups)]
    for where, pool in pools:
        if pool is None:
            continue
        hw = pool.hardware if pool.hardware is not None else scn.hardware
        spec = HardwareSpec.from_name(hw) if isinstance(hw, str) else hw
        spec = spec.model_copy(update={"tensor_parallel": pool.tensor_parallel or spec.tensor_parallel})
        why = _expert_parallel_problem(scn, spec)
        if why:
            return f"cluster.{where}.hardware.expert_parallel", why
        why = model.tensor_parallel_problem(spec.tensor_parallel, spec.expert_parallel)
        if why:
            return f"cluster.{where}.tensor_parallel", why
    return None


def _expert_parallel_problem(scn: Scenario, spec: HardwareSpec) -> str | None:
    """Why ``spec``'s expert parallelism cannot place the scenario's model (sim/expert_parallel.py), or is not
    priced by its executor (the cost model prices it); None without it or where it can."""
    if not spec.expert_parallel:
        return None
    from sim.expert_parallel import expert_parallel_problem

    why = expert_parallel_problem(scn.model_spec, spec.tensor_parallel)
    if why is None and scn.executor.kind != "cost_model":
        why = f"the {scn.executor.kind} executor does not price expert parallelism (executor.kind: cost_model does)"
    return why


def _pipeline_problem(scn: Scenario) -> tuple[str, str] | None:
    """(key, why) where pipeline stages (``hardware.pipeline_parallel``, the scenario's or a pool's) meet what
    they are not modelled with (sim/executors/pipeline.py): more stages than layers, layers of two kinds (a
    sliding window or chunks on some, dense MLPs before the experts), drafts, swaps, a host tier, beams,
    another executor than the cost model."""
    subs = [("hardware", scn)]
    cluster = scn.cluster
    if cluster is not None and cluster.disaggregated:
        from sim.cluster.replica import pool_scenario  # (lazy: sim.cluster imports this module)

        subs += [(f"cluster.{role}.hardware", pool_scenario(scn, getattr(cluster, role))) for role in ("prefill", "decode")]
    for key, sub in subs:
        stages = sub.hardware_spec.pipeline_parallel
        if stages == 1:
            continue
        model, sch, syn = sub.model_spec, sub.scheduler, sub.workload.synthetic
        if stages > model.num_layers:
            return f"{key}.pipeline_parallel", f"{stages} stages for {model.name}'s {model.num_layers} layers " \
                                               "(each stage needs a layer)"
        clash = _first_clash((
            ("model", f"{model.name}'s local-attention layers", bool(model.local_layers)),
            ("model", f"{model.name}'s dense layers before its experts", bool(model.dense_layers)),
            ("speculative", "speculative decoding", sub.speculative is not None),
            ("scheduler.preemption", "preemption by swap", sch.preemption == "swap"),
            ("kv_cache.cpu_offload_gib", "a host tier of the prefix cache", bool(sub.kv_cache.cpu_offload_gib)),
            ("workload.synthetic.beam_width", "beam search", syn is not None and syn.beam_width > 1),
            ("executor.kind", f"the {sub.executor.kind} executor", sub.executor.kind != "cost_model"),
        ))
        if clash is not None:
            return clash[0], f"{clash[1]} with {key}.pipeline_parallel is not modelled (pipeline stages are " \
                             "priced by the cost model, layers of one kind, sequences without block copies)"
    return None


def scenario_json_schema() -> dict:
    """The JSON Schema of scenario files. A ``model`` or ``hardware`` mapping (and a pool's or group's) needs
    every field, or a ``name`` (a preset, or a model id) and only the fields that differ from it."""
    schema = Scenario.model_json_schema()
    for spec in ("ModelSpec", "HardwareSpec"):
        entry = schema["$defs"][spec]
        entry["anyOf"] = [{"required": entry.pop("required")}, {"required": ["name"]}]
    return schema
