"""Measured serving runs: the CSV format of sim/data/ground_truth/vllm_h100_runs.csv, read and checked.

One row per (run, stage). Stages of a run ran one after the other on one server; each row carries the server
settings, the client's load (rate x duration requests, 100 fixed prompts cycled) and the measured
client-side figures. A row without measured figures (their columns absent, or its cells empty) is a benchmark
not yet run: kvsim predicts it and checks nothing; without the server-side prompt lengths, each prompt is
taken as the client's count plus a BOS token (``client_prompt_quantiles``). The measured columns, and the
prompt lengths' five, come all or none. Every problem is a KvsimError naming the
file, the line and the column.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from sim.errors import KvsimError
from sim.model_ids import model_preset, quantized_model
from sim.specs import HARDWARE_PRESETS, MODEL_PRESETS, ModelSpec

# measured metric name -> CSV column (seconds, except req_per_s)
METRIC_COLUMNS = {
    "ttft_mean": "ttft_s_mean", "ttft_p50": "ttft_s_median", "ttft_p90": "ttft_s_p90", "ttft_p99": "ttft_s_p99",
    "e2e_mean": "e2e_s_mean", "e2e_p50": "e2e_s_median", "e2e_p90": "e2e_s_p90", "e2e_p99": "e2e_s_p99",
    "decode_per_token": "decode_s_per_token_mean", "req_per_s": "achieved_req_s",
}
INT_COLUMNS = ["stage", "tensor_parallel", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
               "num_groups", "num_prompts_per_group", "system_prompt_len", "question_len", "output_len"]
FLOAT_COLUMNS = ["rate_req_s", "duration_s"]
# server-side prompt lengths: all five given, or none (then the client's, ``client_prompt_quantiles``)
PROMPT_COLUMNS = {"mean": "prompt_len_mean", "p10": "prompt_len_p10", "p50": "prompt_len_median",
                  "p90": "prompt_len_p90", "p99": "prompt_len_p99"}
TEXT_COLUMNS = ["run", "model", "gpu"]
OPTIONAL = ["num_gpu_kv_blocks_vllm_log", "load", "ignore_eos", "concurrency_level", "num_requests"]
# the client's load types kvsim rebuilds (inference-perf's load.type; an empty or missing cell: constant)
LOADS = ("constant", "poisson", "concurrent")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


@dataclass(frozen=True)
class MeasuredStage:
    """One load stage of one measured run: its settings and the measured figures."""

    run: str
    stage: int
    model: str                 # kvsim preset name, the runs file's model id where a config gave ``model_spec``,
                               # or a quantized preset's name (``quantized_model``)
    hardware: str              # kvsim preset name
    tensor_parallel: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    num_gpu_blocks: int | None   # from the server log, when known
    rate_req_s: float
    duration_s: float
    num_prompts: int             # num_groups x num_prompts_per_group
    system_prompt_len: int
    output_len: int
    prompt_quantiles: dict[str, float]   # mean, p10, p50, p90, p99 (server-side tokens)
    measured: dict[str, float]           # METRIC_COLUMNS keys (NaN: not measured, a prediction only)
    model_spec: ModelSpec | None = None  # a model with no preset: from its config.json (``read_runs(models=)``),
                                         # or a preset quantized as the model id's suffix says
    load: str = "constant"               # one of LOADS
    num_groups: int = 1                  # the prompts' groups, each sharing one system prompt
    question_len: int = 0                # client-side tokens of a prompt's question (after the system prompt)
    ignore_eos: bool = True              # False: the real outputs may have ended before output_len (EOS)
    concurrency: int = 0                 # load concurrent: the client's requests in flight (its workers)
    requests: int = 0                    # load concurrent: the stage's requests (inference-perf's num_requests)
    pipeline_parallel: int = 1           # pipeline stages (an optional column; each a tensor_parallel group)
    data_parallel: int = 1               # vLLM's --data-parallel-size (an optional column): engines behind the server

    prompts_from_client: bool = False    # no server-side prompt lengths given: ``client_prompt_quantiles``

    @property
    def num_requests(self) -> int:
        return self.requests if self.load == "concurrent" else round(self.rate_req_s * self.duration_s)

    @property
    def has_measurements(self) -> bool:
        """Whether any figure was measured (else the row only asks for a prediction)."""
        return any(not math.isnan(v) for v in self.measured.values())


def client_prompt_quantiles(system_prompt_len: int, question_len: int) -> dict[str, float]:
    """Prompt lengths where the server-side ones are not given: every prompt the client's tokens plus the BOS
    token the server adds. (Re-tokenising the client's random token ids usually makes a few percent more:
    in the shipped runs 566 client tokens became 591.6 on average; give the measured lengths where known.)"""
    n = float(system_prompt_len + question_len + 1)
    return {"mean": n, "p10": n, "p50": n, "p90": n, "p99": n}

# a GPU named without its memory size: the size its SXM part ships with
DEFAULT_MEMORY = {"a100": "a100-80gb", "h100": "h100-80gb", "h200": "h200-141gb"}


def hardware_preset(name: str) -> str | None:
    """'H100-80GB-SXM' -> 'h100-80gb'; 'NVIDIA H100 80GB HBM3' -> 'h100-80gb'; 'A100-SXM4-40GB' ->
    'a100-40gb'; 'H200' -> 'h200-141gb'; 'NVIDIA L40S' -> 'l40s'. The presets are the SXM parts: a PCIe or
    NVL card (other bandwidth, clocks and memory) has none."""
    parts = [p for p in re.split(r"[\s_-]+", name.strip().lower()) if p]
    if parts[:1] == ["nvidia"]:
        parts = parts[1:]
    if {"pcie", "nvl"} & set(parts):
        return None
    parts = [p for p in parts if not re.fullmatch(r"sxm\d?|hbm\d?e?", p)]
    key = "-".join(parts)
    key = DEFAULT_MEMORY.get(key, key)
    return key if key in HARDWARE_PRESETS else None


def read_runs(path: str | Path, models: dict[str, ModelSpec] | None = None) -> list[MeasuredStage]:
    """Every (run, stage) row of a runs CSV, in file order. ``models``: specs of model ids (as the file
    names them, any case) that have no kvsim preset."""
    path = Path(path)
    if not path.is_file():
        raise KvsimError(str(path), "no such file" if not path.exists() else "not a regular file")
    try:
        text = path.read_text(encoding="utf-8-sig")   # (a leading byte-order mark dropped: spreadsheets write one)
    except (OSError, UnicodeDecodeError) as e:
        raise KvsimError(str(path), f"cannot read: {e}") from None
    rows = list(csv.DictReader(text.splitlines()))
    header = set(rows[0]) if rows else set(text.splitlines()[0].split(",") if text.strip() else [])
    missing = [c for c in TEXT_COLUMNS + INT_COLUMNS + FLOAT_COLUMNS if c not in header]
    for group in (list(METRIC_COLUMNS.values()), list(PROMPT_COLUMNS.values())):   # (all of a group, or none)
        if header & set(group):
            missing += [c for c in group if c not in header]
    if missing:
        raise KvsimError(f"{path}:1", f"missing column(s): {', '.join(missing)} (the format of "
                                      "sim/data/ground_truth/vllm_h100_runs.csv)")
    if not rows:
        raise KvsimError(str(path), "no runs (only a header)")
    by_id = {k.lower(): v for k, v in (models or {}).items()}
    return [_stage(row, f"{path}:{i + 2}", by_id) for i, row in enumerate(rows)]


def _optional(row: dict, col: str, where: str) -> float:
    """A column that may be absent or empty (NaN then)."""
    return _num(row, col, where, float) if (row.get(col) or "").strip() else math.nan


def _num(row: dict, col: str, where: str, kind: type) -> float:
    raw = (row.get(col) or "").strip()
    try:
        value = kind(float(raw)) if kind is int else float(raw)
    except ValueError:
        raise KvsimError(where, f"{col}: not a number: {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise KvsimError(where, f"{col}: must be a finite number >= 0, got {raw!r}")
    return value


def _stage(row: dict, where: str, models: dict[str, ModelSpec]) -> MeasuredStage:
    """One row as a stage; ``models``: specs of models with no preset, by lower-case model id."""
    load = (row.get("load") or "").strip().lower() or "constant"
    if load not in LOADS:
        raise KvsimError(where, f"load: {row['load'].strip()!r} cannot be rebuilt (kvsim replays the client's "
                                f"{', '.join(LOADS)} loads)")
    concurrent = load == "concurrent"
    ints = {c: int(_num(row, c, where, int)) for c in INT_COLUMNS}
    floats = {c: 0.0 if concurrent and c in ("rate_req_s", "duration_s") and not (row.get(c) or "").strip()
              else _num(row, c, where, float) for c in FLOAT_COLUMNS}
    level = requests = 0
    if concurrent:   # N workers, each sending its next request when its last is answered
        for col in ("concurrency_level", "num_requests"):
            if not (row.get(col) or "").strip():
                raise KvsimError(where, f"{col}: a concurrent load needs it")
        level, requests = (int(_num(row, c, where, int)) for c in ("concurrency_level", "num_requests"))
        if level < 1 or requests < 1:
            raise KvsimError(where, "concurrency_level and num_requests: must be positive")
        if requests > 1_000_000:
            raise KvsimError(where, "num_requests: more than 1,000,000 requests in one stage")
    # a config given for the id first, then a preset by its name, then a preset quantized as its suffix says
    model_id = row["model"].strip()
    model, spec = None, models.get(model_id.lower())
    if spec is not None:
        model = model_id
    elif (model := model_preset(model_id)) is None:
        spec = quantized_model(model_id)
        if spec is None:
            raise KvsimError(where, f"model: no kvsim preset for {model_id!r} (give its config.json: --model "
                                    f"{model_id}=PATH); known: {', '.join(sorted(MODEL_PRESETS))}")
        model = spec.name
    hardware = hardware_preset(row["gpu"])
    if hardware is None:
        raise KvsimError(where, f"gpu: no kvsim preset for {row['gpu']!r}; known: {', '.join(sorted(HARDWARE_PRESETS))}")
    for col in ("rate_req_s", "duration_s")[2 * concurrent:] + ("output_len", "max_num_seqs", "max_num_batched_tokens",
                                                                 "tensor_parallel", "num_groups", "num_prompts_per_group"):
        if (floats | ints)[col] <= 0:
            raise KvsimError(where, f"{col}: must be positive")
    if floats["rate_req_s"] * floats["duration_s"] > 1_000_000:
        raise KvsimError(where, "rate_req_s x duration_s: more than 1,000,000 requests in one stage")
    eos = (row.get("ignore_eos") or "").strip().lower()
    if eos and eos not in _TRUE + _FALSE:
        raise KvsimError(where, f"ignore_eos: expected true or false, got {row['ignore_eos'].strip()!r}")
    stages_raw = (row.get("pipeline_parallel") or "").strip()
    stages = int(_num(row, "pipeline_parallel", where, int)) if stages_raw else 1
    if not 1 <= stages <= 64:
        raise KvsimError(where, f"pipeline_parallel: must be 1 .. 64, got {stages}")
    ranks_raw = (row.get("data_parallel") or "").strip()
    ranks = int(_num(row, "data_parallel", where, int)) if ranks_raw else 1
    if not 1 <= ranks <= 64:
        raise KvsimError(where, f"data_parallel: must be 1 .. 64, got {ranks}")
    blocks_raw = (row.get("num_gpu_kv_blocks_vllm_log") or "").strip()
    blocks = int(_num(row, "num_gpu_kv_blocks_vllm_log", where, int)) if blocks_raw else None
    q = {key: _optional(row, col, where) for key, col in PROMPT_COLUMNS.items()}
    given = [col for key, col in PROMPT_COLUMNS.items() if not math.isnan(q[key])]
    if given and len(given) < len(PROMPT_COLUMNS):
        raise KvsimError(where, f"{', '.join(sorted(set(PROMPT_COLUMNS.values()) - set(given)))}: give the five "
                                "server-side prompt lengths, or none (then the client's, plus a BOS token)")
    from_client = not given
    if from_client:
        q = client_prompt_quantiles(ints["system_prompt_len"], ints["question_len"])
    if not (q["p10"] <= q["p50"] <= q["p90"] <= q["p99"]) or q["p10"] < 1:
        raise KvsimError(where, "prompt_len_p10 <= median <= p90 <= p99 (and >= 1) must hold")
    return MeasuredStage(
        run=row["run"].strip(), stage=ints["stage"], model=model, hardware=hardware,
        tensor_parallel=ints["tensor_parallel"], max_model_len=ints["max_model_len"],
        max_num_batched_tokens=ints["max_num_batched_tokens"], max_num_seqs=ints["max_num_seqs"],
        num_gpu_blocks=blocks, rate_req_s=floats["rate_req_s"], duration_s=floats["duration_s"],
        num_prompts=ints["num_groups"] * ints["num_prompts_per_group"],
        system_prompt_len=ints["system_prompt_len"], output_len=ints["output_len"], prompt_quantiles=q,
        measured={m: _optional(row, c, where) for m, c in METRIC_COLUMNS.items()}, model_spec=spec, load=load,
        ignore_eos=eos not in _FALSE, num_groups=ints["num_groups"], question_len=ints["question_len"],
        concurrency=level, requests=requests, pipeline_parallel=stages, data_parallel=ranks,
        prompts_from_client=from_client)


def group_runs(stages: list[MeasuredStage]) -> dict[str, list[MeasuredStage]]:
    """Stages by run name, each run's stages in stage order (they ran one after the other)."""
    runs: dict[str, list[MeasuredStage]] = {}
    for s in stages:
        runs.setdefault(s.run, []).append(s)
    for name, ss in runs.items():
        ss.sort(key=lambda s: s.stage)
        first = ss[0]
        for s in ss[1:]:
            server = (s.model, s.hardware, s.tensor_parallel, s.pipeline_parallel, s.data_parallel, s.max_num_seqs)
            if server != (first.model, first.hardware, first.tensor_parallel, first.pipeline_parallel,
                          first.data_parallel, first.max_num_seqs):
                raise KvsimError(name, f"stage {s.stage} has other server settings than stage {first.stage}")
    return runs
