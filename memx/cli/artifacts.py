"""`memx artifacts ls [STEP]` and `memx artifacts show STEP VERSION` (docs/architecture.md §Artifact store)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from memx.cli.options import StoreOpt, sub_app

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

artifacts_app = sub_app("Versioned step artifacts in the store (local folder or S3).")


def _rows_text(tables: dict) -> str:
    return ", ".join(f"{name}[{info.get('rows', '?')}]" for name, info in sorted(tables.items())) or "-"


@artifacts_app.command("ls")
def ls(step: Annotated[Optional[str], typer.Argument(help="Only this step (profile, augment, train, search).")] = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List complete step versions, newest first."""
    from memx.pipeline.store import store_from_uri

    st = store_from_uri(store)
    refs = st.list_versions(step)
    docs = [st.manifest(r.step, r.version) for r in refs]
    if as_json:
        typer.echo(json.dumps([{"step": r.step, "version": r.version, "created_at": r.created_at, "uri": r.uri, "tables": d.get("tables", {})} for r, d in zip(refs, docs)], indent=2))
        return
    if not refs:
        typer.echo(f"no complete versions in {st.root_uri}", err=True)
        return
    width = max(len(r.step) for r in refs)
    for ref, doc in zip(refs, docs):
        typer.echo(f"{ref.step:<{width}}  {ref.version}  {ref.created_at[:19]}  {_rows_text(doc.get('tables', {}))}")


@artifacts_app.command("show")
def show(
    step: Annotated[str, typer.Argument(help="Step name (profile, augment, train, search).")],
    version: Annotated[str, typer.Argument(help="Version (content hash).")],
    store: StoreOpt = None,
    table: Annotated[Optional[str], typer.Option("--table", help="Also print the first rows of this table.")] = None,
    head: Annotated[int, typer.Option(min=1, help="Rows to print with --table.")] = 10,
) -> None:
    """Print a version's manifest (inputs, row counts, metrics, time) and its object URIs."""
    from memx.pipeline.store import store_from_uri

    st = store_from_uri(store)
    doc = st.manifest(step, version)
    frame = st.get_table(step, version, table) if table else None
    typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    for name in sorted(doc.get("tables", {})):
        typer.echo(f"table {name}: {st.uri(step, version, name)}")
    for name in sorted(doc.get("files", {})):
        typer.echo(f"file  {name}: {st.uri(step, version, name)}")
    if frame is not None:
        typer.echo(frame.head(head).to_string())
