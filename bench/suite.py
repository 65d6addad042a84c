"""How long the test suite takes: the quick tier (the edit loop) and the whole suite.

Runs ``./dev test --quick`` and ``./dev test`` (what CI runs) as a user would, each from
this checkout, and prints the wall time of each with the machine's load average
before and after, since a loaded machine stretches both::

    figure suite_quick_s = …
    figure suite_full_s = …
    figure suite_load_avg_1min = …   (the mean of the readings before and after each run)

``--quick-only`` times the quick tier alone. Extra arguments after ``--`` go to pytest
(for example ``-- -x``). A run that fails still prints its time, then exits 1.

Usage: ``python bench/suite.py [--quick-only] [-- pytest args]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, mean 1-minute load average (before and after), exit status."""
    before = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO)
    seconds = time.monotonic() - started
    return seconds, (before + os.getloadavg()[0]) / 2, done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick-only", action="store_true", help="time the quick tier alone")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    runs = [("quick", ["./dev", "test", "--quick", *args.pytest_args])]
    if not args.quick_only:
        runs.append(("full", ["./dev", "test", *args.pytest_args]))
    failed = False
    loads = []
    for name, command in runs:
        seconds, load, status = timed(command)
        loads.append(load)
        failed |= status != 0
        print(f"figure suite_{name}_s = {seconds:.0f}", flush=True)
        print(f"  ({' '.join(command)}: exit {status}, load average {load:.2f} on {os.cpu_count()} cores)")
    print(f"figure suite_load_avg_1min = {sum(loads) / len(loads):.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
