"""Sweeps: a grid of scenario runs -> one results table, resumable, locally in processes or on Ray.

A sweep file (paths relative to it):

    base: quickstart.yaml                 # the scenario every point starts from
    grid:                                 # dotted key -> values; the cross product is run
      scheduler.max_num_seqs: [64, 256]
      kv_cache.block_size: [8, 16, 32]
    repeats: 2                            # seeds per point: base seed + 0, + 1, ...
    out: results/sweep1                   # results.csv (+ results.parquet when pyarrow is importable)

Every grid key and value is validated before anything runs (an unknown key is a KvsimError naming the
sweep file, its line and the key). Each run is a *task* (grid point x repeat) identified by ``task_id``, a
hash of the base scenario's text, the point and the repeat; tasks whose id already has an ``ok`` row in
results.csv are skipped, so an interrupted or extended sweep resumes where it stopped.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.errors import KvsimError
from sim.output import flatten
from sim.scenario import Scenario, apply_override, scenario_from_dict

RESULTS_CSV = "results.csv"
RESULTS_PARQUET = "results.parquet"


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base: str
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    repeats: int = Field(default=1, ge=1)
    out: str = "sweep-results"
    name: str = "sweep"


@dataclass(frozen=True)
class Task:
    """One run: a grid point (key -> value, in grid order) and a repeat index, with its seed."""

    task_id: str
    params: tuple[tuple[str, Any], ...]
    repeat: int
    seed: int
    data: dict = field(compare=False, hash=False, repr=False)  # the full scenario dict of this run


@dataclass
class Sweep:
    path: Path
    spec: SweepSpec
    base_path: Path
    out_dir: Path
    tasks: list[Task]


# ---------------------------------------------------------------- key paths against the schema


def _unwrap(ann: Any) -> list[Any]:
    """The alternatives of an annotation (Optional[X] -> [X]; X | Y -> [X, Y]); None dropped."""
    origin = typing.get_origin(ann)
    if origin is typing.Union or origin is types.UnionType:
        return [a for a in typing.get_args(ann) if a is not type(None)]
    return [ann]


def check_key_path(parts: list[str], model: type[BaseModel] = Scenario) -> str:
    """'' if ``parts`` names a field of the scenario schema, else why not (the first part that fails)."""
    anns: list[Any] = [model]
    for i, part in enumerate(parts):
        nxt: list[Any] = []
        for ann in anns:
            for alt in _unwrap(ann):
                origin = typing.get_origin(alt)
                if isinstance(alt, type) and issubclass(alt, BaseModel):
                    if part in alt.model_fields:
                        nxt.append(alt.model_fields[part].annotation)
                elif origin in (list, tuple) and part.isdigit():
                    nxt.extend(typing.get_args(alt)[:1])
                elif origin is dict:
                    nxt.append(typing.get_args(alt)[1])
        if not nxt:
            where = ".".join(parts[:i]) or "the scenario"
            known = sorted({f for ann in anns for alt in _unwrap(ann)
                            if isinstance(alt, type) and issubclass(alt, BaseModel) for f in alt.model_fields})
            hint = f"; {where} has: {', '.join(known)}" if known else ""
            return f"unknown key {part!r} in {where}{hint}"
        anns = nxt
    return ""


# ---------------------------------------------------------------- loading


def _grid_lines(text: str) -> dict[str, int]:
    """grid key -> 1-based line in the sweep file (best effort)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            lines[k.value] = k.start_mark.line + 1
            if k.value == "grid" and isinstance(v, yaml.MappingNode):
                for gk, _ in v.value:
                    lines[f"grid.{gk.value}"] = gk.start_mark.line + 1
    return lines


