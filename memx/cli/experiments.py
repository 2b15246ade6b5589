"""`memx experiments [all|prediction|search-cost|deployment|table1|scaling|robustness] --out DIR
[--scale small|full] [--seed S] [--predictor analytic|quick|registered]` (register(app) mounts it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

NAMES = ("all", "prediction", "search-cost", "deployment", "table1", "scaling", "robustness")


def register(app: typer.Typer) -> None:
    @app.command("experiments")
    def experiments(
        which: Annotated[str, typer.Argument(help="all | " + " | ".join(NAMES[1:]))] = "all",
        out: Annotated[Path, typer.Option(help="Folder for Markdown tables, CSVs and PNG figures.")] = Path("docs/results"),
        scale: Annotated[str, typer.Option(help="small (minutes, quick predictor) | full (learned predictor via MLflow)")] = "small",
        seed: Annotated[int, typer.Option(help="Seed for sampling, noise and training.")] = 0,
        predictor: Annotated[Optional[str], typer.Option(help="analytic | quick | registered (default: by scale)")] = None,
    ) -> None:
        """Reproduce the paper's experiments against the re-implemented baselines."""
        if which not in NAMES:
            typer.echo(f"error: experiment {which!r}: allowed values are {', '.join(NAMES)}", err=True)
            raise typer.Exit(2)
        if scale not in ("small", "full") or (predictor is not None and predictor not in ("analytic", "quick", "registered")):
            typer.echo("error: --scale must be small or full; --predictor analytic, quick or registered", err=True)
            raise typer.Exit(2)
        from memx.experiments import EXPERIMENTS, run_all

        names = list(EXPERIMENTS) if which == "all" else [which]
        for name, res in run_all(out, names=names, scale=scale, seed=seed, predictor=predictor).items():
            typer.echo(f"{name}: {res.seconds:.1f} s → " + ", ".join(str(f) for f in res.files if f.suffix in (".md", ".png")))
