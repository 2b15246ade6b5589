"""`memx plan`: search the plan space and recommend a plan (docs/architecture.md §CLI, §Plan JSON).

    memx plan [--cluster C] [--model M] [--search S] [--conf DIR]               (Job)
              [--top K] [--weights W] [--format F] [--out DIR]                  (Output)
              [--progress/--no-progress] [--log/--no-log]
              [--predictor analytic|registered|pipeline]                       (Predictor)
              [--measured RUNS] [--backend B] [--seed S] [--store URI] [--dask D] [--command ...]
              [--records PATH] [--jobs N]
              [--check BASELINE.json] [--min-margin X] [--summary FILE]         (CI check)

Exit codes: 0 ok, 2 bad input, 3 no feasible plan, 4 the check failed, 5 nothing usable, 130 interrupted (raised as MemxError; the root
group's handler prints them).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from memx.cli.options import (DEFAULT_CLUSTER, DEFAULT_MODEL, DEFAULT_SEARCH, ClusterOpt, CommandOpt, ConfOpt,
    JobsOpt, ModelOpt, RecordsOpt, SearchOpt, SeedOpt, StoreOpt, WeightsOpt, analytic_predictor, check_out_dir,
    in_panel, load_specs, measured_needs_analytic)
from memx.cli.progress import delayed_progress, progress_enabled
from memx.domain.errors import CheckFailed, InputError
from memx.domain.io import atomic_write_text

if TYPE_CHECKING:
    from memx.domain.plan import Plan
    from memx.domain.specs import Cluster, ModelArch, SearchSpace

# Heavy stacks (pandas, MLflow, Prefect, the learned predictor, the pipeline) are imported inside the
# functions that use them: `memx --help` and the analytic plan never load them (tests/unit/test_startup.py).

JOB, OUTPUT, PREDICTOR, CI = "Job", "Output", "Predictor", "CI check"
PREDICTORS = ("analytic", "registered", "pipeline")


class Fmt(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    megatron = "megatron"
    flagscale = "flagscale"


TopOpt = Annotated[int, typer.Option("--top", min=1, help="How many plans to list.", rich_help_panel=OUTPUT)]
FormatOpt = Annotated[Fmt, typer.Option("--format", help="Output format.", rich_help_panel=OUTPUT)]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Also write plan.json, plan.md, megatron.sh, flagscale.yaml (when FlagScale runs the plan) and report.html (with PNGs) here.", rich_help_panel=OUTPUT)]
PredictorOpt = Annotated[Optional[str], typer.Option("--predictor", rich_help_panel=PREDICTOR, help=(
    "analytic (closed form; the default) | registered (the registry champion of this cluster's GPU types, model "
    "and batch, from `memx train`; no profiling) | pipeline (profile → train → search; implied by --backend "
    "simulated|command|torch|records)."))]
BackendOpt = Annotated[str, typer.Option("--backend", rich_help_panel=PREDICTOR, help=(
    "analytic (no profiling), or a profiling backend — simulated|command|torch|records — for the learned "
    "predictor via the Prefect pipeline (--predictor pipeline)."))]
MeasuredOpt = Annotated[Optional[Path], typer.Option("--measured", rich_help_panel=PREDICTOR, help=(
    "With --predictor analytic: config_runs (Parquet, JSONL or CSV) of plans you timed on this cluster; the closed "
    "form is calibrated on them first (per-type stage and communication scales, kept only where its held-out error "
    "beats the uncalibrated one; memx.learn.calibration). For the registered predictor: `memx train --measured`."))]
DaskOpt = Annotated[Optional[str], typer.Option("--dask", help="Explore the branch-and-bound's boxes on Dask workers (same answer): 'local' (2 worker processes), 'local:N', or a running scheduler's address (tcp://host:8786).", rich_help_panel=PREDICTOR)]
CheckOpt = Annotated[Optional[Path], typer.Option("--check", help="Baseline plan JSON: exit 4 if the new plan is worse or its margin is below --min-margin.", rich_help_panel=CI)]
MinMarginOpt = Annotated[float, typer.Option("--min-margin", help="With --check: the smallest acceptable memory margin.", rich_help_panel=CI)]
MaxSlowdownOpt = Annotated[float, typer.Option("--max-slowdown", help="With --check: when the baseline became infeasible, exit 4 if the new plan is more than this fraction slower (0.1 = 10 %; ≥ 0).", rich_help_panel=CI)]
ProgressOpt = Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bars with ETA on stderr for steps over 2 s (default: when stderr is a terminal and --format is not json).", rich_help_panel=OUTPUT)]
LogOpt = Annotated[Optional[bool], typer.Option("--log/--no-log", help="Log the plan as an MLflow run in experiment memx-plans (default: on for --predictor registered|pipeline, off for analytic).", rich_help_panel=OUTPUT)]
SummaryOpt = Annotated[Optional[Path], typer.Option("--summary", help="With --check: write the Markdown summary here (default $GITHUB_STEP_SUMMARY when set).", rich_help_panel=CI)]
JobCluster, JobModel, JobSearch, JobConf = (in_panel(o, JOB) for o in (ClusterOpt, ModelOpt, SearchOpt, ConfOpt))
OutWeights = in_panel(WeightsOpt, OUTPUT)
PredSeed, PredStore, PredCommand, PredRecords, PredJobs = (
    in_panel(o, PREDICTOR) for o in (SeedOpt, StoreOpt, CommandOpt, RecordsOpt, JobsOpt))


def plan_cmd(
    cluster: JobCluster = DEFAULT_CLUSTER,
    model: JobModel = DEFAULT_MODEL,
    search: JobSearch = DEFAULT_SEARCH,
    conf: JobConf = None,
    top: TopOpt = 10,
    weights: OutWeights = None,
    fmt: FormatOpt = Fmt.table,
    out: OutOpt = None,
    predictor: PredictorOpt = None,
    backend: BackendOpt = "analytic",
    seed: PredSeed = 0,
    store: PredStore = None,
    dask: DaskOpt = None,
    measured: MeasuredOpt = None,
    command: PredCommand = None,
    records: PredRecords = None,
    jobs: PredJobs = 1,
    check: CheckOpt = None,
    min_margin: MinMarginOpt = 0.05,
    max_slowdown: MaxSlowdownOpt = 0.10,
    summary: SummaryOpt = None,
    progress: ProgressOpt = None,
    log: LogOpt = None,
) -> None:
    """Search the plan space and recommend a plan."""
    from memx.planner.distributed import parse_dask, search_pool
    from memx.planner.launcher import stage_dp_option
    from memx.planner.replica_search import replica_search as run_search  # schema 2 when max_replica_groups ≥ 2
    from memx.planner.result import search_result_to_dict
    from memx.report.why import annotate

    cl, mo, sp = load_specs(cluster, model, search, conf)
    mode = predictor_mode(predictor, backend)
    check_outputs(out, check, summary)  # before any work: bad paths exit 2 with nothing written
    if max_slowdown < 0:
        raise InputError(f"--max-slowdown {max_slowdown:g}: allowed range ≥ 0 (a fraction: 0.1 = 10 % slower)")
    baseline = None
    if check is not None:
        from memx.report.check import load_baseline

        baseline = load_baseline(check, mo)
    if dask is not None:
        parse_dask(dask)  # a malformed --dask: exit 2 before any work (an unreachable one: when connecting)
    measured_needs_analytic(measured, mode)
    warn_batch(cl, sp)
    warn_tp(mo, sp)
    show = progress_enabled(progress, json_output=fmt is Fmt.json)
    ref: dict = {}
    res = None
    if mode == "analytic":
        from memx.domain.home import home_path
        from memx.planner import table_cache

        pred, name = analytic_predictor(cl, mo, sp, measured)
        cache = contextlib.nullcontext() if measured is not None else table_cache.use(home_path("cache", "tables"))
        with search_pool(dask) as pool, delayed_progress(show, "search") as cb, cache:  # an earlier run's tables
            res = stage_dp_option(run_search(cl, mo, sp, pred, weights=weights, top_k=top, on_progress=cb, pool=pool),
                                  cl, mo, sp, pred)  # opt-in per-stage dp (issue #27)
        obj = search_result_to_dict(res, name)
    elif mode == "registered":
        from memx.pipeline import registry
        from memx.pipeline.local import registered_predictor
        from memx.pipeline.training import champion_ref

        pred = registered_predictor(cl, mo, sp)
        ref = champion_ref(registry.fingerprint(cl, mo, sp.global_batch).fingerprint) or {}
        name = f"registered {ref.get('variant', '')} v{ref.get('model_version', '?')}".replace("  ", " ")
        cal = registry.load_calibration(ref["model_version"]) if ref else None  # memx train --measured
        if cal is not None:
            name += f", {cal.headline()}"
            typer.echo(f"plan calibration: {cal.summary()}", err=True)
        with search_pool(dask) as pool, delayed_progress(show, "search") as cb:
            res = stage_dp_option(run_search(cl, mo, sp, pred, weights=weights, top_k=top, on_progress=cb, pool=pool),
                                  cl, mo, sp, pred)
        obj = search_result_to_dict(res, name)
    else:
        from memx.cli.profile import profile_options
        from memx.pipeline import registry
        from memx.pipeline.local import registered_predictor
        from memx.pipeline.training import champion_ref

        options = profile_options("simulated" if backend == "analytic" else backend, command, records, jobs=jobs,
                                  progress=show)
        flow_params = dict(cluster=cluster, model=model, search=search, conf=str(conf) if conf else None,
                           backend="simulated" if backend == "analytic" else backend, seed=seed, store=store,
                           weights=weights, top_k=top, dask=dask, profile_options=options)
        obj = _plan_pipeline(flow_params)
        pred = registered_predictor(cl, mo, sp) if baseline is not None else None  # the champion that planned
        ref = champion_ref(registry.fingerprint(cl, mo, sp.global_batch).fingerprint) or {}
    if sp.launcher != "any" and res is not None:
        obj["launcher"] = _launcher_gain(cl, mo, sp, pred, res, weights, top)
    obj = annotate(obj, mo)  # "Why this plan": explanation and warnings (memx.report.why)
    for w in obj["warnings"]:
        typer.echo(f"warning: {w}", err=True)
    written = _emit(obj, mo, cl, fmt, out)
    if log if log is not None else mode != "analytic":
        _log(obj, cl, mo, sp, written, ref.get("predictor_version"))
    if baseline is not None:
        _check(obj, baseline, cl, mo, sp, pred, min_margin, summary, max_slowdown)


def _launcher_gain(cl: Cluster, mo: ModelArch, sp: SearchSpace, pred: Any, res: Any, weights: str | None,
                   top: int) -> dict:
    """`launcher: megatron|flagscale`: what the unconstrained (heterogeneous) pick would gain over `res`'s, on
    stderr and in the JSON object's `launcher` (memx.planner.launcher.launcher_gain)."""
    from memx.planner.launcher import launcher_gain

    gain = launcher_gain(cl, mo, sp, pred, res, weights=weights, top_k=top)
    typer.echo(f"launcher {sp.launcher}: its best plan {gain['time_ms']:.0f} ms (smallest margin {gain['margin']:.1%}); "
               f"the unconstrained pick {gain['unconstrained_time_ms']:.0f} ms ({gain['unconstrained_margin']:.1%}): "
               f"×{gain['time_ratio']:.2f} the time under {sp.launcher}", err=True)
    return gain


