"""The ``kvsim`` command. Each subcommand lives in sim/commands/<name>.py and is imported lazily.

Exit codes: 0 success; 2 bad input (one line ``error: <where>: <what>``, no traceback); 1 other failure.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so it unwinds (and cleans up) exactly like Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = signal.getsignal(signal.SIGTERM)
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(args.func(args) or 0)
    except KvsimError as e:
        print(e.one_line(), file=sys.stderr)
        return 2
    except OSError as e:   # a write that failed after the checks (a full disk, a folder removed meanwhile)
        if e.filename is None:
            raise
        print(f"error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # a command that saved partial results says so in the exception; otherwise nothing was written
        what = e.args[0] if e.args and isinstance(e.args[0], str) else "no results were written"
        if isinstance(e, Terminated):
            print(f"error: terminated (SIGTERM); {what}", file=sys.stderr)
            return 143
        print(f"error: interrupted; {what}", file=sys.stderr)
        return 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
