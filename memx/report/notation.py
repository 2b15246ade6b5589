"""Compact stage notation: a plan's pipeline in one short line that never contains `|`.

Consecutive stages with the same GPU, tensor-parallel degree and recomputation form a run, written
`GPU×tp [layers of each stage] recompute`; runs are joined by ` → ` in pipeline order, e.g.
`a100-80g×2 [1] → vendor-b-32g×4 [3,3,3,3] sel → vendor-c-32g×4 [2,2] full:1`; a stage with its own
data-parallel degree (issue #27) writes it after tp, `a100-80g×2·dp2 [12] → v100-32g×4·dp1 [10]`.
A schema-2 plan (replica groups, docs/architecture.md §Plan JSON, schema 2) writes each group's pipeline
so, groups joined by ` ‖ ` in group order; its dp and micro batch cells list the groups' values joined
by `+` and `/`.
Recomputation (docs/architecture.md §Recompute): nothing for `none`, `sel` for selective, `full` for
every layer of the stage, `full:N` for Megatron-LM's block method (the first N layers of each stage).
"""

from __future__ import annotations

from itertools import groupby
from typing import Any, Mapping

RUN_SEPARATOR = " → "
_RECOMPUTE = {"none": "", "selective": "sel", "full": "full"}


def recompute_label(stage: Mapping[str, Any]) -> str:
    """`` (none), `sel`, `full` or `full:N` for one stage dict of the plan JSON."""
    n = stage.get("recompute_layers")
    if stage["recompute"] == "full" and n is not None:
        return f"full:{n}"
    return _RECOMPUTE.get(stage["recompute"], str(stage["recompute"]))


def _run_key(stage: Mapping[str, Any]) -> tuple[str, str, str]:
    """A run's GPU×tp (`GPU×tp·dpN` when the stage carries its own data_parallel, issue #27) and recomputation."""
    dp = stage.get("data_parallel")
    return stage["gpu"], f"{int(stage['tp'])}" + (f"·dp{dp}" if dp is not None else ""), recompute_label(stage)


GROUP_SEPARATOR = " ‖ "


def is_grouped(plan: Mapping[str, Any]) -> bool:
    """A schema-2 plan JSON (it has `groups`)."""
    return "groups" in plan


def stage_rows(plan: Mapping[str, Any]) -> list[tuple[int | None, int, Mapping[str, Any], int]]:
    """(group or None, stage index in its pipeline, stage dict, the pipeline's dp) for every stage, group
    order then pipeline order — the order of the JSON report's `stages` rows."""
    if not is_grouped(plan):  # a stage's own data_parallel (issue #27) where it has one
        return [(None, s, st, int(st.get("data_parallel") or plan["dp"])) for s, st in enumerate(plan["stages"])]
    return [(g, s, st, int(grp["dp"])) for g, grp in enumerate(plan["groups"]) for s, st in enumerate(grp["stages"])]


def dp_text(plan: Mapping[str, Any]) -> str:
    """dp, `2+2` for replica groups, `2/1/2` for a per-stage dp; with context parallelism `dp·cpN` (issue #27: N GPUs
    share each sequence), with expert parallelism (issue #27) `4 (ep 4)`, `4/2 (ep 2)` with a per-stage dp,
    `4/2 (ep 4/2)` with an ep per stage."""
    if is_grouped(plan):
        return "+".join(str(g["dp"]) for g in plan["groups"])
    cp, ep = int(plan.get("context_parallel", 1)), int(plan.get("expert_parallel", 1))
    eps = {int(st.get("expert_parallel", ep)) for st in plan["stages"]}
    if any("data_parallel" in st for st in plan["stages"]):  # issue #27: per stage, e.g. 2/1/2 (2/1/2·cp2)
        dps = "/".join(str(st.get("data_parallel", plan["dp"])) for st in plan["stages"])
    else:
        dps = str(plan["dp"])
    if len(eps) > 1:  # a per-stage ep (FlagScale's meshes): 4/2 (ep 4/2)
        return dps + (f"·cp{cp}" if cp > 1 else "") + " (ep " + "/".join(
            str(st.get("expert_parallel", ep)) for st in plan["stages"]) + ")"
    return dps + (f"·cp{cp}" if cp > 1 else "") + (f" (ep {ep})" if ep > 1 else "")


