"""The `memx` command line (typer). Exit codes: 0 ok, 2 bad input, 3 no feasible plan, 4 check failed."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from memx.domain.errors import InputError, MemxError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="MemX: memory-aware parallel plans for mixed GPU clusters.")

DEFAULT_CLUSTER = "three-vendor-20"
DEFAULT_MODEL = "llama2-7b"

ConfOpt = Annotated[Optional[Path], typer.Option("--conf", help="Catalog root with gpus/, clusters/, models/, search/ (default: the packaged conf/).")]


class Fmt(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    megatron = "megatron"


@contextmanager
def errors():
    """MemxError → one message on stderr and its exit code (2 bad input, 3 infeasible, 4 check)."""
    try:
        yield
    except MemxError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None


@app.command()
def plan(
    cluster: Annotated[str, typer.Option(help="Cluster name or YAML path.")] = DEFAULT_CLUSTER,
    model: Annotated[str, typer.Option(help="Model name or YAML path.")] = DEFAULT_MODEL,
    search: Annotated[str, typer.Option(help="Search space name or YAML path.")] = "default",
    conf: ConfOpt = None,
    top: Annotated[int, typer.Option(min=1, help="How many plans to list.")] = 10,
    weights: Annotated[Optional[str], typer.Option(help="auto | default | safety | throughput | 'wT,wM,wV' (default: the search YAML's).")] = None,
    fmt: Annotated[Fmt, typer.Option("--format", help="Output format.")] = Fmt.table,
    out: Annotated[Optional[Path], typer.Option(help="Also write plan.json, plan.md and megatron.sh here.")] = None,
    backend: Annotated[str, typer.Option(help="Stage predictor: analytic (closed form), or a profiling backend — simulated|command|torch|records — for the learned predictor via the Prefect pipeline.")] = "analytic",
    seed: Annotated[int, typer.Option(help="Seed for profiling and training.")] = 0,
    check: Annotated[Optional[Path], typer.Option("--check", help="Baseline plan JSON: exit 4 if the new plan is worse or its margin is below --min-margin.")] = None,
    min_margin: Annotated[float, typer.Option(help="With --check: the smallest acceptable memory margin.")] = 0.05,
    summary: Annotated[Optional[Path], typer.Option(help="With --check: write the Markdown summary here (default $GITHUB_STEP_SUMMARY when set).")] = None,
    store: Annotated[Optional[str], typer.Option(help="Artifact store for the pipeline: a folder or s3://bucket/prefix (default $MEMX_STORE, else $MEMX_HOME/artifacts).")] = None,
    dask: Annotated[Optional[str], typer.Option(help="Shard the search on Dask: 'local' (2 workers) or a scheduler address.")] = None,
    command: Annotated[Optional[str], typer.Option(help="--backend command: the launcher per profile point, with {placeholders} (docs/profiling.md).")] = None,
    records: Annotated[Optional[Path], typer.Option(help="--backend records: measurements to import (CSV, Parquet, JSONL).")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="--backend command: points measured in parallel.")] = 1,
) -> None:
    """Search the plan space and recommend a plan."""
    from memx.domain.catalog import load_cluster, load_model, load_search

    with errors():
        cl, mo, sp = load_cluster(cluster, conf), load_model(model, conf), load_search(search, conf)
        baseline = None
        if check is not None:
            from memx.report.check import load_baseline

            baseline = load_baseline(check)
        if backend == "analytic":
            obj, predictor = _plan_analytic(cl, mo, sp, weights, top)
        else:
            options = _profile_options(backend, command, records, jobs)
            obj, predictor = _plan_pipeline(cluster, model, search, conf, backend, seed, store, weights, top, dask, options)
        _emit(obj, mo, fmt, out)
        if baseline is not None:
            _check(obj, baseline, cl, mo, predictor, sp.reserve_gib, min_margin, summary)


BACKENDS = ("analytic", "simulated", "command", "torch", "records")


def prefect_env() -> None:
    """Prefect without a server keeps its state under $MEMX_HOME (set before prefect is imported)."""
    import os

    home = Path(os.environ.get("MEMX_HOME", ".memx")).resolve()
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # its SQLite DB needs the folder
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(home / "prefect" / "storage"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # The temporary server needs ~15 s on 2 busy cores; Prefect waits 20 s by default.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _plan_analytic(cl, mo, sp, weights, top):
    from memx.planner.cost import AnalyticStageModel
    from memx.report.table import to_json_obj
    from memx.planner.search import search as run_search

    predictor = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    return to_json_obj(run_search(cl, mo, sp, predictor, weights=weights, top_k=top), "analytic"), predictor


def _profile_options(backend: str, command: str | None, records: Path | None, jobs: int) -> dict:
    import shlex

    if backend == "command" and not command:
        raise InputError("--backend command needs --command 'PROGRAM ARGS {tp} {layers} ...'")
    if backend == "records" and records is None:
        raise InputError("--backend records needs --records PATH (CSV, Parquet or JSONL)")
    options: dict = {}
    if command:
        options.update(command=shlex.split(command), jobs=jobs)
    if records is not None:
        options["records"] = str(records.resolve())
    return options


def _plan_pipeline(cluster, model, search, conf, backend, seed, store, weights, top, dask, options):
    """The learned predictor: the Prefect pipeline (profile → augment → train → search), every stage a
    versioned artifact reused when its inputs are unchanged."""
    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    prefect_env()
    from flows.pipeline import pipeline_flow
    from memx.pipeline.steps import load_trained
    from memx.pipeline.store import store_from_uri

    res = pipeline_flow(cluster=cluster, model=model, search=search, conf=str(conf) if conf else None, backend=backend,
                        seed=seed, store=store, weights=weights, top_k=top, dask=dask, profile_options=options)
    obj = {k: v for k, v in res.items() if k not in ("profiles", "augment", "train", "version")}
    obj["artifacts"] = {k: res[k] for k in ("profiles", "augment", "train")} | {"search": res["version"]}
    manifest = store_from_uri(store).manifest("train", res["train"])
    return obj, load_trained(manifest, None)


def _check(obj, baseline, cl, mo, predictor, reserve_gib: float, min_margin: float, summary: Path | None) -> None:
    import os

    from memx.report.check import check_report as run_check
    from memx.domain.io import atomic_write_text

    outcome = run_check(obj, baseline, cl, mo, predictor, reserve_gib=reserve_gib, min_margin=min_margin)
    typer.echo(outcome.markdown, err=True)
    target = summary or (Path(os.environ["GITHUB_STEP_SUMMARY"]) if os.environ.get("GITHUB_STEP_SUMMARY") else None)
    if target is not None:
        if summary is None:  # GitHub's summary file is appended to
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(outcome.markdown)
        else:
            atomic_write_text(target, outcome.markdown)
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)


def _emit(obj: dict, model, fmt: Fmt, out: Path | None) -> None:
    from memx.domain.io import atomic_write_text
    from memx.report.megatron import render_megatron
    from memx.domain.plan import plan_from_dict
    from memx.report.table import print_table, to_markdown

    plan_obj = plan_from_dict(obj["plan"])
    if fmt is Fmt.json:
        typer.echo(json.dumps(obj))
    elif fmt is Fmt.markdown:
        typer.echo(to_markdown(obj))
    elif fmt is Fmt.megatron:
        typer.echo(render_megatron(plan_obj, model))
    else:
        from rich.console import Console

        print_table(obj, Console(width=160))
    if out is not None:
        atomic_write_text(out / "plan.json", json.dumps(obj, indent=2) + "\n")
        atomic_write_text(out / "plan.md", to_markdown(obj))
        atomic_write_text(out / "megatron.sh", render_megatron(plan_obj, model))
        typer.echo(f"wrote {out / 'plan.json'}, {out / 'plan.md'}, {out / 'megatron.sh'}", err=True)


class Kind(str, Enum):
    gpus = "gpus"
    clusters = "clusters"
    models = "models"
    search = "search"


@app.command("catalog")
def catalog_cmd(kind: Annotated[Kind, typer.Argument(help="Which catalog to list.")] = Kind.gpus, conf: ConfOpt = None) -> None:
    """List catalog entries by name."""
    from memx.domain.catalog import known_names

    for name in known_names(kind.value, conf):
        typer.echo(name)


cluster_app = typer.Typer(no_args_is_help=True, help="Change a cluster catalog entry.")
app.add_typer(cluster_app, name="cluster")


@cluster_app.command("add-node")
def add_node_cmd(
    cluster: Annotated[str, typer.Argument(help="Cluster name or YAML path.")],
    gpu: Annotated[str, typer.Option(help="GPU type of the new node (a catalog name).")],
    count: Annotated[int, typer.Option(help="GPUs in the node.")] = 8,
    conf: ConfOpt = None,
) -> None:
    """Add a node of one GPU type to a cluster and emit `memx.cluster.changed` to Prefect."""
    from memx.pipeline.events import add_node, emit_cluster_changed

    with errors():
        change = add_node(cluster, gpu, count, conf)
        sent = emit_cluster_changed(change)
    typer.echo(f"added {count} × {gpu} to {change.cluster} ({change.path}); "
               + ("emitted memx.cluster.changed" if sent else "no PREFECT_API_URL: event not emitted"))


def _mount() -> None:
    """Sub-commands that live beside their modules."""
    from memx.cli.artifacts import register as register_artifacts
    from memx.cli.experiments import register as register_experiments
    from memx.cli.learn import register as register_predictor
    from memx.cli.profile import register as register_profiling
    from memx.cli.simulate import app as simulate_app

    app.add_typer(simulate_app, name="simulate", help="The virtual cluster: run stages and plans, sample measured plans.")
    register_artifacts(app)
    register_predictor(app)
    register_profiling(app)
    register_experiments(app)


_mount()


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
