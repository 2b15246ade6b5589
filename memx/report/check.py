"""`memx plan --check BASELINE.json`: is the new plan the same as, or better than, the baseline?

Both plans are scored with the current predictor and the current search's Φ references, so the
comparison is like for like. Exit 0 when the plan is unchanged or better; 4 when it changed for the
worse, when the new plan's smallest memory margin is below the threshold, or when the baseline became
infeasible and the new plan is more than `max_slowdown` slower than it (issue #22).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memx.domain.errors import InputError
from memx.domain.groups import AnyPlan, any_plan_from_dict, validate_for_model
from memx.domain.specs import ModelArch, Weights
from memx.planner.metrics import PlanMetrics
from memx.planner.objective import phi
from memx.planner.replicas import estimate_any_plans
from memx.planner.result import metrics_from_dict, weights_from_dict


@dataclass(frozen=True, kw_only=True)
class CheckOutcome:
    verdict: str  # same | better | worse | low-margin | baseline-infeasible | baseline-infeasible-slower
    exit_code: int
    markdown: str


def load_baseline(path: Path, model: ModelArch | None = None) -> AnyPlan:
    """A `memx plan --format json` output (its "plan") or a bare plan JSON, schema 1 or 2. With `model` (the
    run's, when the baseline names it): a baseline that is no plan of it (layers that do not sum, a tp
    that does not divide the heads, …) is bad input; one that only no longer fits the cluster is not."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"{path}: baseline file not found") from exc
    except UnicodeDecodeError:
        raise InputError(f"--check {path}: not a UTF-8 text file (a baseline plan JSON expected)") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from exc
    except RecursionError:
        raise InputError(f"--check {path}: JSON nested too deeply") from None
    if isinstance(data, dict) and "plan" in data:
        data = data["plan"]
    plan = any_plan_from_dict(data, source=str(path))
    if model is not None and plan.model == model.name:
        validate_for_model(plan, model, source=f"--check {path}")
    return plan


def check_report(obj: dict, baseline: AnyPlan, cluster, model, predictor, *, reserve_gib: float,
                 min_margin: float, max_slowdown: float = 0.10, pipeline_assembly: str | None = None) -> CheckOutcome:
    """`check` on this run's `memx plan --format json` answer (decoded once here), judged as its pick rule judges;
    pipeline_assembly: the run's search space's (both plans assembled as the search assembled the new one)."""
    refs = obj["references"]
    return check(metrics_from_dict(obj), baseline, cluster, model, predictor, weights=weights_from_dict(obj),
                 refs=(refs["time_ms"], refs["max_mem_mib"], refs["mem_variance_mib2"]),
                 epsilon_mib2=refs["epsilon_mib2"], reserve_gib=reserve_gib, min_margin=min_margin,
                 max_slowdown=max_slowdown, rule=(obj.get("pick") or {}).get("rule", "phi"),
                 pipeline_assembly=pipeline_assembly)


def check(new: PlanMetrics, baseline: AnyPlan, cluster, model, predictor, *, weights: Weights,
          refs: tuple[float, float, float], epsilon_mib2: float, reserve_gib: float, min_margin: float,
          max_slowdown: float = 0.10, rule: str = "phi", pipeline_assembly: str | None = None) -> CheckOutcome:
    """new: this run's pick; both plans are estimated and scored (Φ against this run's medians `refs`) the same way.
    A Φ rule (phi, phi-bounded) judges by Φ; the floor rules (issue #22) by time and smallest margin: the new
    plan is worse when the baseline dominates it (no slower, no smaller margin, better in one)."""
    if baseline.model != model.name or baseline.cluster != cluster.name:
        raise InputError(f"baseline is for {baseline.model} on {baseline.cluster}, this run is {model.name} on {cluster.name}")
    reason = ""
    # Both plans go through the same float64 estimate and Φ with this run's references, so an unchanged input
    # gives an identical Φ on both sides (the search's own figures come from float32 tables: ~1e-5 apart).
    new = estimate_any_plans([new.plan], cluster, model, predictor, reserve_gib=reserve_gib,
                             pipeline_assembly=pipeline_assembly)[0]
    new_phi = float(phi(new.iteration_time_ms, new.max_mem_mib, new.mem_variance_mib2, refs=refs, weights=weights,
                        epsilon_mib2=epsilon_mib2))
    try:
        est = estimate_any_plans([baseline], cluster, model, predictor, reserve_gib=reserve_gib,
                                 pipeline_assembly=pipeline_assembly)[0]
    except InputError as exc:  # the baseline no longer fits the catalog: any feasible plan beats it
        est, reason = None, str(exc)
    base_phi = None if est is None else float(phi(
        est.iteration_time_ms, est.max_mem_mib, est.mem_variance_mib2, refs=refs, weights=weights,
        epsilon_mib2=epsilon_mib2))
    if new.min_margin < min_margin:
        verdict, code = "low-margin", 4
    elif new.plan == baseline:
        verdict, code = "same", 0
    elif est is None or not est.feasible:
        slower = est is not None and new.iteration_time_ms > (1.0 + max_slowdown) * est.iteration_time_ms
        verdict, code = ("baseline-infeasible-slower", 4) if slower else ("baseline-infeasible", 0)
    elif (new_phi <= base_phi if rule in PHI_RULES else not _dominates(est, new)):
        verdict, code = "better", 0
    else:
        verdict, code = "worse", 4
    md = [f"## MemX plan check: **{verdict}** (exit {code})", "",
          f"{model.name} on {cluster.name}, weights `{weights.profile}`, margin threshold {min_margin:.0%}, judged "
          + ("by Φ" if rule in PHI_RULES else f"by time and smallest margin (pick rule `{rule}`)") + ".", "",
          *_comparison(new, new_phi, est, base_phi)]
    if est is None:
        md += ["", f"Baseline no longer valid: {reason}"]
    elif not est.feasible:
        slowdown = new.iteration_time_ms / est.iteration_time_ms - 1.0
        md += ["", f"Baseline is predicted to run out of memory with the current predictor; the new plan is "
               f"{slowdown:+.1%} in iteration time against it (limit --max-slowdown {max_slowdown:.0%}: "
               f"{'exceeded, exit 4' if code else 'within'})."]
    return CheckOutcome(verdict=verdict, exit_code=code, markdown="\n".join(md) + "\n")


PHI_RULES = ("phi", "phi-bounded")


def _dominates(a: PlanMetrics, b: PlanMetrics) -> bool:
    """a is no slower with no smaller smallest margin than b, and better in one."""
    ta, tb, ma, mb = a.iteration_time_ms, b.iteration_time_ms, a.min_margin, b.min_margin
    return ta <= tb and ma >= mb and (ta < tb or ma > mb)


def _comparison(new: PlanMetrics, new_phi: float, est: PlanMetrics | None, base_phi: float | None) -> list[str]:
    """Markdown table: new plan against the baseline (n/a where the baseline has no estimate)."""
    def rows(m: PlanMetrics) -> list[float]:
        return [m.iteration_time_ms, m.max_mem_mib / 1024, m.mem_variance_mib2 ** 0.5 / 1024, m.min_margin]

    names = ("iteration time ms", "max memory GiB", "memory std-dev GiB", "smallest margin", "Φ")
    ours = [*rows(new), new_phi]
    theirs = [None] * 5 if est is None else [*rows(est), base_phi]
    return ["| | new plan | baseline |", "|---|---|---|"] + [
        f"| {name} | {a:,.4g} | {'n/a' if b is None else f'{b:,.4g}'} |" for name, a, b in zip(names, ours, theirs)]