def _read_yaml(path: Path, what: str) -> tuple[str, Any]:
    if not path.exists():
        raise KvsimError(str(path), "no such file")
    if path.is_dir():
        raise KvsimError(str(path), f"is a directory, not a {what}")
    try:
        text = path.read_text()
        return text, yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise KvsimError(where, f"invalid YAML: {getattr(e, 'problem', None) or e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise KvsimError(str(path), f"cannot read: {e}") from None


def task_id(base_text: str, params: tuple[tuple[str, Any], ...], repeat: int) -> str:
    """Identity of one run: the base scenario's text, the point (key order does not matter), the repeat."""
    ordered = sorted(params, key=lambda p: p[0])
    blob = json.dumps({"base": hashlib.sha256(base_text.encode()).hexdigest(), "params": [list(p) for p in ordered],
                       "repeat": repeat}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file, its base scenario and every grid point. Raises KvsimError."""
    path = Path(path)
    text, raw = _read_yaml(path, "sweep file")
    if not isinstance(raw, dict):
        raise KvsimError(str(path), "a sweep file must be a mapping with base, grid, repeats, out")
    lines = _grid_lines(text)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "<top>"
        msg = {"extra_forbidden": "unknown key", "missing": "required key is missing"}.get(err["type"], err["msg"])
        line = lines.get(key) or lines.get(str(err["loc"][0])) if err["loc"] else None
        raise KvsimError(f"{path}:{line}" if line else str(path), f"{key}: {msg}") from None

    def where(key: str) -> str:
        line = lines.get(f"grid.{key}")
        return f"{path}:{line}" if line else str(path)

    for key, values in spec.grid.items():
        parts = key.split(".")
        if not key or any(not p for p in parts):
            raise KvsimError(where(key), f"grid.{key}: bad key path")
        problem = check_key_path(parts)
        if problem:
            raise KvsimError(where(key), f"grid.{key}: {problem}")
        if not values:
            raise KvsimError(where(key), f"grid.{key}: needs at least one value")

    base_path = Path(spec.base)
    base_path = base_path if base_path.is_absolute() else path.parent / base_path
    if not base_path.is_file():
        line = lines.get("base")
        raise KvsimError(f"{path}:{line}" if line else str(path), f"base: no such scenario file {base_path}")
    base_text, base = _read_yaml(base_path, "scenario file")
    if not isinstance(base, dict):
        raise KvsimError(str(base_path), "a scenario must be a mapping of keys (name, model, workload, ...)")
    source = str(base_path)

    def build(params: tuple[tuple[str, Any], ...]) -> dict:
        data = copy.deepcopy(base)
        for k, v in params:
            apply_override(data, k.split("."), copy.deepcopy(v))
        return data

    # each value on its own first, so an error names the key and value at fault
    for key, values in spec.grid.items():
        for v in values:
            try:
                scenario_from_dict(build(((key, v),)), base_dir=base_path.parent, source=source)
            except KvsimError as e:
                raise KvsimError(where(key), f"grid.{key}: value {v!r}: {e.what}") from None

    base_seed = int(base.get("seed", 0)) if isinstance(base.get("seed", 0), int) else 0
    tasks: list[Task] = []
    keys = list(spec.grid)
    for combo in itertools.product(*(spec.grid[k] for k in keys)):
        params = tuple(zip(keys, combo))
        data = build(params)
        try:
            scn = scenario_from_dict(data, base_dir=base_path.parent, source=source)
            _check_capacity(scn)
        except KvsimError as e:
            point = ", ".join(f"{k}={v!r}" for k, v in params)
            raise KvsimError(str(path), f"grid point ({point}): {e.where}: {e.what}") from None
        for r in range(spec.repeats):
            run = copy.deepcopy(data)
            run["seed"] = scn.seed + r if "seed" in spec.grid else base_seed + r
            tasks.append(Task(task_id(base_text, params, r), params, r, run["seed"], run))
    out = Path(spec.out)
    out = out if out.is_absolute() else path.parent / out
    if out.exists() and not out.is_dir():
        raise KvsimError(str(path), f"out: {out} is a file, not a folder")
    return Sweep(path, spec, base_path, out, tasks)


def _check_capacity(scn: Scenario) -> None:
    from sim.runner import gpu_blocks

    gpu_blocks(scn)  # raises KvsimError when the weights leave no room for KV


# ---------------------------------------------------------------- one run (in a worker process)


def run_task(data: dict, base_dir: str, source: str, trace: tuple[str, int] | None = None) -> dict[str, Any]:
    """Run one task's scenario; a flat row of its summary, with ``status`` ok, or error and the message.
    ``trace``: (file, request limit) of a Chrome trace-event JSON to write for this run."""
    from sim.runner import run_scenario

    try:
        scn = scenario_from_dict(data, base_dir=base_dir, source=source)
        result = run_scenario(scn)
        summary = result.summary
        if trace is not None:
            from sim.timeline import intervals_from_requests
            from sim.trace_events import write_trace_events

            tl = result.timeline if result.timeline is not None else intervals_from_requests(result.requests)
            write_trace_events(Path(trace[0]), result.steps, tl, request_limit=trace[1], name=scn.name)
    except KvsimError as e:
        return {"status": "error", "error": e.one_line()}
    except Exception as e:  # noqa: BLE001 - one failed point must not stop the sweep; the row says why
        return {"status": "error", "error": f"{type(e).__name__}: {e}"}
    row = flatten(summary)
    row["status"] = "ok"
    row["error"] = ""
    return row


def task_row(task: Task, result: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"task_id": task.task_id}
    for k, v in task.params:
        row[k] = v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v, sort_keys=True)
    row["repeat"] = task.repeat
    row["seed"] = task.seed
    row.update(result)
    return row


# ---------------------------------------------------------------- the results table


def read_results(out_dir: Path) -> list[dict[str, Any]]:
    """Rows of an earlier (possibly interrupted) sweep in ``out_dir``; [] when there are none."""
    import pandas as pd

    path = out_dir / RESULTS_CSV
    if not path.exists():
        return []
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise KvsimError(str(path), f"cannot read earlier results: {e}") from None
    if "task_id" not in df.columns or "status" not in df.columns:
        raise KvsimError(str(path), "not a kvsim sweep results table (no task_id/status columns)")
    df["task_id"] = df["task_id"].astype(str)
    return df.to_dict("records")


def write_results_table(out_dir: Path, rows: list[dict[str, Any]], parquet: bool = True) -> list[Path]:
    """results.csv (and results.parquet when pyarrow is importable), each written atomically."""
    import pandas as pd

    from sim.output import write_atomic

    df = pd.DataFrame(rows)
    written = [write_atomic(out_dir / RESULTS_CSV, lambda p: df.to_csv(p, index=False))]
    if parquet:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            return written
        table = df.copy()
        for col in table.columns:  # mixed-type columns (a grid over str and int values) as text
            if table[col].dtype == object:
                kinds = {type(v) for v in table[col] if v is not None and v == v}
                if len(kinds) > 1:
                    table[col] = table[col].map(lambda v: None if v is None or v != v else str(v))
        written.append(write_atomic(out_dir / RESULTS_PARQUET, lambda p: table.to_parquet(p, index=False)))
    return written


# ---------------------------------------------------------------- running


@dataclass
class SweepOutcome:
    total: int
    skipped: int
    ran: int
    failed: int
    files: list[Path]


def _run_local(sweep: Sweep, todo: list[Task], workers: int, on_done, trace=lambda t: None) -> None:
    args = (str(sweep.base_path.parent), str(sweep.base_path))
    if workers <= 1:
        for t in todo:
            on_done(t, run_task(t.data, *args, trace(t)))
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_task, t.data, *args, trace(t)): t for t in todo}
        try:
            for fut in as_completed(futures):
                on_done(futures[fut], fut.result())
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise


def _run_ray(sweep: Sweep, todo: list[Task], address: str | None, on_done, trace=lambda t: None) -> None:
    try:
        import ray
    except ImportError:
        raise KvsimError("--ray", "Ray is not installed; install it with: pip install 'kvsim[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address or None)
    remote = ray.remote(run_task)
    args = (str(sweep.base_path.parent), str(sweep.base_path))
    pending = {remote.remote(t.data, *args, trace(t)): t for t in todo}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            on_done(pending.pop(ref), ray.get(ref))


def run_sweep(sweep: Sweep, workers: int = 1, ray_address: str | None = None, use_ray: bool = False,
              progress: bool = True, flush_every_s: float = 2.0, trace_dir: Path | None = None,
              trace_limit: int = 1000) -> SweepOutcome:
    """Run the tasks that have no ``ok`` row yet; results are rewritten (atomically) as they come in,
    and once more at the end, also on Ctrl-C, so a resumed sweep loses at most the last few seconds.
    ``trace_dir``: each run that runs writes its Chrome trace-event JSON there as ``TASK_ID.json``."""
    import time

    rows = read_results(sweep.out_dir)
    done_ids = {str(r["task_id"]) for r in rows if r.get("status") == "ok"}
    rows = [r for r in rows if str(r["task_id"]) in done_ids]  # failed tasks are retried; their old rows go
    todo = [t for t in sweep.tasks if t.task_id not in done_ids]
    skipped = len(sweep.tasks) - len(todo)
    order = {t.task_id: i for i, t in enumerate(sweep.tasks)}
    state = {"failed": 0, "ran": 0, "flushed": time.monotonic()}
    bar = _Bar(len(sweep.tasks), skipped) if progress and todo else None

    def on_done(task: Task, result: dict[str, Any]) -> None:
        rows.append(task_row(task, result))
        state["ran"] += 1
        if result.get("status") != "ok":
            state["failed"] += 1
        if bar:
            bar.advance()
        if time.monotonic() - state["flushed"] >= flush_every_s:
            write_results_table(sweep.out_dir, rows, parquet=False)
            state["flushed"] = time.monotonic()

    files: list[Path] = []
    try:
        def trace(t: Task) -> tuple[str, int] | None:
            return None if trace_dir is None else (str(Path(trace_dir).resolve() / f"{t.task_id}.json"), trace_limit)

        if use_ray:
            _run_ray(sweep, todo, ray_address, on_done, trace)
        else:
            _run_local(sweep, todo, workers, on_done, trace)
    finally:
        if bar:
            bar.close()
        if state["ran"]:
            rows.sort(key=lambda r: order.get(str(r["task_id"]), len(order)))  # grid order, whoever finished first
            files = write_results_table(sweep.out_dir, rows)
    return SweepOutcome(len(sweep.tasks), skipped, state["ran"], state["failed"], files)


class _Bar:
    """A rich progress bar over tasks (skipped ones count as done from the start)."""

    def __init__(self, total: int, done: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=Console(stderr=True))
        self._task = self._p.add_task("sweep", total=total, completed=done)
        self._p.start()

    def advance(self) -> None:
        self._p.advance(self._task)

    def close(self) -> None:
        self._p.stop()
