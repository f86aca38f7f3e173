"""report.html in a real headless browser: every figure decodes and the tables render.

Skipped when no Chromium is installed (Debian: ``apt-get install chromium-headless-shell``); the strict HTML5
parse in test_report_and_memory.py runs everywhere.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sim.cli import main

SEED = str(Path(__file__).resolve().parents[1] / "scenarios" / "seed_four_requests.yaml")
BROWSER = next((b for b in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
                if shutil.which(b)), None)

# loads the report in a frame and writes what the browser made of it into an attribute of the page
PROBE = """<!DOCTYPE html><html><body><iframe id="f" src="{src}"></iframe><script>
document.getElementById("f").addEventListener("load", function () {{
  var d = this.contentDocument, imgs = Array.from(d.images);
  document.body.setAttribute("data-result", JSON.stringify({{title: d.title, images: imgs.length,
    decoded: imgs.filter(function (i) {{ return i.complete && i.naturalWidth > 100; }}).length,
    tables: d.querySelectorAll("table").length, rows: d.querySelectorAll("tr").length}}));
}});
</script></body></html>"""


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium installed")
def test_report_opens_in_a_headless_browser(tmp_path):
    out = tmp_path / "out"
    assert main(["run", SEED, "--out", str(out)]) == 0
    probe = tmp_path / "probe.html"
    probe.write_text(PROBE.format(src=(out / "report.html").as_uri()))
    r = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                        "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r'data-result="([^"]*)"', r.stdout)
    assert m, r.stderr[-2000:]
    seen = json.loads(html.unescape(m.group(1)))
    pngs = len(list(out.glob("*.png")))
    assert seen["title"] == "kvsim report: seed_four_requests"
    assert seen["images"] == seen["decoded"] == pngs == 8   # (hbm_budget.png: the cache is sized from HBM)
    assert seen["tables"] >= 4 and seen["rows"] > 20
