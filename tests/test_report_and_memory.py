"""report.html (a self-contained page, parsed by a strict HTML5 parser) and memory_over_time.png."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.memory_plot import breakdown_over_time

html5lib = pytest.importorskip("html5lib")

ROOT = Path(__file__).resolve().parents[1]
SEED = str(ROOT / "scenarios" / "seed_four_requests.yaml")


def _slots(rows: list[tuple[float, float, list[int]]]) -> pd.DataFrame:
    cols = ["slots_token_states", "slots_reserved", "slots_internal_frag", "slots_external_frag", "slots_free"]
    return pd.DataFrame([{"start_s": s, "duration_s": d, **dict(zip(cols, v))} for s, d, v in rows])


def test_breakdown_shares_per_step_and_duration_weighted_buckets():
    steps = _slots([(0.0, 1.0, [6, 2, 1, 0, 1]), (1.0, 3.0, [2, 0, 0, 4, 4]), (4.0, 4.0, [0, 0, 0, 0, 10])])
    bd = breakdown_over_time(steps)
    assert bd["token_states"].tolist() == pytest.approx([0.6, 0.2, 0.0])
    assert bd["free"].tolist() == pytest.approx([0.1, 0.4, 1.0])
    assert bd.drop(columns="start_s").sum(axis=1).tolist() == pytest.approx([1, 1, 1])
    two = breakdown_over_time(steps, max_points=2)  # buckets [0, 4) and [4, 8]
    assert two["start_s"].tolist() == [0.0, 4.0]
    # first bucket: (0.6 * 1 + 0.2 * 3) / 4 token states, (0 * 1 + 0.4 * 3) / 4 external fragmentation
    assert two["token_states"].tolist() == pytest.approx([0.3, 0.0])
    assert two["external_fragmentation"].tolist() == pytest.approx([0.3, 0.0])


def _parse_strict(text: str):
    return html5lib.HTMLParser(strict=True, tree=html5lib.getTreeBuilder("etree"),
                               namespaceHTMLElements=False).parse(text)


def test_run_writes_a_self_contained_report(tmp_path):
    out = tmp_path / "out"
    assert main(["run", SEED, "--out", str(out)]) == 0
    text = (out / "report.html").read_text(encoding="utf-8")
    doc = _parse_strict(text)  # raises on any parse error
    assert not re.search(r"<script|<link|<iframe|src=\"(?!data:)|url\(", text)
    imgs = doc.findall(".//img")
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "memory_over_time.png" in pngs and len(imgs) == len(pngs)
    names = [h.text for h in doc.findall(".//h3")]  # each figure: its file name, then the image
    assert sorted(names) == pngs
    for img, name in zip(imgs, names):  # embedded byte for byte
        assert base64.b64decode(img.get("src").split(",", 1)[1]) == (out / name).read_bytes()
    cells = {}
    for row in doc.findall(".//tr"):
        tds = [td.text for td in row.findall("td")]
        if len(tds) == 2:
            cells.setdefault(tds[0], tds[1])
    reqs = pd.read_csv(out / "requests.csv")
    assert cells["num_finished"] == str(int((reqs["status"] == "FINISHED").sum()))
    assert float(cells["makespan_s"]) == pytest.approx(json.loads((out / "summary.json").read_text())["makespan_s"],
                                                       rel=1e-5)
    assert "max_num_seqs: 4" in doc.find(".//pre").text
    # where a request's time goes: the states' mean seconds add up to the finished requests' mean E2E
    from sim.latency_breakdown import PARTS

    spent = sum(float(cells[k]) for k in PARTS if k in cells)
    assert spent == pytest.approx(reqs.loc[reqs["status"] == "FINISHED", "e2e_s"].mean(), rel=1e-4)


def test_report_without_figures_and_compare_memory_panels(tmp_path):
    out = tmp_path / "out"
    assert main(["run", SEED, "--out", str(out), "--no-plots"]) == 0
    doc = _parse_strict((out / "report.html").read_text(encoding="utf-8"))
    assert doc.findall(".//img") == [] and len(doc.findall(".//table")) >= 3
    cmp = tmp_path / "cmp"
    assert main(["compare", SEED, "--vary", "kv_cache.allocator=contiguous-max,paged", "--out", str(cmp)]) == 0
    assert (cmp / "memory_over_time.png").stat().st_size > 1000
