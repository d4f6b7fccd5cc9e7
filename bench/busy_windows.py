"""The busiest days of a trace replayed live in windows, each next to the virtual-clock host.

Issue 28's last bar: the busiest three days of the production trace, replayed live in
windows this machine sustains (K <= 400), each window's realised cost within 3 % of the
virtual-clock host's and its SLO attainment at least 0.99. The busiest span is found here
(the ``--hours`` with the most solo node-hours, on a grid of ``--step``), and each window
is one ``rollmux replay --window S S+STEP`` in its own process (its own Ray instance and
control plane), one after the other so that windows do not share the two cores.

``rollmux replay`` replays the live run's submissions and measured phase, start-up and
transfer times through the virtual-clock host afterwards; both runs' SLO attainment is
judged by one rule (:mod:`rollmux.sim.periods`). Per window the script prints one line;
the last line is ``windows=N cost_within_3pct=N slo_at_least_0.99=N worst_cost_ratio=R
lowest_slo=S``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rollmux.inputs.trace import Trace, load_profile, read_trace, uniform_slo

WINDOW_TIMEOUT_S = 1_800
"""A window that has not finished in this long has saturated the machine: it is killed."""


def busiest(trace: Trace, hours: float, step: float) -> float:
    """The start (on a grid of ``step`` hours) of the ``hours`` with the most solo node-hours."""
    end_h = trace.end / 3600

    def node_hours(start_h: float) -> float:
        lo, hi = start_h * 3600, (start_h + hours) * 3600
        return sum(
            max(0.0, min(j.departure, hi) - max(j.arrival, lo)) * (j.spec.rollout_width + j.spec.train_width)
            for j in trace.jobs
        )

    starts = [i * step for i in range(int((end_h - hours) // step) + 1)]
    return max(starts, key=node_hours)


def replay_window(args: argparse.Namespace, start: float, out: Path) -> dict:
    """One ``rollmux replay`` of hours ``start`` to ``start + step``; its JSON report."""
    report = out / f"window-{start:g}.json"
    command = [
        sys.executable, "-m", "rollmux.cli.main", "replay", str(args.trace), "--profile", str(args.profile),
        "--slo-uniform", str(args.slo_low), str(args.slo_high), "--seed", str(args.seed),
        "--time-scale", str(args.time_scale), "--window", str(start), str(start + args.step),
        "--mib-per-gb", str(args.mib_per_gb), "--json", str(report), "--out", str(out / f"window-{start:g}"),
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=WINDOW_TIMEOUT_S, stdout=subprocess.DEVNULL)
    return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=Path("data/traces/production-200jobs.trace"))
    parser.add_argument("--profile", type=Path, default=Path("data/traces/production-profile.json"))
    parser.add_argument("--slo-low", type=float, default=1.2)
    parser.add_argument("--slo-high", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hours", type=float, default=72.0, help="span replayed (the busiest one)")
    parser.add_argument("--step", type=float, default=6.0, help="hours per window")
    parser.add_argument("--start", type=float, help="replay from this hour instead of the busiest span's start")
    parser.add_argument("--windows", type=int, help="replay only the first N windows of the span")
    parser.add_argument("--time-scale", type=float, default=200.0)
    parser.add_argument("--mib-per-gb", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=Path("out/busy-windows"))
    args = parser.parse_args()
    if not 1 <= args.time_scale <= 400:
        parser.error("--time-scale: this machine sustains K <= 400 (issue 28)")

    trace = read_trace(args.trace, load_profile(args.profile), uniform_slo(args.slo_low, args.slo_high, args.seed))
    first = busiest(trace, args.hours, args.step) if args.start is None else args.start
    count = round(args.hours / args.step) if args.windows is None else args.windows
    args.out.mkdir(parents=True, exist_ok=True)
    span = f"{first:g}-{first + count * args.step:g}"
    print(f"span hours {span}, {count} windows of {args.step:g} h at 1/{args.time_scale:g}")
    ratios, attainments = [], []
    for index in range(count):
        start = first + index * args.step
        report = replay_window(args, start, args.out)
        realised, clock = report["realised"], report["decisions"]["virtual_clock"]
        ratio = realised["cost_usd"] / clock["cost_usd"]
        ratios.append(ratio)
        attainments.append(realised["slo_attainment"])
        print(
            f"window={start:g}-{start + args.step:g} jobs={report['jobs']} realised_usd={realised['cost_usd']:.0f} "
            f"virtual_clock_usd={clock['cost_usd']:.0f} realised_over_virtual_clock={ratio:.3f} "
            f"slo_live={realised['slo_attainment']:.3f} slo_virtual_clock={clock['slo_attainment']:.3f} "
            f"single_period_slo_live={realised['period_slo_attainment']:.3f} "
            f"single_period_slo_virtual_clock={clock['period_slo_attainment']:.3f} "
            f"moves_live={realised['migrations']} "
            f"decisions_same={report['decisions']['first_divergence'] is None} wall_s={report['wall_s']:.0f}",
            flush=True,
        )
    within = sum(abs(r - 1) <= 0.03 for r in ratios)
    print(
        f"windows={count} cost_within_3pct={within} slo_at_least_0.99={sum(a >= 0.99 for a in attainments)} "
        f"worst_cost_ratio={max(ratios, key=lambda r: abs(r - 1)):.3f} lowest_slo={min(attainments):.3f}"
    )


if __name__ == "__main__":
    main()
