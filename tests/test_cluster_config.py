"""Bad cluster settings: exit 2 with one clear line naming the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]

BAD = {
    "zero replicas": ("cluster:\n  replicas: 0\n", "cluster.replicas: Input should be greater than or equal to 1"),
    "prefill without decode": ("cluster:\n  prefill: {replicas: 2}\n", "a prefill pool needs a decode pool"),
    "decode without prefill": ("cluster:\n  decode: {replicas: 2}\n", "a decode pool needs a prefill pool"),
    "unknown link": ("cluster:\n  prefill: {replicas: 1}\n  decode: {replicas: 1}\n  kv_transfer: {link: carrier-pigeon}\n",
                     "unknown link 'carrier-pigeon'"),
    "unknown router": ("cluster:\n  replicas: 2\n  router: {policy: cheapest}\n", "cluster.router.policy"),
    "unknown key": ("cluster:\n  replicas: 2\n  routr: {policy: random}\n", "cluster.routr: unknown key"),
    "pool override": ("cluster:\n  prefill: {replicas: 1, kv_cache: {blok_size: 8}}\n  decode: {replicas: 1}\n",
                      "blok_size: unknown key"),
    "both shapes": ("cluster:\n  replicas: 2\n  prefill: {replicas: 1}\n  decode: {replicas: 1}\n",
                    "not replicas with prefill and decode pools"),
    "groups and replicas": ("cluster:\n  replicas: 2\n  groups: [{replicas: 1}]\n", "not replicas with groups"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_cluster_exits_2_with_one_line(case: str, tmp_path: Path, capsys) -> None:
    text, expect = BAD[case]
    base = (ROOT / "scenarios/seed_four_requests.yaml").read_text()
    scn = tmp_path / "bad.yaml"
    scn.write_text(base + "\n" + text)
    assert main(["run", str(scn)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {scn}:") and expect in err[0], err
