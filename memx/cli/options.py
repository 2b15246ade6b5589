"""Options shared by every `memx` command group, and the one error handler (docs/architecture.md §CLI).

Every command raises `MemxError` subclasses for bad input (exit 2), no feasible plan (3) and a failed
check (4); `MemxGroup.invoke` turns them into one `error: …` line on stderr and the exit code. No
command catches them itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
import typer.core

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import MemxError
from memx.domain.specs import Cluster, ModelArch, SearchSpace

DEFAULT_CLUSTER = "three-vendor-20"
DEFAULT_MODEL = "llama2-7b"
DEFAULT_SEARCH = "default"


class MemxGroup(typer.core.TyperGroup):
    """The root command group: the single place where errors become messages and exit codes."""

    def invoke(self, ctx):  # noqa: D401 - click API
        try:
            return super().invoke(ctx)
        except MemxError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None


def new_app(help_text: str) -> typer.Typer:
    """A command group; sub-groups are mounted on the root with `app.add_typer(sub, name=...)`."""
    return typer.Typer(cls=MemxGroup, add_completion=False, no_args_is_help=True, help=help_text)


ConfOpt = Annotated[Optional[Path], typer.Option("--conf", help="Your catalog folder (gpus/, clusters/, models/, search/); default: the packaged conf/.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", help="Cluster name or YAML path.")]
ModelOpt = Annotated[str, typer.Option("--model", help="Model name or YAML path.")]
SearchOpt = Annotated[str, typer.Option("--search", help="Search space name or YAML path.")]
StoreOpt = Annotated[Optional[str], typer.Option("--store", help="Artifact store: a folder or s3://bucket/prefix (default: $MEMX_STORE, else $MEMX_HOME/artifacts).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for profiling, splitting, tuning and boosting.")]


def load_specs(cluster: str, model: str, search: str, conf: Path | None) -> tuple[Cluster, ModelArch, SearchSpace]:
    """The three catalog entries a command works on (InputError names the file and field)."""
    return load_cluster(cluster, conf), load_model(model, conf), load_search(search, conf)
