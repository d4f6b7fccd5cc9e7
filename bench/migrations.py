"""Migrations per job against cost, on the five synthetic mixes: how a budget of moves trades.

For each mix of rollmux.sim.generate.BENCH_SHAPES (``--jobs`` jobs, ``--seed``), the trace is
simulated under RollMux with regrouping (migrations charged) once per ``--moves-per-day``
value ("none": no budget, the default of ``RegroupConfig``), and once under Solo. Prints one
line per run: cost, cost relative to the run without a budget, moves per job (those with a
pause), the most moves of one job, SLO attainment and Solo / RollMux. The last line is the
mean over the mixes of each budget's moves per job and cost ratio. Runs are spread over
``--workers`` processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from rollmux.core.placement import RollMuxPolicy, SoloPolicy
from rollmux.core.regroup import RegroupConfig
from rollmux.sim.generate import BENCH_SHAPES, generate
from rollmux.sim.simulator import simulate


def run(mix: str, jobs: int, seed: int, budget: float | None) -> dict[str, float]:
    """One simulation of one mix: RollMux with that budget (``-1``: Solo)."""
    trace = generate(replace(BENCH_SHAPES[mix], jobs=jobs, seed=seed))
    if budget == -1:
        return {"cost": simulate(trace, SoloPolicy()).cost_usd}
    result = simulate(trace, RollMuxPolicy(), regroup=RegroupConfig(moves_per_day=budget))
    moves = [j.moves for j in result.jobs.values()]
    return {
        "cost": result.cost_usd,
        "moves_per_job": statistics.fmean(moves),
        "most_moves": max(moves),
        "slo": result.slo_attainment,
    }


def budget_value(text: str) -> float | None:
    return None if text == "none" else float(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--moves-per-day", nargs="+", default=["none", "4", "1"], help="budgets to run ('none': none)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    budgets = [budget_value(b) for b in args.moves_per_day]
    runs = [(mix, b) for mix in BENCH_SHAPES for b in [-1, *budgets]]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        found = dict(
            zip(runs, pool.map(run, *zip(*[(m, args.jobs, args.seed, b) for m, b in runs], strict=True)), strict=True)
        )
    per_budget: dict[str, list[tuple[float, float]]] = {}
    for mix in BENCH_SHAPES:
        solo, plain = found[(mix, -1)]["cost"], found[(mix, budgets[0])]["cost"]
        for budget, label in zip(budgets, args.moves_per_day, strict=True):
            r = found[(mix, budget)]
            per_budget.setdefault(label, []).append((r["moves_per_job"], r["cost"] / plain))
            print(
                f"mix={mix} seed={args.seed} moves_per_day={label} cost_usd={r['cost']:.0f} "
                f"cost_vs_{args.moves_per_day[0]}={r['cost'] / plain:.3f} moves_per_job={r['moves_per_job']:.2f} "
                f"most_moves={r['most_moves']} slo={100 * r['slo']:.1f}% solo_over_rollmux={solo / r['cost']:.3f}",
                flush=True,
            )
    print(
        " ".join(
            f"moves_per_day={label}: moves_per_job={statistics.fmean(m for m, _ in rows):.2f} "
            f"cost_ratio={statistics.fmean(c for _, c in rows):.3f}"
            for label, rows in per_budget.items()
        )
    )


if __name__ == "__main__":
    main()
