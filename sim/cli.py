"""The ``kvsim`` command. Each subcommand lives in sim/commands/<name>.py and is imported lazily.

Exit codes: 0 success; 2 bad input (one line ``error: <where>: <what>``, no traceback); 1 other failure.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sim.errors import KvsimError

# subcommand name -> module in sim.commands
COMMANDS: dict[str, str] = {
    "run": "run",
    "kv-size": "kv_size",
    "schema": "schema",
    "trace-info": "trace_info",
    "sweep": "sweep",
    "compare": "compare",
    "calibrate": "calibrate", "validate": "validate", "profile": "profile",
    "fidelity": "fidelity",
    "capacity": "capacity",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvsim", description="Simulate LLM serving with a paged KV cache.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in COMMANDS.values():
        try:
            mod = importlib.import_module(f"sim.commands.{module}")
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("sim.commands"):
                continue  # a command whose module is not in this build
            raise
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KvsimError as e:
        print(e.one_line(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; no results were written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
