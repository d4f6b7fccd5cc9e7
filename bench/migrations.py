"""Migrations per job against cost, on the five synthetic mixes: how move discipline trades.

For each mix of rollmux.sim.generate.BENCH_SHAPES (``--jobs`` jobs, ``--seed``), the trace is
simulated under RollMux with regrouping (migrations charged) once per setting, and once
under Solo. A setting is a budget of moves (``--moves-per-day``; "none": no budget) or a
risk price per move (``--move-risk``, dollars a move must repay within the horizon beyond
its pause), all at one horizon (``--move-horizon-hours``); every budget is run at the
first risk price and every risk price without a budget. Prints one line per run: cost,
cost relative to the first setting, moves per job (those with a pause), the most moves of
one job, SLO attainment and Solo / RollMux. The last line is the mean over the mixes of
each setting's moves per job and cost ratio. Runs are spread over ``--workers`` processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace

from rollmux.core.placement import RollMuxPolicy, SoloPolicy
from rollmux.core.regroup import RegroupConfig
from rollmux.core.spec import MOVE_HORIZON_S, MOVE_RISK_GRACE, MOVE_RISK_GROWTH
from rollmux.sim.generate import BENCH_SHAPES, generate
from rollmux.sim.simulator import simulate

SOLO = "solo"


def run(mix: str, jobs: int, seed: int, setting: str) -> dict[str, float]:
    """One simulation of one mix under one setting (``SOLO``: the Solo baseline)."""
    trace = generate(replace(BENCH_SHAPES[mix], jobs=jobs, seed=seed))
    if setting == SOLO:
        return {"cost": simulate(trace, SoloPolicy()).cost_usd}
    result = simulate(trace, RollMuxPolicy(), regroup=regroup_config(setting))
    moves = [j.moves for j in result.jobs.values()]
    return {
        "cost": result.cost_usd,
        "moves_per_job": statistics.fmean(moves),
        "most_moves": max(moves),
        "slo": result.slo_attainment,
    }


def regroup_config(setting: str) -> RegroupConfig:
    """``moves_per_day=N risk=R growth=G grace=K horizon_h=H`` as a RegroupConfig (N "none": no budget)."""
    fields = dict(part.split("=") for part in setting.split())
    budget = None if fields["moves_per_day"] == "none" else float(fields["moves_per_day"])
    growth, grace = float(fields["growth"]), int(fields["grace"])
    return RegroupConfig(
        moves_per_day=budget,
        move_risk_usd=float(fields["risk"]),
        move_risk_growth=growth,
        move_risk_grace=grace,
        horizon_s=float(fields["horizon_h"]) * 3600,
    )


def settings(
    budgets: list[str], risks: list[float], growths: list[float], grace: int = 0, horizon_h: float = 2.0
) -> list[str]:
    """Every budget at the first risk price, then every other risk price without a budget,
    then every other growth of the risk price at the first risk price; all with ``grace``
    and a horizon of ``horizon_h`` hours."""
    out = [f"moves_per_day={b} risk={risks[0]:g} growth={growths[0]:g}" for b in budgets]
    out += [f"moves_per_day=none risk={r:g} growth={growths[0]:g}" for r in risks[1:]]
    out += [f"moves_per_day=none risk={risks[0]:g} growth={g:g}" for g in growths[1:]]
    return list(dict.fromkeys(f"{setting} grace={grace} horizon_h={horizon_h:g}" for setting in out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--moves-per-day", nargs="+", default=["none", "4", "1"], help="budgets to run ('none': none)")
    parser.add_argument("--move-risk", nargs="+", type=float, default=[0.0], help="risk prices per move, dollars")
    parser.add_argument(
        "--move-risk-growth",
        nargs="+",
        type=float,
        default=[MOVE_RISK_GROWTH],
        help="risk share each earlier move past the grace adds (default: the shipped one)",
    )
    parser.add_argument(
        "--move-risk-grace", type=int, default=MOVE_RISK_GRACE, help="moves of a job before its risk grows (shipped)"
    )
    parser.add_argument(
        "--move-horizon-hours",
        type=float,
        default=MOVE_HORIZON_S / 3600,
        help="hours a move's saving has to repay it in (default: the shipped one)",
    )
    parser.add_argument("--mixes", nargs="+", choices=sorted(BENCH_SHAPES), default=list(BENCH_SHAPES))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    chosen = settings(
        args.moves_per_day, args.move_risk, args.move_risk_growth, args.move_risk_grace, args.move_horizon_hours
    )
    for setting in chosen:
        try:
            regroup_config(setting)
        except ValueError as refused:
            parser.error(f"setting '{setting}' (from --move-risk / --move-horizon-hours / growth / grace): {refused}")
    runs = [(mix, s) for mix in args.mixes for s in [SOLO, *chosen]]
    found: dict[tuple[str, str], dict[str, float]] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = {pool.submit(run, mix, args.jobs, args.seed, s): (mix, s) for mix, s in runs}
        for done in as_completed(futures):
            found[futures[done]] = done.result()
            print(f"done {len(found)}/{len(runs)}: {' '.join(futures[done])}", file=sys.stderr, flush=True)
    per_setting: dict[str, list[tuple[float, float]]] = {}
    for mix in args.mixes:
        solo, first = found[(mix, SOLO)]["cost"], found[(mix, chosen[0])]["cost"]
        for setting in chosen:
            r = found[(mix, setting)]
            per_setting.setdefault(setting, []).append((r["moves_per_job"], r["cost"] / first))
            print(
                f"mix={mix} seed={args.seed} {setting} cost_usd={r['cost']:.0f} "
                f"cost_vs_first={r['cost'] / first:.3f} moves_per_job={r['moves_per_job']:.2f} "
                f"most_moves={r['most_moves']} slo={100 * r['slo']:.1f}% solo_over_rollmux={solo / r['cost']:.3f}",
                flush=True,
            )
    for setting, rows in per_setting.items():
        print(
            f"{setting}: mean moves_per_job={statistics.fmean(m for m, _ in rows):.2f} "
            f"mean cost_vs_first={statistics.fmean(c for _, c in rows):.3f}"
        )


if __name__ == "__main__":
    main()
