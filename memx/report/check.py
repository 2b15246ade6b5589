"""`memx plan --check BASELINE.json`: is the new plan the same as, or better than, the baseline?

Both plans are scored with the current predictor and the current search's Φ references, so the
comparison is like for like. Exit 0 when the plan is unchanged or better; 4 when it changed for the
worse, or when the new plan's smallest memory margin is below the threshold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memx.domain.errors import InputError
from memx.planner.estimate import estimate_plans
from memx.planner.objective import phi
from memx.domain.plan import Plan, plan_from_dict
from memx.domain.specs import Weights


@dataclass(frozen=True, kw_only=True)
class CheckOutcome:
    verdict: str  # same | better | worse | low-margin | baseline-infeasible
    exit_code: int
    markdown: str


def load_baseline(path: Path) -> Plan:
    """A `memx plan --format json` output (its "plan") or a bare plan JSON."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise InputError(f"{path}: baseline file not found") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from exc
    if isinstance(data, dict) and "plan" in data:
        data = data["plan"]
    return plan_from_dict(data, source=str(path))


def check(obj: dict, baseline: Plan, cluster, model, predictor, *, reserve_gib: float, min_margin: float) -> CheckOutcome:
    """obj: the `memx plan --format json` answer of this run."""
    new, refs = obj["predicted"], obj["references"]
    new_plan = plan_from_dict(obj["plan"])
    weights = Weights(profile=obj["weights"]["profile"], w_time=obj["weights"]["w"][0], w_mem=obj["weights"]["w"][1],
                      w_var=obj["weights"]["w"][2])
    if baseline.model != model.name or baseline.cluster != cluster.name:
        raise InputError(f"baseline is for {baseline.model} on {baseline.cluster}, this run is {model.name} on {cluster.name}")
    reason = ""
    try:
        est = estimate_plans([baseline], cluster, model, predictor, reserve_gib=reserve_gib)[0]
    except InputError as exc:  # the baseline no longer fits the catalog: any feasible plan beats it
        est, reason = None, str(exc)
    base_phi = None if est is None else float(phi(
        est.iteration_time_ms, est.max_mem_mib, est.mem_variance_mib2,
        refs=(refs["time_ms"], refs["max_mem_mib"], refs["mem_variance_mib2"]), weights=weights,
        epsilon_mib2=refs["epsilon_mib2"]))
    if new["min_margin"] < min_margin:
        verdict, code = "low-margin", 4
    elif new_plan == baseline:
        verdict, code = "same", 0
    elif est is None or not est.feasible:
        verdict, code = "baseline-infeasible", 0
    elif new["phi"] <= base_phi * (1 + 1e-4):  # Φ is reported to 5 digits
        verdict, code = "better", 0
    else:
        verdict, code = "worse", 4
    rows = [("iteration time ms", new["iteration_time_ms"], est and est.iteration_time_ms),
            ("max memory GiB", new["max_mem_mib"] / 1024, est and est.max_mem_mib / 1024),
            ("memory std-dev GiB", new["mem_variance_mib2"] ** 0.5 / 1024, est and est.mem_variance_mib2 ** 0.5 / 1024),
            ("smallest margin", new["min_margin"], est and est.min_margin), ("Φ", new["phi"], base_phi)]
    md = [f"## MemX plan check: **{verdict}** (exit {code})", "",
          f"{model.name} on {cluster.name}, weights `{weights.profile}`, margin threshold {min_margin:.0%}.", "",
          "| | new plan | baseline |", "|---|---|---|"]
    md += [f"| {name} | {a:,.4g} | {'n/a' if b is None else f'{b:,.4g}'} |" for name, a, b in rows]
    if est is None:
        md += ["", f"Baseline no longer valid: {reason}"]
    elif not est.feasible:
        md += ["", "Baseline is predicted to run out of memory with the current predictor."]
    return CheckOutcome(verdict=verdict, exit_code=code, markdown="\n".join(md) + "\n")
