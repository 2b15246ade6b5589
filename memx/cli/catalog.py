"""`memx catalog [gpus|clusters|models|search]` and `memx cluster add-node` (docs/architecture.md §Catalogs).

    memx catalog [KIND] [--conf DIR]
    memx cluster add-node CLUSTER --gpu G [--count N] [--conf DIR]     writes the user's catalog (never the
                                                                       packaged conf/), emits memx.cluster.changed
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from memx.cli.options import ConfOpt, sub_app


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
    for name, folder in sources.items():
        typer.echo(f"{name:<{width}}  {folder}")


cluster_app = sub_app("Change a cluster catalog entry.")


@cluster_app.command("add-node")
def add_node_cmd(
    cluster: Annotated[str, typer.Argument(help="Cluster name or YAML path.")],
    gpu: Annotated[str, typer.Option(help="GPU type of the new node (a catalog name).")],
    count: Annotated[int, typer.Option(help="GPUs in the node.")] = 8,
    conf: ConfOpt = None,
) -> None:
    """Add a node of one GPU type to a cluster (a packaged cluster is copied to --conf, else $MEMX_HOME/conf;
    comments kept) and emit `memx.cluster.changed` to Prefect."""
    from memx.pipeline.events import add_node, emit_cluster_changed

    change = add_node(cluster, gpu, count, conf)
    sent = emit_cluster_changed(change)
    typer.echo(f"added {count} × {gpu} to {change.cluster}: wrote {change.path}; "
               + ("emitted memx.cluster.changed" if sent else "no PREFECT_API_URL: event not emitted"))