def predictor_mode(predictor: str | None, backend: str) -> str:
    """analytic | registered | pipeline: `--predictor`, else `pipeline` when `--backend` names a profiling
    backend; InputError for an unknown name or a contradiction."""
    if backend != "analytic":
        from memx.profiling.backends import BACKENDS  # the profiling package loads pandas: only when profiling

        if backend not in BACKENDS:
            raise InputError(f"--backend {backend!r}; allowed: analytic, {', '.join(BACKENDS)}")
    if predictor is None:
        return "analytic" if backend == "analytic" else "pipeline"
    if predictor not in PREDICTORS:
        raise InputError(f"--predictor {predictor!r}; allowed: {', '.join(PREDICTORS)}")
    if predictor != "pipeline" and backend != "analytic":
        raise InputError(f"--backend {backend} profiles and trains (--predictor pipeline); it cannot be combined "
                         f"with --predictor {predictor}")
    return predictor


def check_outputs(out: Path | None, check: Path | None, summary: Path | None) -> None:
    """Output and baseline paths are usable (InputError, exit 2), checked before the search."""
    if out is not None:
        check_out_dir(out, "--out")
    if check is not None and check.is_dir():
        raise InputError(f"--check {check}: is a folder; expected a baseline plan JSON file")
    if summary is not None:
        if summary.is_dir():
            raise InputError(f"--summary {summary}: is a folder; expected a file to write")
        check_out_dir(summary.parent, "--summary")


