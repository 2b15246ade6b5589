"""`memx plan`: search the plan space and recommend a plan (docs/architecture.md §CLI, §Plan JSON).

    memx plan [--cluster C] [--model M] [--search S] [--conf DIR]               (Job)
              [--top K] [--weights W] [--format F] [--out DIR]                  (Output)
              [--backend B] [--seed S] [--store URI] [--dask D] [--command ...] (Predictor)
              [--records PATH] [--jobs N]
              [--check BASELINE.json] [--min-margin X] [--summary FILE]         (CI check)

Exit codes: 0 ok, 2 bad input, 3 no feasible plan, 4 the check failed (raised as MemxError; the root
group's handler prints them).
"""

from __future__ import annotations

import json
import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from memx.cli.options import (DEFAULT_CLUSTER, DEFAULT_MODEL, DEFAULT_SEARCH, ClusterOpt, CommandOpt, ConfOpt,
    JobsOpt, ModelOpt, RecordsOpt, SearchOpt, SeedOpt, StoreOpt, WeightsOpt, in_panel, load_specs, split_command)
from memx.cli.orchestration import run_pipeline
from memx.domain.errors import CheckFailed, InputError
from memx.domain.io import atomic_write_text
from memx.domain.plan import Plan, plan_from_dict
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.pipeline.steps import load_trained
from memx.pipeline.store import store_from_uri
from memx.planner.cost import AnalyticStageModel
from memx.planner.search import search as run_search
from memx.profiling import BACKENDS as PROFILING_BACKENDS
from memx.report.check import check_report, load_baseline
from memx.report.megatron import render_megatron
from memx.planner.result import search_result_to_dict
from memx.report.table import print_table, to_markdown

JOB, OUTPUT, PREDICTOR, CI = "Job", "Output", "Predictor", "CI check"
BACKENDS = ("analytic", *PROFILING_BACKENDS)


class Fmt(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    megatron = "megatron"


TopOpt = Annotated[int, typer.Option("--top", min=1, help="How many plans to list.", rich_help_panel=OUTPUT)]
FormatOpt = Annotated[Fmt, typer.Option("--format", help="Output format.", rich_help_panel=OUTPUT)]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Also write plan.json, plan.md and megatron.sh here.", rich_help_panel=OUTPUT)]
BackendOpt = Annotated[str, typer.Option("--backend", rich_help_panel=PREDICTOR, help=(
    "Stage predictor: analytic (closed form), or a profiling backend — simulated|command|torch|records — for the "
    "learned predictor via the Prefect pipeline."))]
DaskOpt = Annotated[Optional[str], typer.Option("--dask", help="Shard the search on Dask: 'local' (2 workers) or a scheduler address.", rich_help_panel=PREDICTOR)]
CheckOpt = Annotated[Optional[Path], typer.Option("--check", help="Baseline plan JSON: exit 4 if the new plan is worse or its margin is below --min-margin.", rich_help_panel=CI)]
MinMarginOpt = Annotated[float, typer.Option("--min-margin", help="With --check: the smallest acceptable memory margin.", rich_help_panel=CI)]
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
    backend: BackendOpt = "analytic",
    seed: PredSeed = 0,
    store: PredStore = None,
    dask: DaskOpt = None,
    command: PredCommand = None,
    records: PredRecords = None,
    jobs: PredJobs = 1,
    check: CheckOpt = None,
    min_margin: MinMarginOpt = 0.05,
    summary: SummaryOpt = None,
) -> None:
    """Search the plan space and recommend a plan."""
    cl, mo, sp = load_specs(cluster, model, search, conf)
    baseline = load_baseline(check) if check is not None else None
    if backend == "analytic":
        obj, predictor = _plan_analytic(cl, mo, sp, weights, top)
    else:
        flow_params = dict(cluster=cluster, model=model, search=search, conf=str(conf) if conf else None,
                           backend=backend, seed=seed, store=store, weights=weights, top_k=top, dask=dask,
                           profile_options=_profile_options(backend, command, records, jobs))
        obj, predictor = _plan_pipeline(flow_params)
    _emit(obj, mo, fmt, out)
    if baseline is not None:
        _check(obj, baseline, cl, mo, sp, predictor, min_margin, summary)


