"""The paper's adoption steps as commands (issue #12 "Why this plan"):

    memx inspect PLAN.json [--cluster C] [--model M] [--predictor analytic|registered] [--measured RUNS]
        a plan you run today: per-GPU peak, margin, memory variance, iteration time
    memx rank --measured FILE [--weights W] [--top K]
        configurations you already measured (config_runs: Parquet, CSV or JSONL) re-ranked by Φ with a
        weight profile (paper §3.1.2; medians over the measured plans), and how the top one differs from
        the fastest

Exit codes as every command (memx.cli.options.MemxGroup): 2 bad input, 5 nothing usable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memx.cli.options import DEFAULT_SEARCH, ConfOpt, analytic_predictor, load_specs, measured_needs_analytic
from memx.cli.simulate import _read_input, read_plan
from memx.domain.errors import InputError, NothingUsable
from memx.domain.groups import any_plan_from_json, any_plan_to_dict
from memx.planner.objective import EPSILON_MIB2, PROFILES, parse_weights, phi
from memx.report.notation import compact_stages, dp_text, group_line, is_grouped, micro_batch_text, stage_rows

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# pandas, rich, the planner's estimates and the learned predictor are imported inside the commands.

GIB = 1024.0
PREDICTORS = ("analytic", "registered")
PlanArg = Annotated[Path, typer.Argument(help="plan JSON: memx plan's answer or a bare plan")]
PredictorOpt = Annotated[str, typer.Option("--predictor", help="analytic (closed form) | registered (the champion "
                                           "of this cluster's fingerprint, from `memx train`).")]
MeasuredOpt = Annotated[Path, typer.Option("--measured", help="config_runs of measured plans (Parquet, CSV or "
                                           "JSONL; columns plan, iteration_time_ms, peak_mem_mib, oom).")]
CalibrateOpt = Annotated[Optional[Path], typer.Option("--measured", help="With --predictor analytic: config_runs of "
                                        "plans timed on this cluster; the closed form is calibrated on them first, as "
                                        "`memx plan --measured` does.")]
RankWeightsOpt = Annotated[str, typer.Option("--weights", help=f"{' | '.join(PROFILES)} | 'wT,wM,wV'.")]


def inspect_cmd(file: PlanArg,
                cluster: Annotated[Optional[str], typer.Option("--cluster", help="Cluster name or YAML path (default: the plan's).")] = None,
                model: Annotated[Optional[str], typer.Option("--model", help="Model name or YAML path (default: the plan's).")] = None,
                conf: ConfOpt = None, predictor: PredictorOpt = "analytic",
                measured: CalibrateOpt = None) -> None:
    """A plan you run today (either plan schema): per-GPU peak, margin and memory variance as predicted."""
    from rich.console import Console
    from rich.table import Table

    from memx.planner.replicas import estimate_any_plans

    if predictor not in PREDICTORS:
        raise InputError(f"--predictor {predictor!r}; allowed: {', '.join(PREDICTORS)}")
    measured_needs_analytic(measured, predictor)
    plan = read_plan(_read_input(file, "plan"), str(file))
    cl, mo, sp = load_specs(cluster or plan.cluster, model or plan.model, DEFAULT_SEARCH, conf)
    pred, name = analytic_predictor(cl, mo, sp, measured) if predictor == "analytic" else (_registered(cl, mo, sp),
                                                                                           predictor)
    m = estimate_any_plans([plan], cl, mo, pred, reserve_gib=sp.reserve_gib, pipeline_assembly=sp.pipeline_assembly)[0]
    d = any_plan_to_dict(plan)
    console = Console(width=160)
    console.print(f"[bold]{mo.name} on {cl.name}[/] ({name}): dp {dp_text(d)}, µb {micro_batch_text(d)}: "
                  f"{compact_stages(d)}")
    for g, gm in enumerate(m.groups if is_grouped(d) else ()):
        console.print(f"{group_line(d, g)}: {gm.iteration_time_ms:,.0f} ms alone")
    if is_grouped(d):
        console.print(f"cross-group gradient sync: {m.cross_sync_ms:,.0f} ms, added to the slowest group's time")
    t = Table(title="Per GPU type and stage: predicted peak against usable capacity")
    for col in ("group", "stage", "GPU", "GPUs", "layers", "recompute", "peak GiB", "usable GiB", "margin"):
        t.add_column(col, justify="left" if col in ("GPU", "recompute") else "right")
    for (g, s, st, dp), peak, cap in zip(stage_rows(d), m.stage_peak_mib, m.capacity_mib):
        rec = st["recompute"] if st.get("recompute_layers") is None else f"{st['recompute']}:{st['recompute_layers']}"
        t.add_row("" if g is None else str(g), str(s), st["gpu"], f"{st['tp']}×{dp}", str(st["layers"]), str(rec),
                  f"{peak / GIB:.1f}", f"{cap / GIB:.1f}", f"{(cap - peak) / cap:.1%}")
    console.print(t)
    console.print(f"iteration {m.iteration_time_ms:,.0f} ms; max memory {m.max_mem_mib / GIB:.1f} GiB; memory std-dev "
                  f"{m.mem_variance_mib2 ** 0.5 / GIB:.2f} GiB (variance {m.mem_variance_mib2:,.0f} MiB²); smallest "
                  f"margin {m.min_margin:.1%}; {'fits' if m.feasible else 'predicted to run OUT OF MEMORY'}")
    if m.min_margin < sp.margin_floor:
        typer.echo(f"warning: smallest margin {m.min_margin:.1%} is below the floor {sp.margin_floor:.0%} "
                   "(the paper's safety threshold)", err=True)


def _registered(cl, mo, sp):
    from memx.pipeline.local import registered_predictor  # the learned stack: only for --predictor registered

    return registered_predictor(cl, mo, sp)


def _peaks(v) -> np.ndarray:
    import numpy as np

    if isinstance(v, str):
        v = json.loads(v)
    return np.asarray(v, dtype=float)


def measured_ranking(df: pd.DataFrame, weights: str) -> pd.DataFrame:
    """Plans that ran (no OOM, a time and peaks), with M, V and Φ (medians over them), best Φ first."""
    import pandas as pd

    w = parse_weights(weights)
    if w is None:
        raise InputError("--weights auto needs a search; give a profile (default, safety, throughput) or 'wT,wM,wV'")
    oom = df.get("oom", pd.Series(False, index=df.index)).fillna(False).astype(bool)
    ok = df[~oom & df["iteration_time_ms"].notna() & df["peak_mem_mib"].notna()]
    if ok.empty:
        raise NothingUsable("no measured plan ran", {"out of memory": int(oom.sum()),
                                                     "no time or peaks": int((~oom).sum())})
    peaks = [_peaks(v) for v in ok["peak_mem_mib"]]
    out = pd.DataFrame({"plan": ok["plan"].to_numpy(), "time_ms": ok["iteration_time_ms"].to_numpy(float),
                        "M": [float(p.max()) for p in peaks], "V": [float(p.var()) for p in peaks]})
    refs = (float(out.time_ms.median()), float(out.M.median()), float(out.V.median()))
    out["phi"] = phi(out.time_ms, out.M, out.V, refs=refs, weights=w, epsilon_mib2=EPSILON_MIB2)
    return out.sort_values(["phi", "time_ms"], kind="stable").reset_index(drop=True)


def rank_cmd(measured: MeasuredOpt, weights: RankWeightsOpt = "default",
             top: Annotated[int, typer.Option("--top", min=1, help="How many plans to list.")] = 10) -> None:
    """Re-rank plans you already measured by Φ (paper §3.1.2) and compare the top one with the fastest."""
    from rich.console import Console
    from rich.table import Table

    from memx.report.evaluate import read_config_runs

    r = measured_ranking(read_config_runs(measured, ("plan", "iteration_time_ms", "peak_mem_mib")), weights)
    console = Console(width=160)
    t = Table(title=f"Measured plans by Φ (weights {weights}; medians over the {len(r)} that ran)")
    for col in ("#", "Φ", "T ms", "vs fastest", "M GiB", "std GiB", "dp", "µb", "stages"):
        t.add_column(col, justify="left" if col == "stages" else "right")
    fastest = r.loc[r.time_ms.idxmin()]
    for i, row in r.head(top).iterrows():
        p = any_plan_to_dict(any_plan_from_json(row.plan, source=f"--measured row {i}: field 'plan'"))
        t.add_row(str(i + 1), f"{row.phi:.3f}", f"{row.time_ms:,.0f}", f"{row.time_ms / fastest.time_ms - 1:+.1%}",
                  f"{row.M / GIB:.1f}", f"{row.V ** 0.5 / GIB:.2f}", dp_text(p), micro_batch_text(p),
                  compact_stages(p))
    console.print(t)
    best = r.iloc[0]
    if best.plan == fastest.plan:
        console.print("The top plan by Φ is also the fastest measured plan.")
    else:
        console.print(f"Top by Φ vs the fastest: time {best.time_ms / fastest.time_ms - 1:+.1%} ({best.time_ms:,.0f} vs "
                      f"{fastest.time_ms:,.0f} ms), max memory {best.M / GIB:.1f} vs {fastest.M / GIB:.1f} GiB, memory "
                      f"std-dev {best.V ** 0.5 / GIB:.2f} vs {fastest.V ** 0.5 / GIB:.2f} GiB.")