def warn_batch(cl: Cluster, sp: SearchSpace) -> None:
    """A warning on stderr when the global batch rules out micro-batch sizes or data-parallel degrees
    (a layout needs global_batch divisible by dp × micro batch: memx.planner.space)."""
    gb, most_dp = sp.global_batch, max(cl.gpu_count(g.name) for g in cl.gpu_types)
    lost_mb = [mb for mb in sp.micro_batch_options if gb % mb]
    kept_dp = [dp for dp in range(1, most_dp + 1) if any(gb % (dp * mb) == 0 for mb in sp.micro_batch_options)]
    if lost_mb or (most_dp > 1 and kept_dp == [1]):
        kept_mb = [mb for mb in sp.micro_batch_options if mb not in lost_mb]
        lost_dp = [dp for dp in range(1, most_dp + 1) if dp not in kept_dp]
        typer.echo(f"warning: global_batch {gb} (search '{sp.name}') rules out micro batch "
                   f"{', '.join(map(str, lost_mb)) or 'none'} and dp {_ranges(lost_dp) or 'none'} (dp × micro batch "
                   f"must divide it); the search keeps micro batch {', '.join(map(str, kept_mb)) or 'none'} and dp "
                   f"{_ranges(kept_dp) or 'none'}", err=True)


def warn_tp(mo: ModelArch, sp: SearchSpace) -> None:
    """A warning on stderr naming the tp options the model's heads / query groups rule out, and those kept
    (tp must divide both: memx.planner.space.valid_tps); none kept is the planner's error."""
    lost = [t for t in sp.tp_options if mo.heads % t or mo.query_groups % t]
    kept = [t for t in sp.tp_options if t not in lost]
    if lost and kept:
        typer.echo(f"warning: model {mo.name} has {mo.heads} heads and {mo.query_groups} query groups: tp "
                   f"{', '.join(map(str, lost))} ruled out (tp must divide both); the search keeps tp "
                   f"{', '.join(map(str, kept))}", err=True)


