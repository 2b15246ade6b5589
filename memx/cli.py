"""The `memx` command line (typer). Exit codes: 0 ok, 2 bad input, 3 no feasible plan, 4 check failed."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from memx.errors import InputError, MemxError

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


def _predictor(backend: str, cluster, model, space, conf: Path | None, seed: int):
    """The stage predictor for a backend: `analytic` is the closed-form model; the others run the
    profile → augment → train pipeline (memx.workflow) and reuse what is stored."""
    if backend == "analytic":
        from memx.analytic import AnalyticStageModel

        return AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}), "analytic"
    try:
        from memx.workflow import plan_predictor
    except ImportError as exc:  # pragma: no cover - only before the learned predictor exists
        raise InputError(f"--backend {backend}: the learned-predictor pipeline is not available ({exc})") from exc
    pred, info = plan_predictor(cluster, model, space, backend=backend, conf_root=conf, seed=seed)
    return pred, f"{pred.name} ({info.get('model_version', '?')})"


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
    backend: Annotated[str, typer.Option(help="Stage predictor: analytic, or a profiling backend (simulated|command|torch|records) for the learned one.")] = "analytic",
    seed: Annotated[int, typer.Option(help="Seed for profiling and training.")] = 0,
    check: Annotated[Optional[Path], typer.Option("--check", help="Baseline plan JSON: exit 4 if the new plan is worse or its margin is below --min-margin.")] = None,
    min_margin: Annotated[float, typer.Option(help="With --check: the smallest acceptable memory margin.")] = 0.05,
    summary: Annotated[Optional[Path], typer.Option(help="With --check: write the Markdown summary here (default $GITHUB_STEP_SUMMARY when set).")] = None,
) -> None:
    """Search the plan space and recommend a plan."""
    from memx.catalog import load_cluster, load_model, load_search
    from memx.search import search as run_search

    with errors():
        cl, mo, sp = load_cluster(cluster, conf), load_model(model, conf), load_search(search, conf)
        predictor, pname = _predictor(backend, cl, mo, sp, conf, seed)
        baseline = None
        if check is not None:
            from memx.check import load_baseline

            baseline = load_baseline(check)
        result = run_search(cl, mo, sp, predictor, weights=weights, top_k=top)
        _emit(result, pname, mo, fmt, out)
        if baseline is not None:
            _check(result, baseline, cl, mo, predictor, sp.reserve_gib, min_margin, summary)


def _check(result, baseline, cl, mo, predictor, reserve_gib: float, min_margin: float, summary: Path | None) -> None:
    import os

    from memx.check import check as run_check
    from memx.io import atomic_write_text

    outcome = run_check(result, baseline, cl, mo, predictor, reserve_gib=reserve_gib, min_margin=min_margin)
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


def _emit(result, pname: str, model, fmt: Fmt, out: Path | None) -> None:
    from memx.io import atomic_write_text
    from memx.megatron import render_megatron
    from memx.report import print_table, to_json_obj, to_markdown

    if fmt is Fmt.json:
        typer.echo(json.dumps(to_json_obj(result, pname)))
    elif fmt is Fmt.markdown:
        typer.echo(to_markdown(result, pname))
    elif fmt is Fmt.megatron:
        typer.echo(render_megatron(result.best.plan, model))
    else:
        from rich.console import Console

        print_table(result, pname, Console(width=160))
    if out is not None:
        atomic_write_text(out / "plan.json", json.dumps(to_json_obj(result, pname), indent=2) + "\n")
        atomic_write_text(out / "plan.md", to_markdown(result, pname))
        atomic_write_text(out / "megatron.sh", render_megatron(result.best.plan, model))
        typer.echo(f"wrote {out / 'plan.json'}, {out / 'plan.md'}, {out / 'megatron.sh'}", err=True)


class Kind(str, Enum):
    gpus = "gpus"
    clusters = "clusters"
    models = "models"
    search = "search"


@app.command("catalog")
def catalog_cmd(kind: Annotated[Kind, typer.Argument(help="Which catalog to list.")] = Kind.gpus, conf: ConfOpt = None) -> None:
    """List catalog entries by name."""
    from memx.catalog import known_names

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
    from memx.events import add_node, emit_cluster_changed

    with errors():
        change = add_node(cluster, gpu, count, conf)
        sent = emit_cluster_changed(change)
    typer.echo(f"added {count} × {gpu} to {change.cluster} ({change.path}); "
               + ("emitted memx.cluster.changed" if sent else "no PREFECT_API_URL: event not emitted"))


def _mount() -> None:
    """Sub-commands that live beside their modules."""
    from memx.artifacts_cli import register as register_artifacts
    from memx.predictor.cli import register as register_predictor
    from memx.profiling.cli import register as register_profiling
    from memx.simulator.cli import app as simulate_app

    app.add_typer(simulate_app, name="simulate", help="The virtual cluster: run stages and plans, sample measured plans.")
    register_artifacts(app)
    register_predictor(app)
    register_profiling(app)


_mount()


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
