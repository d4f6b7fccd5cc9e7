"""The live scenario tests kept out of ``make test`` so that the suite stays short.

``make test`` runs every test not marked ``slow`` (under 15 minutes on two cores). The
scenarios marked ``slow`` are the longer live variants: more kill points of moves,
failovers and copies, two runs sharing one Ray
cluster in every order, the TRL jobs multiplexed next to each alone (on vLLM engines too),
a vLLM engine killed in a job's rollout, long-tail migration live on vLLM engines, the
control plane killed while a regrouping readies its new nodes. They are as strict as the rest; they only take
longer. This runs them with pytest and prints one line per test with its time, then
``passed=… failed=… wall_s=…`` (exit 1 if any failed).

    python bench/scenarios.py            # every slow scenario (tens of minutes on two cores)
    python bench/scenarios.py -k failover  # the ones whose name matches
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only the scenarios whose test name matches (pytest -k)")
    args = parser.parse_args()
    command = [sys.executable, "-m", "pytest", "-m", "slow", "-p", "no:cacheprovider", "-rA", "--durations=0", "-q"]
    if args.k:
        command += ["-k", args.k]
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    lines = result.stdout.splitlines()
    for line in lines:
        if line.startswith(("PASSED", "FAILED", "ERROR")) or " call " in line:
            print(line)
    passed = sum(line.startswith("PASSED") for line in lines)
    failed = sum(line.startswith(("FAILED", "ERROR")) for line in lines)
    if result.returncode not in (0, 1):
        print(result.stdout[-4000:], result.stderr[-4000:], sep="\n", file=sys.stderr)
    print(f"passed={passed} failed={failed} wall_s={wall:.0f}")
    return 0 if result.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
