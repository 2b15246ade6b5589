"""`memx catalog [gpus|clusters|models|search]` and `memx cluster add-node` (docs/architecture.md §Catalogs).

    memx catalog [KIND] [--conf DIR]
    memx cluster add-node CLUSTER --gpu G [--count N] [--conf DIR]     writes the user's catalog (never the
                                                                       packaged conf/), emits memx.cluster.changed
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from memx.cli.options import DEFAULT_MODEL, DEFAULT_SEARCH, ConfOpt, sub_app


class Kind(str, Enum):
    gpus = "gpus"
    clusters = "clusters"
    models = "models"
    search = "search"


def catalog_cmd(kind: Annotated[Kind, typer.Argument(help="Which catalog to list.")] = Kind.gpus, conf: ConfOpt = None) -> None:
    """List catalog entries by name, with the folder each comes from (--conf over $MEMX_HOME/conf over the packaged conf/)."""
    from memx.domain.catalog import entry_sources

    sources = entry_sources(kind.value, conf)
    width = max((len(n) for n in sources), default=0)
    if kind is Kind.gpus:  # the spec sheet the planner and the closed form use
        typer.echo(f"{'name':<{width}}  {'memory GiB':>10}  {'bf16 TFLOPS':>11}  {'HBM GB/s':>8}  {'intra GB/s':>10}  folder")
    for name, folder in sources.items():
        typer.echo(f"{name:<{width}}  {_gpu_specs(name, conf) + '  ' if kind is Kind.gpus else ''}{folder}")


def _gpu_specs(name: str, conf) -> str:
    """memory, peak bf16 TFLOPS, memory and intra-node bandwidth of a GPU entry (a broken entry: exit 2 naming it)."""
    from memx.domain.catalog import load_gpu

    g = load_gpu(name, conf)
    return (f"{g.memory_gib:>10g}  {g.peak_tflops_bf16:>11g}  {g.memory_bandwidth_gbps:>8g}  "
            f"{g.intra_node_bandwidth_gbps:>10g}")


cluster_app = sub_app("Change a cluster catalog entry.")


@cluster_app.command("add-node")
def add_node_cmd(
    cluster: Annotated[str, typer.Argument(help="Cluster name or YAML path.")],
    gpu: Annotated[str, typer.Option(help="GPU type of the new node (a catalog name).")],
    count: Annotated[int, typer.Option(help="GPUs in the node.")] = 8,
    conf: ConfOpt = None,
    model: Annotated[str, typer.Option("--model", help="Model the event-triggered re-plan plans (prefect.yaml reprofile-on-hardware).")] = DEFAULT_MODEL,
    search: Annotated[str, typer.Option("--search", help="Search space of that re-plan.")] = DEFAULT_SEARCH,
) -> None:
    """Add a node of one GPU type to a cluster (a packaged cluster is copied to --conf, else $MEMX_HOME/conf;
    comments kept) and emit `memx.cluster.changed` to Prefect."""
    from memx.domain.catalog import load_model, load_search
    from memx.pipeline.events import add_node, emit_cluster_changed

    load_model(model, conf), load_search(search, conf)  # the event's re-plan must be able to run: checked first
    change = add_node(cluster, gpu, count, conf)
    sent = emit_cluster_changed(change, model, search)
    typer.echo(f"added {count} × {gpu} to {change.cluster}: wrote {change.path}; "
               + ("emitted memx.cluster.changed" if sent else "no PREFECT_API_URL: event not emitted"))
