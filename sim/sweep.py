"""Sweeps: a grid of scenario runs -> one results table, resumable, locally in processes or on Ray.

A sweep file (paths relative to it):

    base: quickstart.yaml                 # the scenario every point starts from
    grid:                                 # dotted key -> values; the cross product is run
      scheduler.max_num_seqs: [64, 256]
      kv_cache.block_size: [8, 16, 32]
    repeats: 2                            # seeds per point: base seed + 0, + 1, ...
    out: results/sweep1                   # results.csv (+ results.parquet when pyarrow is importable)
    slo: [ttft_p90=2, tpot_p90=0.1]       # optional: each row gains slo.* (sim/goodput.py: met or not,
                                          # attainment, goodput); part of each task's identity

Every grid key and value is validated before anything runs (an unknown key is a KvsimError naming the
sweep file, its line and the key); a value given twice for one key, a key together with its parent
(``kv_cache`` and ``kv_cache.block_size``) and more than ``MAX_GRID_RUNS`` runs are refused up front.

Each run is a *task* (grid point x repeat). Its ``scenario_hash`` hashes the resolved scenario of that run
(every key after the grid values are applied, the seed included, and the content of the trace and
calibration files it reads), and its ``task_id`` hashes that, the point and the repeat. results.csv holds
exactly one row per task, with both columns. Tasks whose id already has an ``ok`` row are skipped, so an
interrupted or extended sweep resumes where it stopped. Rows whose id is not a task of this sweep (the
base scenario, a trace or the grid changed since) make the sweep refuse, naming the folder: their
numbers would otherwise sit beside new ones with the same grid values.

One sweep at a time writes a folder: a second one refuses (a lock file, released when the first ends
or dies). Worker processes stop when the sweep stops (Ctrl-C, SIGTERM) and exit on their own when
their parent dies.
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

from sim.cluster.capacity import parse_slo
from sim.errors import KvsimError
from sim.limits import MAX_GRID_RUNS
from sim.output import flatten
from sim.scenario import Scenario, apply_override, scenario_from_dict
from sim.sweep_lock import SweepLock
from sim.worker_pool import require_ray, worker_pool
from sim.yamlfile import read_yaml_file

RESULTS_CSV = "results.csv"
RESULTS_PARQUET = "results.parquet"


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base: str
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    repeats: int = Field(default=1, ge=1, le=MAX_GRID_RUNS)
    out: str = "sweep-results"
    name: str = "sweep"
    slo: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Task:
    """One run: a grid point (key -> value, in grid order) and a repeat index, with its seed."""

    task_id: str
    params: tuple[tuple[str, Any], ...]
    repeat: int
    seed: int
    data: dict = field(compare=False, hash=False, repr=False)  # the full scenario dict of this run
    scenario_hash: str = ""  # the resolved scenario of this run (see the module docstring)


@dataclass
class Sweep:
    path: Path
    spec: SweepSpec
    base_path: Path
    out_dir: Path
    tasks: list[Task]
    slos: list = field(default_factory=list)   # sim.cluster.capacity.SLO, from ``slo``


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
    text, data, _ = read_yaml_file(path, what)
    return text, data


def task_id(scenario_hash: str, params: tuple[tuple[str, Any], ...], repeat: int, slo: list[str] | None = None
            ) -> str:
    """Identity of one run: its resolved scenario, the point (key order does not matter), the repeat, and
    the SLOs its row is measured against (none: the identity sweeps without SLOs always had)."""
    ordered = sorted(params, key=lambda p: p[0])
    what = {"scenario": scenario_hash, "params": [list(p) for p in ordered], "repeat": repeat}
    if slo:
        what["slo"] = sorted(slo)
    blob = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _file_digest(path: Path, cache: dict[Path, str]) -> str:
    if path not in cache:
        h = hashlib.sha256()
        try:
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            cache[path] = h.hexdigest()
        except OSError:
            cache[path] = "unreadable"
    return cache[path]


def scenario_hash(scn: Scenario, cache: dict[Path, str] | None = None) -> str:
    """A content hash of a validated scenario: every key (defaults filled in) and the bytes of the files
    it names (``trace`` and ``calibration`` keys, wherever they are)."""
    cache = {} if cache is None else cache
    dump = scn.model_dump(mode="json")
    files: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("trace", "calibration") and isinstance(v, str):
                    p = scn.resolve_path(v)
                    if p.is_file():
                        files[v] = _file_digest(p, cache)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dump)
    blob = json.dumps({"scenario": dump, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _value_key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _check_grid_shape(spec: SweepSpec, where) -> None:  # noqa: ANN001 - where: key -> "file:line"
    """Duplicate values, a key with its parent, and too many runs: refused before anything is built."""
    for key, values in spec.grid.items():
        seen: set[str] = set()
        for v in values:
            k = _value_key(v)
            if k in seen:
                raise KvsimError(where(key), f"grid.{key}: value {v!r} is given twice (each point runs once; "
                                 "use repeats for more runs)")
            seen.add(k)
    keys = list(spec.grid)
    for a in keys:
        for b in keys:
            if a != b and b.startswith(a + "."):
                raise KvsimError(where(b), f"grid.{b}: overlaps grid.{a} (the value of one would overwrite the "
                                 "other); give one of them")
    runs = spec.repeats
    for values in spec.grid.values():
        runs *= max(1, len(values))
        if runs > MAX_GRID_RUNS:
            break
    if runs > MAX_GRID_RUNS:
        total = spec.repeats
        for values in spec.grid.values():
            total *= max(1, len(values))
        raise KvsimError(where("") if not spec.grid else where(keys[0]),
                         f"grid: {total:,} runs (points x repeats) exceed the limit of {MAX_GRID_RUNS:,}")


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file, its base scenario and every grid point. Raises KvsimError."""
    path = Path(path)
    text, raw = _read_yaml(path, "sweep file")
    if not isinstance(raw, dict):
        raise KvsimError(str(path), "a sweep file must be a mapping with base, grid, repeats, out")
    if "workload" in raw and "base" not in raw:
        raise KvsimError(str(path), "a scenario, not a sweep file (base, grid): run it with `kvsim run FILE`, or "
                                    "vary its keys with `kvsim compare FILE --vary KEY=A,B`")
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
        line = lines.get(f"grid.{key}") or lines.get("grid")
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
    _check_grid_shape(spec, where)
    slos = []
    for text in spec.slo:
        try:
            slos.append(parse_slo(text))
        except KvsimError as e:
            line = lines.get("slo")
            raise KvsimError(f"{path}:{line}" if line else str(path), f"slo: {e.what}") from None

    base_path = Path(spec.base)
    base_path = base_path if base_path.is_absolute() else path.parent / base_path
    if not base_path.is_file():
        line = lines.get("base")
        raise KvsimError(f"{path}:{line}" if line else str(path), f"base: no such scenario file {base_path}")
    _, base = _read_yaml(base_path, "scenario file")
    if not isinstance(base, dict):
        raise KvsimError(str(base_path), "a scenario must be a mapping of keys (name, model, workload, ...)")
    source = str(base_path)

    def build(params: tuple[tuple[str, Any], ...]) -> dict:
        data = copy.deepcopy(base)
        for k, v in params:
            apply_override(data, k.split("."), copy.deepcopy(v), base_path.parent)
        return data

    # each value on its own first, so an error names the key and value at fault
    for key, values in spec.grid.items():
        for v in values:
            try:
                scenario_from_dict(build(((key, v),)), base_dir=base_path.parent, source=source)
            except KvsimError as e:
                raise KvsimError(where(key), f"grid.{key}: value {v!r}: {e.what}") from None

    base_seed = int(base.get("seed", 0)) if isinstance(base.get("seed", 0), int) else 0
    digests: dict[Path, str] = {}
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
            digest = scenario_hash(scn.model_copy(update={"seed": run["seed"]}), digests)
            tasks.append(Task(task_id(digest, params, r, spec.slo), params, r, run["seed"], run, digest))
    out = Path(spec.out)
    out = out if out.is_absolute() else path.parent / out
    if out.exists() and not out.is_dir():
        raise KvsimError(str(path), f"out: {out} is a file, not a folder")
    return Sweep(path, spec, base_path, out, tasks, slos)


