"""Write ``tests/slow_tests.txt`` from pytest's ``--durations=0`` reports: the fast tier's list of slow tests.

Why a list: a test's cost is a measurement, not something its author guesses; ``conftest.py`` marks the
listed tests ``slow`` when they are collected, so ``make test-fast`` (``-m 'not slow'``) leaves them out and
``make test`` (CI) runs everything. A test is listed when its setup + call + teardown took at least
``--seconds``; a whole file when one setup took ``--file-seconds`` (a module fixture that every test of
the file shares: listing only the test it was timed on would move it to the next one).

Example:
    $ python -m pytest -q -p no:cacheprovider --durations=0 tests/test_cli.py > runs/durations/test_cli.txt
    $ python tests/slow_tests.py runs/durations/*.txt --seconds 5 --file-seconds 30 > tests/slow_tests.txt
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(.+?)\s*$")  # a parameter id may hold spaces


def slow_tests(reports: list[Path], seconds: float, file_seconds: float) -> list[tuple[str, float]]:
    """(node id or file, seconds) of what takes at least ``seconds``, files first."""
    per_test: dict[str, float] = defaultdict(float)
    files: dict[str, float] = {}
    for report in reports:
        for line in report.read_text(encoding="utf-8", errors="replace").splitlines():
            match = LINE.match(line)
            if match is None:
                continue
            took, phase, node = float(match.group(1)), match.group(2), match.group(3)
            per_test[node] += took
            if phase == "setup" and took >= file_seconds:
                file = node.split("::")[0]
                files[file] = max(files.get(file, 0.0), took)
    tests = [(node, took) for node, took in per_test.items()
             if took >= seconds and node.split("::")[0] not in files]
    return sorted(files.items()) + sorted(tests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--file-seconds", type=float, default=30.0)
    options = parser.parse_args()
    print(f"# written by tests/slow_tests.py --seconds {options.seconds:g} --file-seconds {options.file_seconds:g} "
          "from --durations=0 reports (2 shared cores); one node id or file per line")
    for node, took in slow_tests(options.reports, options.seconds, options.file_seconds):
        print(f"{node}  # {took:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