def _ranges(values: list[int]) -> str:
    """[1, 2, 3, 5] → '1-3, 5'."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _plan_pipeline(flow_params: dict) -> dict:
    """The learned predictor: the Prefect pipeline (profile → augment → train → search), every step a
    versioned artifact reused when its inputs are unchanged; a reused search says when it ran."""
    from memx.cli.orchestration import run_pipeline
    from memx.pipeline.store import store_from_uri

    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
    res = run_pipeline(**flow_params)
    obj = {k: v for k, v in res.items() if k not in ("profiles", "augment", "train", "version")}
    obj["artifacts"] = {k: res[k] for k in ("profiles", "augment", "train")} | {"search": res["version"]}
    st = store_from_uri(flow_params["store"])
    ref = next((r for r in st.list_versions("search") if r.version == res["version"]), None)
    if ref is not None and ref.created_at < started:
        obj["reused"] = {"search_s": obj.get("search_s"), "created_at": ref.created_at}
    return obj


def _check(obj: dict, baseline: Plan, cl: Cluster, mo: ModelArch, sp: SearchSpace, predictor: Any,
           min_margin: float, summary: Path | None, max_slowdown: float = 0.10) -> None:
    """`--check`: the Markdown verdict on stderr and in the summary file; CheckFailed (exit 4) when worse."""
    from memx.report.check import check_report

    outcome = check_report(obj, baseline, cl, mo, predictor, reserve_gib=sp.reserve_gib, min_margin=min_margin,
                           max_slowdown=max_slowdown, pipeline_assembly=sp.pipeline_assembly)
    typer.echo(outcome.markdown, err=True)
    _write_summary(outcome.markdown, summary)
    if outcome.exit_code:
        raise CheckFailed(f"plan check failed: {outcome.verdict} (--min-margin {min_margin:g}, --max-slowdown "
                          f"{max_slowdown:g}); see the summary above")


def _write_summary(markdown: str, summary: Path | None) -> None:
    """`--summary FILE` is (re)written; GitHub's `$GITHUB_STEP_SUMMARY` file is appended to."""
    if summary is not None:
        atomic_write_text(summary, markdown)
    elif os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(markdown)


