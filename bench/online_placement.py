"""Online placement alone (no regrouping, no migration) against Solo and Co-located, on
seeded synthetic traces of five mixes: what a user who cannot accept migrations gets.

For each mix, the same trace is simulated with RollMux's placement (co-located seats
allowed, the default), RollMux's placement without co-location (as before 2026-12-03),
Solo and Co-located. Prints each cost and ``rollmux / min(solo, colocated)``, the SLO
attainment, and the co-located job-hours. Bar (issue 27): RollMux ≤ min(Solo, Co-located)
on every mix.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from rollmux.core.placement import ColocatedPolicy, RollMuxPolicy, SoloPolicy
from rollmux.sim.generate import BENCH_SHAPES, generate
from rollmux.sim.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    table = Table(title=f"online placement, {args.jobs} jobs per mix, seed {args.seed} (costs in $)")
    for column in ("mix", "rollmux", "no co-location", "solo", "colocated", "rollmux / min", "SLO", "co-located h"):
        table.add_column(column, justify="left" if column == "mix" else "right", no_wrap=True, overflow="fold")
    worst = 0.0
    for mix, shape in BENCH_SHAPES.items():
        trace = generate(replace(shape, jobs=args.jobs, seed=args.seed))
        runs = {
            "rollmux": simulate(trace, RollMuxPolicy()),
            "plain": simulate(trace, RollMuxPolicy(colocate=False)),
            "solo": simulate(trace, SoloPolicy()),
            "colocated": simulate(trace, ColocatedPolicy()),
        }
        ratio = runs["rollmux"].cost_usd / min(runs["solo"].cost_usd, runs["colocated"].cost_usd)
        worst = max(worst, ratio)
        summary = runs["rollmux"].summary()
        table.add_row(
            mix,
            *(f"{runs[k].cost_usd:,.0f}" for k in ("rollmux", "plain", "solo", "colocated")),
            f"{ratio:.3f}",
            f"{100 * summary['slo_attainment']:.1f}%",
            f"{summary['colocated_job_hours']:,.0f}",
        )
    Console(width=160).print(table)
    print(f"worst_rollmux_over_min={worst:.3f} ok={worst <= 1.0}")


if __name__ == "__main__":
    main()