def micro_batch_text(plan: Mapping[str, Any]) -> str:
    return "/".join(str(g["micro_batch"]) for g in plan["groups"]) if is_grouped(plan) else str(plan["micro_batch"])


def compact_stages(plan: Mapping[str, Any]) -> str:
    """The plan's stages (plan JSON, docs/architecture.md §Plan JSON) as runs of equal stages."""
    if is_grouped(plan):
        return GROUP_SEPARATOR.join(compact_stages(g) for g in plan["groups"])
    runs = []
    for (gpu, tp, rc), group in groupby(plan["stages"], key=_run_key):
        layers = ",".join(str(st["layers"]) for st in group)
        runs.append(f"{gpu}×{tp} [{layers}]" + (f" {rc}" if rc else ""))
    return RUN_SEPARATOR.join(runs)


def group_line(plan: Mapping[str, Any], g: int) -> str:
    """One replica group of a schema-2 plan JSON (docs/architecture.md §Plan JSON, schema 2) in one line:
    `group 0: dp 1 × a100-80g×4 [32], micro batch 2 × 24 = 48 samples` (groups and stages count from 0)."""
    grp = plan["groups"][g]
    samples = grp["dp"] * grp["micro_batch"] * grp["micro_batches"]
    return (f"group {g}: dp {grp['dp']} × {compact_stages(grp)}, micro batch {grp['micro_batch']} × "
            f"{grp['micro_batches']} = {samples} samples")


# --- one story in every output (issue #22): which plans a table lists, in which order, under which label ---
MARGIN_POINT, MARGIN_HIGH = "margin (point)", "margin (upper bound)"


def pick_label(obj: Mapping[str, Any]) -> str:
    """`pick (fastest-above-floor)`: the pick, named by the rule that chose it."""
    rule = (obj.get("pick") or {}).get("rule")
    return f"pick ({rule})" if rule else "pick"


def listed_plans(obj: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(label, source in the object, entry) for the plans table: the pick first, then the best plan that
    clears the floor (beside a `phi` pick below it), the best grouped plan (beside a one-group pick), the
    fastest plan, then the other top plans by Φ; each plan once, under its first label."""
    floor = (obj.get("pick") or {}).get("margin_floor", 0.1)
    first = pick_label(obj) + (", the fastest" if obj["plan"] == obj["fastest"]["plan"] else "")
    rows: list[tuple[str, str, Mapping[str, Any]]] = [(first, "pick", obj)]
    if obj.get("floor_pick"):
        rows.append((f"fastest that clears the {floor:.0%} floor", "floor_pick", obj["floor_pick"]))
    if obj.get("best_grouped"):
        rows.append(("best with replica groups", "best_grouped", obj["best_grouped"]))
    rows.append(("fastest", "fastest", obj["fastest"]))
    rows += [(f"#{i + 1} by Φ", f"top:{i}", e) for i, e in enumerate(obj.get("top", []))]
    seen, out = [], []
    for label, src, e in rows:
        if e["plan"] not in seen:
            seen.append(e["plan"])
            out.append((label, src, e))
    return out


def margin_columns(entries: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(header, key of `predicted`): the point margin, and the upper-bound margin when any entry has one
    (a predictor with intervals); one definition per column, named."""
    cols = [(MARGIN_POINT, "min_margin")]
    if any("min_margin_high" in e["predicted"] for e in entries):
        cols.append((MARGIN_HIGH, "min_margin_high"))
    return cols


def margin_cells(entry: Mapping[str, Any], cols: list[tuple[str, str]]) -> list[str]:
    q = entry["predicted"]
    return [f"{q[k]:.1%}" if k in q else "n/a" for _h, k in cols]