def _check_capacity(scn: Scenario) -> None:
    from sim.runner import gpu_blocks

    gpu_blocks(scn)  # raises KvsimError when the weights leave no room for KV


# ---------------------------------------------------------------- one run (in a worker process)


def run_task(data: dict, base_dir: str, source: str, trace: tuple[str, int] | None = None,
             slos: list | None = None) -> dict[str, Any]:
    """Run one task's scenario; a flat row of its summary, with ``status`` ok, or error and the message.
    ``trace``: (file, request limit) of a Chrome trace-event JSON to write for this run; ``slos``: the
    summary gains ``slo`` (sim/goodput.py)."""
    from sim.runner import run_scenario

    try:
        scn = scenario_from_dict(data, base_dir=base_dir, source=source)
        result = run_scenario(scn, keep_steps=trace is not None)   # (a trace draws the steps; a row needs none)
        summary = result.summary
        if slos:
            from sim.goodput import slo_report

            summary = {**summary, "slo": slo_report(result.requests, summary, slos)}
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
    row: dict[str, Any] = {"task_id": task.task_id, "scenario_hash": task.scenario_hash}
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
    """results.csv (and results.parquet when pyarrow is importable), each written atomically. The old
    parquet goes first, so when present it always holds the same rows as the csv (a flush mid-sweep, or a
    kill between the two files, leaves the csv alone)."""
    import pandas as pd

    from sim.output import write_atomic

    df = pd.DataFrame(rows)
    (out_dir / RESULTS_PARQUET).unlink(missing_ok=True)
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
            on_done(t, run_task(t.data, *args, trace(t), sweep.slos))
        return
    from concurrent.futures import as_completed

    with worker_pool(workers) as pool:
        futures = {pool.submit(run_task, t.data, *args, trace(t), sweep.slos): t for t in todo}
        for fut in as_completed(futures):
            on_done(futures[fut], fut.result())


