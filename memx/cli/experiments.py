"""`memx experiments [all|prediction|search-cost|deployment|table1|scaling|robustness] --out DIR
[--scale small|full] [--seed S] [--predictor analytic|quick|registered]` (mounted by memx.cli.app)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memx.cli.options import SeedOpt
from memx.domain.errors import InputError

NAMES = ("all", "prediction", "search-cost", "deployment", "table1", "scaling", "robustness")  # memx.experiments.EXPERIMENTS
SCALES = ("small", "full")
PREDICTORS = ("analytic", "quick", "registered")


def experiments_cmd(
    which: Annotated[str, typer.Argument(help="all | " + " | ".join(NAMES[1:]))] = "all",
    out: Annotated[Path, typer.Option(help="Folder for Markdown tables, CSVs and PNG figures.")] = Path("docs/results"),
    scale: Annotated[str, typer.Option(help="small (minutes, quick predictor) | full (learned predictor via MLflow)")] = "small",
    seed: SeedOpt = 0,
    predictor: Annotated[Optional[str], typer.Option(help="analytic | quick | registered (default: by scale)")] = None,
) -> None:
    """Reproduce the paper's experiments against the re-implemented baselines."""
    if which not in NAMES:
        raise InputError(f"experiment {which!r}: allowed values are {', '.join(NAMES)}")
    if scale not in SCALES or (predictor is not None and predictor not in PREDICTORS):
        raise InputError("--scale must be small or full; --predictor analytic, quick or registered")
    from memx.experiments import run_all  # loads matplotlib.pyplot: +0.35 s on every `memx` call if at the top

    names = None if which == "all" else [which]  # None: every experiment
    for name, res in run_all(out, names=names, scale=scale, seed=seed, predictor=predictor).items():
        typer.echo(f"{name}: {res.seconds:.1f} s → " + ", ".join(str(f) for f in res.files if f.suffix in (".md", ".png")))
