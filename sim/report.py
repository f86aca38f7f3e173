"""report.html: one self-contained page of a run (figures embedded as data URIs, tables, the scenario).

No scripts, no style sheets or images fetched from elsewhere: the file opens in any browser, offline, and
can be attached to a ticket as it is.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

import yaml

from sim.output import flatten

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#212529;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #dee2e6;padding:.25em .6em}
th{background:#f1f3f5;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;display:block;margin:.5em 0 1.5em}pre{background:#f8f9fa;padding:1em;overflow:auto}"""

HEADLINE = ["num_requests", "num_finished", "num_rejected", "makespan_s", "output_throughput_tok_s",
            "request_throughput", "ttft_s.p50", "ttft_s.p99", "tpot_s.mean", "e2e_s.p99",
            "normalized_latency_s_per_tok.mean", "kv_usage_mean", "kv_usage_max", "num_preemptions",
            "prefix_cache_hit_rate", "host_cache_hit_rate", "jain_fairness", "queue_wait_max_s", "num_gpu_blocks"]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) or math.isinf(v) else f"{v:.6g}"
    return "-" if v is None else str(v)


def _table(rows: list[tuple[str, Any]], head: tuple[str, str] = ("key", "value")) -> str:
    body = "".join(f"<tr><td>{html.escape(str(k))}</td><td class=\"n\">{html.escape(_fmt(v))}</td></tr>"
                   for k, v in rows)
    return f"<table><thead><tr><th>{head[0]}</th><th>{head[1]}</th></tr></thead><tbody>{body}</tbody></table>"


def _rows_table(rows: list[dict[str, Any]]) -> str:
    """A table with a column a key (the first row's keys, in order) and a row a mapping."""
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td class=\"n\">{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(path.stem.replace("_", " "))
    return f"<h3>{html.escape(path.name)}</h3><img alt=\"{alt}\" src=\"data:image/png;base64,{data}\">"


def report_html(result, figures: list[Path]) -> str:
    """The page's text for a ``Result`` and the PNG files to embed (in that order)."""
    scn = result.scenario
    flat = flatten(result.summary)
    headline = [(k, flat[k]) for k in HEADLINE if k in flat]
    breakdown = list(result.summary.get("memory_breakdown", {}).items())
    groups = result.summary.get("cluster", {}).get("groups")
    rest = [(k, v) for k, v in flat.items() if k not in dict(headline) and not k.startswith("memory_breakdown.")
            and k != "cluster.groups"]   # (a mixed fleet's groups get a table of their own)
    scenario_yaml = yaml.safe_dump(scn.model_dump(mode="json"), sort_keys=False)
    title = f"kvsim report: {scn.name}"
    parts = [
        "<!DOCTYPE html>", "<html lang=\"en\">", "<head>", "<meta charset=\"utf-8\">",
        f"<title>{html.escape(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Scenario file: <code>{html.escape(str(scn.source))}</code>; {len(result.requests)} requests, "
        f"{len(result.steps)} engine steps.</p>",
        "<h2>Summary</h2>", _table(headline),
        "<h2>KV memory breakdown (time-weighted share of capacity)</h2>", _table(breakdown, ("part", "share")),
    ]
    replicas = getattr(result, "replicas", None)
    if replicas is not None and len(replicas):   # a cluster: replicas.csv's rows, and a mixed fleet's groups
        if groups:
            parts += ["<h2>Groups of the fleet</h2>", _rows_table(groups)]
        parts += ["<h2>Replicas</h2>", _rows_table(replicas.to_dict("records"))]
    timeline = getattr(result, "timeline", None)
    if timeline is not None:
        from sim.latency_breakdown import phase_means

        spent = list(phase_means(timeline, result.requests).items())
        if spent:
            parts += ["<h2>Where a request's time goes (mean seconds per finished request; they add up to the "
                      "mean E2E)</h2>", _table(spent, ("state", "seconds"))]
    if figures:
        parts += ["<h2>Figures</h2>", *(_figure(f) for f in figures)]
    if result.workload_stats:
        stats = [(k, v) for k, v in flatten(result.workload_stats).items() if not isinstance(v, list)]
        parts += ["<h2>Workload</h2>", _table(stats)]
    parts += ["<h2>All summary keys</h2>", _table(rest),
              "<h2>Scenario (after overrides)</h2>", f"<pre>{html.escape(scenario_yaml)}</pre>",
              "</body>", "</html>"]
    return "\n".join(parts) + "\n"


def write_report(result, folder: Path, figures: list[Path]) -> Path:
    """Write ``folder/report.html`` (callers write into a staging folder, then rename)."""
    path = Path(folder) / "report.html"
    path.write_text(report_html(result, figures), encoding="utf-8")
    return path
