"""Where RollMux's saving on the production trace comes from, over several SLO draws.

Runs Solo-disaggregated, Co-located and four RollMux variants on the production trace for
each seed (SLOs from U(1.2, 1.5)):

- ``pack-or-isolate``: an arriving job joins an existing group on its existing nodes or
  gets its own group;
- ``rollmux``: additionally may join a group's trainers on new rollout nodes of its own
  (scale rollout);
- ``rollmux+regroup``: additionally re-partitions the running jobs (exact MILP over the
  current groups and every set of up to three jobs) after each event and migrates them
  when the saving repays the migration within two hours (migration charged: 30 s pause
  + 0.25 s per GB of resident state, old and new nodes both paid meanwhile, and the
  moved jobs' lost progress);
- ``rollmux+regroup@0.5s/GB``: the same with migrations twice as slow.

Prints the Solo/variant and Co-located/variant cost ratios per seed and their mean, and
each variant's distance to the fluid lower bound, all measured in this run. Only the
first two are online in the strict sense (no running job is moved).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from rollmux.core.placement import ColocatedPolicy, RollMuxPolicy, SoloPolicy
from rollmux.core.regroup import RegroupConfig
from rollmux.inputs.trace import load_profile, read_trace, uniform_slo
from rollmux.sim.simulator import fluid_lower_bound_usd, simulate

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
VARIANTS = {
    "pack-or-isolate": (lambda: RollMuxPolicy(scale_rollout=False), None),
    "rollmux": (RollMuxPolicy, None),
    "rollmux+regroup": (RollMuxPolicy, RegroupConfig()),
    "rollmux+regroup@0.5s/GB": (RollMuxPolicy, RegroupConfig(s_per_gb=0.5)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="SLO draws 0..N-1")
    args = parser.parse_args()
    profile = load_profile(DATA / "production-profile.json")
    ratios: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for seed in range(args.seeds):
        trace = read_trace(DATA / "production-200jobs.trace", profile, uniform_slo(1.2, 1.5, seed))
        solo = simulate(trace, SoloPolicy()).cost_usd
        colo = simulate(trace, ColocatedPolicy()).cost_usd
        fluid = fluid_lower_bound_usd(trace)
        for name, (make, regroup) in VARIANTS.items():
            result = simulate(trace, make(), regroup=regroup)
            ratios[name].append(solo / result.cost_usd)
            print(
                f"seed={seed} variant={name} solo_over={solo / result.cost_usd:.3f} "
                f"colocated_over={colo / result.cost_usd:.3f} over_fluid={result.cost_usd / fluid:.3f} "
                f"slo_attainment={result.slo_attainment:.3f} migrations={result.migrations}"
            )
    summary = " ".join(f"{name}={statistics.mean(values):.3f}" for name, values in ratios.items())
    print(f"mean_solo_over_variant {summary}")


if __name__ == "__main__":
    main()
