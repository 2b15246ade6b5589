"""Why this plan (issue #12): the pick explained against the fastest plan, and the warnings a user must
see — a changed training job (searched heads / query groups / sequence length), a thin margin,
closed-form-only predictions, a model trained for another cluster.

Works on the `memx plan --format json` object alone (memx.planner.result), so the in-process search and
the Prefect pipeline explain the same way. `annotate(obj)` adds `explanation` and `warnings` to it.
"""

from __future__ import annotations

from typing import Any

from memx.domain.groups import GroupedPlan, any_plan_from_dict
from memx.domain.plan import plan_model
from memx.domain.specs import ModelArch
from memx.planner.signatures import CLOSED_FORM_BANDS
from memx.planner.variants import job_changes
from memx.report.notation import stage_rows
from memx.report.table import recompute_text

GIB = 1024.0
THIN_MARGIN = 0.10  # paper §3.1.2: the safety threshold on the smallest predicted margin


def _margins_by_type(entry: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (_g, _s, st, _dp), d in zip(stage_rows(entry["plan"]), entry["stages"]):  # either plan schema
        m = (d["capacity_mib"] - d["peak_mib"]) / d["capacity_mib"]
        out[st["gpu"]] = min(out.get(st["gpu"], 1.0), m)
    return out


def _recompute_reasons(entry: dict[str, Any]) -> list[str]:
    """Which stages recompute and why: what the JSON proves. A stage whose peak without its recompute
    would not be known from the JSON, so: a stage at a margin below the refinement target was forced to
    the level that fits (step 1 of the two-step assignment, paper §3.1.1); above it, the level was raised
    by the exchange rate (step 2) or kept because it was the first level that fits — not distinguishable
    here, and said so."""
    lines = []
    for (g, s, st, _dp), d in zip(stage_rows(entry["plan"]), entry["stages"]):  # either plan schema
        if st["recompute"] == "none":
            continue
        m = (d["capacity_mib"] - d["peak_mib"]) / d["capacity_mib"]
        why = ("forced by fit: its margin with recompute is already thin" if m < THIN_MARGIN else
               "the first level that fits, or raised by the exchange rate (time per MiB saved) while the plan's "
               "smallest margin was below the target")
        lines.append(f"{'' if g is None else f'group {g} '}stage {s} ({st['gpu']}, {st['layers']} layers) recomputes {recompute_text(st, long=True)} "
                     f"at {m:.1%} margin: {why}")
    return lines


def explain(obj: dict[str, Any]) -> list[str]:
    """Lines explaining the pick against the fastest plan."""
    q, f = obj["predicted"], obj["fastest"]["predicted"]
    rule = obj.get("pick", {}).get("rule", "phi")
    lines = [f"pick rule `{rule}`, weights `{obj['weights']['profile']}`"]
    dt = q["iteration_time_ms"] / f["iteration_time_ms"] - 1
    if obj["plan"] == obj["fastest"]["plan"]:
        lines.append(f"the pick is the fastest plan ({q['iteration_time_ms']:,.0f} ms)")
    else:
        lines.append(f"time: {q['iteration_time_ms']:,.0f} ms, {dt:+.1%} vs the fastest plan ({f['iteration_time_ms']:,.0f} ms)")
    mp, mf = _margins_by_type(obj), _margins_by_type(obj["fastest"])
    lines.append("smallest point margin per GPU type: " + ", ".join(
        f"{g} {m:.1%}" + (f" (fastest {mf[g]:.1%})" if g in mf else "") for g, m in mp.items()))
    lines.append(f"memory std-dev {q['mem_variance_mib2'] ** 0.5 / GIB:.2f} GiB (fastest "
                 f"{f['mem_variance_mib2'] ** 0.5 / GIB:.2f} GiB); max memory {q['max_mem_mib'] / GIB:.1f} GiB (fastest "
                 f"{f['max_mem_mib'] / GIB:.1f} GiB)")
    reasons = _recompute_reasons(obj)
    lines += reasons or ["no stage recomputes"]
    if fp := obj.get("floor_pick"):  # rule phi below the floor: what clears it, beside the paper's pick
        g = fp["predicted"]
        lines.append(f"beside it, the fastest plan that clears the {obj['pick']['margin_floor']:.0%} floor: "
                     f"{g['iteration_time_ms']:,.0f} ms at {g.get('min_margin_high', g['min_margin']):.1%} margin")
    if bg := obj.get("best_grouped"):
        g = bg["predicted"]
        lines.append(f"best plan with replica groups: {g['iteration_time_ms']:,.0f} ms at {g['min_margin']:.1%} point "
                     "margin (not picked: it does not beat the one-group pick)")
    return lines


def _band(head: str) -> str:
    lo, hi = CLOSED_FORM_BANDS[head]
    return f"{lo - 1:+.0%}/{hi - 1:+.0%}"


def job_change_warning(plan: dict[str, Any], model: ModelArch) -> str | None:
    """"the job changes: heads 32 → 64, seq_len 4096 → 2048; …" when the plan trains other heads, query
    groups or sequence length than `model` (SearchSpace.heads_options …, memx.planner.variants); else None."""
    parsed = any_plan_from_dict(plan)
    if isinstance(parsed, GroupedPlan):
        return None  # replica groups train the job as given (SearchSpace refuses variants with max_replica_groups > 1)
    changes = job_changes(model, plan_model(parsed, model))
    if not changes:
        return None
    what = ", ".join(f"{f} {a} → {b}" for f, (a, b) in changes.items())
    return (f"the job changes: {what}; this is a different training job than {model.name} as given "
            "(the search space lists heads/query_groups/seq_len options)")


def warnings_for(obj: dict[str, Any], *, trained_fingerprint: str | None = None,
                 cluster_fingerprint: str | None = None, model: ModelArch | None = None) -> list[str]:
    """The pick's warnings: a changed training job (with `model`, the job as given), the search's own (floor,
    dominance), a thin margin, closed form only, a model trained on another fingerprint."""
    job = job_change_warning(obj["plan"], model) if model is not None else None
    out = ([job] if job else []) + list(obj.get("warnings", []))
    q = obj["predicted"]
    margin = q.get("min_margin_high", q["min_margin"])
    if margin < THIN_MARGIN and not any("below" in w for w in out):
        out.append(f"the pick's smallest margin is {margin:.1%}, below {THIN_MARGIN:.0%}: a +10 % activation spike "
                   "may run out of memory")
    if str(obj.get("predictor", "")).startswith("analytic"):
        out.append(f"predictions come from the closed form only (documented 90 % band {_band('time')} time, "
                   f"{_band('memory')} memory, memx.learn.intervals.CLOSED_FORM_BANDS): profile this cluster "
                   "(`memx plan --backend simulated|torch|command`) for a measured band")
    if trained_fingerprint and cluster_fingerprint and trained_fingerprint != cluster_fingerprint:
        out.append(f"the predictor was trained on fingerprint {trained_fingerprint[:12]}, this job is "
                   f"{cluster_fingerprint[:12]}: retrain (`memx train`) for this cluster")
    return list(dict.fromkeys(out))


def annotate(obj: dict[str, Any], model: ModelArch | None = None, **fingerprints) -> dict[str, Any]:
    """obj with `explanation` and `warnings` (the plan JSON's fields, docs/architecture.md §Plan JSON); `model`
    (the job as given) lets the warnings say when the plan changes the training job."""
    return {**obj, "explanation": explain(obj), "warnings": warnings_for(obj, model=model, **fingerprints)}

