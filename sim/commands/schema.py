"""kvsim schema: the JSON Schema of scenario files, for editors."""

from __future__ import annotations

import argparse
import json

from sim.scenario import scenario_json_schema


def add_parser(sub) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of scenario files")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    print(json.dumps(scenario_json_schema(), indent=2))
    return 0