def _log(obj: dict, cl: Cluster, mo: ModelArch, sp: SearchSpace, written: list[Path], predictor_version: str | None) -> None:
    """The plan as an MLflow run (memx.pipeline.plan_log); the run id on stderr."""
    from memx.pipeline import registry
    from memx.pipeline.plan_log import log_plan
    from memx.report.table import to_markdown

    extra = tuple(p for p in written if p.name not in ("plan.json", "plan.md"))
    run_id = log_plan(obj, cluster=cl, model=mo, space=sp, paths=extra, predictor_version=predictor_version,
                      files={"plan.json": json.dumps(obj, indent=2) + "\n", "plan.md": to_markdown(obj)})
    typer.echo(f"logged MLflow run {run_id} (experiment memx-plans, {registry.public_tracking_uri()}); see: memx ui",
               err=True)


def _megatron_or_stop(obj: dict, plan_obj: Any, model: ModelArch, cluster: Cluster) -> str:
    """megatron.sh when stock Megatron-LM starts the plan; else that script (it only explains) on stdout and
    NotLaunchable (exit 6) with the reasons and the nearest plan it runs (memx.report.megatron)."""
    from memx.domain.errors import NotLaunchable
    from memx.report.megatron import MEGATRON_SEARCH_HINT, megatron_launchable, nearest_launchable, render_megatron

    nearest = nearest_launchable(obj, model, cluster)
    script = render_megatron(plan_obj, model, cluster=cluster, nearest=nearest)
    problems = megatron_launchable(plan_obj, model, cluster)
    if not problems:
        return script
    typer.echo(script)
    raise NotLaunchable("stock Megatron-LM cannot start this plan: " + "; ".join(problems) + ". "
                        + (f"Nearest plan it runs: {nearest}" if nearest else f"Instead: {MEGATRON_SEARCH_HINT}"))


def _flagscale_file(plan_obj: Any, model: ModelArch, cluster: Cluster, out: Path) -> list[Path]:
    """flagscale.yaml in `--out` when FlagScale runs the plan; else a warning saying why (nothing written)."""
    from memx.report.flagscale import flagscale_problems, render_flagscale

    if problems := flagscale_problems(plan_obj, model):
        typer.echo(f"warning: no flagscale.yaml: FlagScale cannot run this plan: {'; '.join(problems)}", err=True)
        return []
    return [atomic_write_text(out / "flagscale.yaml", render_flagscale(plan_obj, model, cluster))]


def _emit(obj: dict, model: ModelArch, cluster: Cluster, fmt: Fmt, out: Path | None) -> list[Path]:
    """The answer on stdout in `fmt`; with `--out`, plan.json, plan.md, megatron.sh (executable) and the
    HTML report with its PNGs too."""
    from memx.domain.groups import any_plan_from_dict
    from memx.report.table import print_table, to_markdown

    plan_obj = any_plan_from_dict(obj["plan"])  # either schema (issue #15)
    if fmt is Fmt.json:
        typer.echo(json.dumps(obj))
    elif fmt is Fmt.markdown:
        typer.echo(to_markdown(obj))
    elif fmt is Fmt.megatron:
        typer.echo(_megatron_or_stop(obj, plan_obj, model, cluster))
    elif fmt is Fmt.flagscale:
        from memx.report.flagscale import render_flagscale

        typer.echo(render_flagscale(plan_obj, model, cluster))  # NotLaunchable (exit 6) with the reason
    else:
        from rich.console import Console  # rich only for the table (not for JSON, Markdown, scripts)

        print_table(obj, Console(width=160))
    if out is not None:
        from memx.cli.orchestration import matplotlib_env
        from memx.report.megatron import nearest_launchable, render_megatron

        matplotlib_env()
        from memx.report.html import write_report  # matplotlib reads MPLCONFIGDIR when first imported: after matplotlib_env()

        written = [atomic_write_text(out / "plan.json", json.dumps(obj, indent=2) + "\n"),
                   atomic_write_text(out / "plan.md", to_markdown(obj)),
                   atomic_write_text(out / "megatron.sh", render_megatron(plan_obj, model, cluster=cluster,
                                                                          nearest=nearest_launchable(obj, model, cluster)),
                                     executable=True),
                   *_flagscale_file(plan_obj, model, cluster, out), *write_report(obj, out)]
        typer.echo(f"wrote {', '.join(str(p) for p in written)}", err=True)
        return written
    return []
