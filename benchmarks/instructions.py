"""Instructions a run executes, counted by valgrind's callgrind: a measure of speed that this shared,
noisy machine does not disturb (wall time moves by 25% from one pass to the next; the count by well
under 1%), for choosing between two versions of a hot path.

    python benchmarks/instructions.py                            # the Azure hour's first 5,000 requests
    python benchmarks/instructions.py --limit 3000 --workload quickstart
    python benchmarks/instructions.py --synthetic 3000 --rate 30
    python benchmarks/instructions.py --double-output            # every output length doubled

Needs ``valgrind`` on the PATH (a system package, not a Python one). Counts the whole process, imports
included (about 2.2 G instructions before the engine's first step), under PYTHONHASHSEED=0. The
package's bytecode is compiled first: a Python told not to write ``.pyc`` files
(PYTHONDONTWRITEBYTECODE) otherwise compiles every module changed since its cached bytecode at each
import, which moves the count by up to 2%.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import subprocess
import sys

from engine_bench import ROOT, add_workload_args, outputs_doubled, workload_data

from sim import run_scenario, scenario_from_dict


def run_workload(args: argparse.Namespace) -> None:
    """The run being counted (in the child process)."""
    scn = scenario_from_dict(workload_data(args), base_dir=ROOT / "scenarios")
    with outputs_doubled(args.double_output):
        profile = run_scenario(scn, check_integrity=False).profile
    print(f"steps {profile['steps']}, decode runs {profile['decode_runs']}")


def count(argv: list[str]) -> int:
    """Instructions of this script run with ``argv`` and ``--child`` under callgrind."""
    compileall.compile_dir(str(ROOT / "sim"), quiet=1)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, *argv, "--child"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or not found:
        raise SystemExit(f"instructions: valgrind failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    print(out.stdout.strip())
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.add_argument("--double-output", action="store_true", help="double every output length")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.limit is None and not args.synthetic:
        args.limit = 5000
    if args.child:
        run_workload(args)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("instructions: valgrind is not on the PATH (install the system package)")
    print(f"instructions: {count(sys.argv[1:]) / 1e9:.3f} G")   # (the child takes the same default limit)


if __name__ == "__main__":
    main()