def _run_ray(sweep: Sweep, todo: list[Task], address: str | None, on_done, trace=lambda t: None) -> None:
    require_ray()
    import ray

    started = not ray.is_initialized()
    if started:  # a local cluster (no address) is started here and shut down when the sweep ends
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(run_task)
    args = (str(sweep.base_path.parent), str(sweep.base_path))
    pending = {remote.remote(t.data, *args, trace(t), sweep.slos): t for t in todo}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                on_done(pending.pop(ref), ray.get(ref))
    except BaseException:
        for ref in pending:  # Ctrl-C, SIGTERM: stop the runs still queued or running on the cluster
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def _check_foreign_rows(sweep: Sweep, rows: list[dict[str, Any]]) -> None:
    """Refuse results of tasks this sweep does not have (an edited base or trace, a changed grid)."""
    ids = {t.task_id for t in sweep.tasks}
    foreign = [r for r in rows if str(r["task_id"]) not in ids]
    if foreign:
        path = sweep.out_dir / RESULTS_CSV
        raise KvsimError(str(path), f"{len(foreign)} of its {len(rows)} rows are not runs of this sweep (the base "
                         "scenario, a file it reads, or the grid changed since); use another out folder, or "
                         "delete this table to start over")


def run_sweep(sweep: Sweep, workers: int = 1, ray_address: str | None = None, use_ray: bool = False,
              progress: bool = True, flush_every_s: float = 2.0, trace_dir: Path | None = None,
              trace_limit: int = 1000) -> SweepOutcome:
    """Run the tasks that have no ``ok`` row yet; results are rewritten (atomically) as they come in,
    and once more at the end, also on Ctrl-C, so a resumed sweep loses at most the last few seconds.
    Holds the folder's lock throughout (a second sweep on the folder refuses).
    ``trace_dir``: each run that runs writes its Chrome trace-event JSON there as ``TASK_ID.json``."""
    if use_ray:
        require_ray()
    with SweepLock(sweep.out_dir):
        return _run_locked(sweep, workers, ray_address, use_ray, progress, flush_every_s, trace_dir, trace_limit)


def _run_locked(sweep: Sweep, workers: int, ray_address: str | None, use_ray: bool, progress: bool,
                flush_every_s: float, trace_dir: Path | None = None, trace_limit: int = 1000) -> SweepOutcome:
    import time

    for stale in sweep.out_dir.glob(".results.*.tmp"):  # a killed writer's temp files (we hold the lock)
        stale.unlink(missing_ok=True)
    rows = read_results(sweep.out_dir)
    _check_foreign_rows(sweep, rows)
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
    except BaseException as e:  # Ctrl-C, SIGTERM (sim.cli raises Terminated, a KeyboardInterrupt), a crash
        if bar:
            bar.close()
            bar = None
        table = sweep.out_dir / RESULTS_CSV
        if state["ran"]:
            rows.sort(key=lambda r: order.get(str(r["task_id"]), len(order)))
            write_results_table(sweep.out_dir, rows)
        if isinstance(e, KeyboardInterrupt):
            e.args = (f"{state['ran']} of {len(todo)} runs finished; {len(rows)} rows are in {table}; run the "
                      "sweep again to resume" if state["ran"] else
                      f"no run had finished; {table} is as it was",)
        raise
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