def _plan_analytic(cl: Cluster, mo: ModelArch, sp: SearchSpace, weights: str | None, top: int) -> tuple[dict, Any]:
    """The closed-form stage model (docs/architecture.md §Stage model): no profiling, no training."""
    predictor = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    return search_result_to_dict(run_search(cl, mo, sp, predictor, weights=weights, top_k=top), "analytic"), predictor


def _profile_options(backend: str, command: str | None, records: Path | None, jobs: int) -> dict:
    """What the profiling backend needs beyond the job (InputError when a backend's input is missing)."""
    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "command" and not command:
        raise InputError("--backend command needs --command 'PROGRAM ARGS {tp} {layers} ...'")
    if backend == "records" and records is None:
        raise InputError("--backend records needs --records PATH (CSV, Parquet or JSONL)")
    options: dict = {}
    if command:
        options.update(command=split_command(command), jobs=jobs)
    if records is not None:
        options["records"] = str(records.resolve())
    return options


def _plan_pipeline(flow_params: dict) -> tuple[dict, Any]:
    """The learned predictor: the Prefect pipeline (profile → augment → train → search), every stage a
    versioned artifact reused when its inputs are unchanged."""
    res = run_pipeline(**flow_params)
    obj = {k: v for k, v in res.items() if k not in ("profiles", "augment", "train", "version")}
    obj["artifacts"] = {k: res[k] for k in ("profiles", "augment", "train")} | {"search": res["version"]}
    manifest = store_from_uri(flow_params["store"]).manifest("train", res["train"])
    return obj, load_trained(manifest, None)


def _check(obj: dict, baseline: Plan, cl: Cluster, mo: ModelArch, sp: SearchSpace, predictor: Any,
           min_margin: float, summary: Path | None) -> None:
    """`--check`: the Markdown verdict on stderr and in the summary file; CheckFailed (exit 4) when worse."""
    outcome = check_report(obj, baseline, cl, mo, predictor, reserve_gib=sp.reserve_gib, min_margin=min_margin)
    typer.echo(outcome.markdown, err=True)
    _write_summary(outcome.markdown, summary)
    if outcome.exit_code:
        raise CheckFailed(f"plan check failed: {outcome.verdict} (--min-margin {min_margin:g}); see the summary above")


def _write_summary(markdown: str, summary: Path | None) -> None:
    """`--summary FILE` is (re)written; GitHub's `$GITHUB_STEP_SUMMARY` file is appended to."""
    if summary is not None:
        atomic_write_text(summary, markdown)
    elif os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(markdown)


def _emit(obj: dict, model: ModelArch, fmt: Fmt, out: Path | None) -> None:
    """The answer on stdout in `fmt`; with `--out`, plan.json, plan.md and megatron.sh too."""
    plan_obj = plan_from_dict(obj["plan"])
    if fmt is Fmt.json:
        typer.echo(json.dumps(obj))
    elif fmt is Fmt.markdown:
        typer.echo(to_markdown(obj))
    elif fmt is Fmt.megatron:
        typer.echo(render_megatron(plan_obj, model))
    else:
        print_table(obj, Console(width=160))
    if out is not None:
        atomic_write_text(out / "plan.json", json.dumps(obj, indent=2) + "\n")
        atomic_write_text(out / "plan.md", to_markdown(obj))
        atomic_write_text(out / "megatron.sh", render_megatron(plan_obj, model))
        typer.echo(f"wrote {out / 'plan.json'}, {out / 'plan.md'}, {out / 'megatron.sh'}", err=True)
