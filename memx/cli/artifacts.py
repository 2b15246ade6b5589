"""`memx artifacts ls [STAGE]` and `memx artifacts show STAGE VERSION` (docs/architecture.md §Artifact store)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from memx.cli.options import StoreOpt, sub_app
from memx.pipeline.store import store_from_uri

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

artifacts_app = sub_app("Versioned stage artifacts in the store (local folder or S3).")


def _rows_text(tables: dict) -> str:
    return ", ".join(f"{name}[{info.get('rows', '?')}]" for name, info in sorted(tables.items())) or "-"


@artifacts_app.command("ls")
def ls(stage: Annotated[Optional[str], typer.Argument(help="Only this stage.")] = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List complete stage versions, newest first."""
    st = store_from_uri(store)
    refs = st.list_versions(stage)
    docs = [st.manifest(r.stage, r.version) for r in refs]
    if as_json:
        typer.echo(json.dumps([{"stage": r.stage, "version": r.version, "created_at": r.created_at, "uri": r.uri, "tables": d.get("tables", {})} for r, d in zip(refs, docs)], indent=2))
        return
    if not refs:
        typer.echo(f"no complete versions in {st.root_uri}", err=True)
        return
    width = max(len(r.stage) for r in refs)
    for ref, doc in zip(refs, docs):
        typer.echo(f"{ref.stage:<{width}}  {ref.version}  {ref.created_at[:19]}  {_rows_text(doc.get('tables', {}))}")


@artifacts_app.command("show")
def show(
    stage: Annotated[str, typer.Argument(help="Stage name.")],
    version: Annotated[str, typer.Argument(help="Version (content hash).")],
    store: StoreOpt = None,
    table: Annotated[Optional[str], typer.Option("--table", help="Also print the first rows of this table.")] = None,
    head: Annotated[int, typer.Option(min=1, help="Rows to print with --table.")] = 10,
) -> None:
    """Print a version's manifest (inputs, row counts, metrics, time) and its object URIs."""
    st = store_from_uri(store)
    doc = st.manifest(stage, version)
    frame = st.get_table(stage, version, table) if table else None
    typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    for name in sorted(doc.get("tables", {})):
        typer.echo(f"table {name}: {st.uri(stage, version, name)}")
    for name in sorted(doc.get("files", {})):
        typer.echo(f"file  {name}: {st.uri(stage, version, name)}")
    if frame is not None:
        typer.echo(frame.head(head).to_string())
