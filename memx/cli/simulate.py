"""`memx simulate`: run a stage or a plan on the virtual cluster, or sample measured plans.

    memx simulate stage [STAGE.json]                 stage signature JSON (stdin when no file) → JSON
    memx simulate plan [PLAN.json] --cluster C --model M [--conf DIR] [--seed S]
    memx simulate sample --cluster C --model M [--search S] --n N --seed S --out runs.parquet [--conf DIR]

Bad input: one message naming the field on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer

from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InputError
from memx.domain.io import atomic_write_parquet
from memx.domain.plan import plan_from_json
from memx.simulator.sample import sample_plans
from memx.simulator.schedule import simulate_plan
from memx.simulator.stage import measure_stage, signature_from_dict
from memx.simulator.traits import load_traits

app = typer.Typer(help="The virtual cluster: simulate a stage, a plan, or sample measured plans.",
                  no_args_is_help=True, add_completion=False)

CONF = typer.Option(None, "--conf", help="catalog root (default: $MEMX_CONF or the shipped conf/)")


def _read_input(path: Optional[Path], what: str) -> str:
    if path is None:
        return sys.stdin.read()
    if not path.is_file():
        raise InputError(f"{path}: no such {what} file")
    return path.read_text()


def _fail(exc: InputError) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(code=exc.exit_code)


def _json_out(data: dict[str, Any]) -> None:
    typer.echo(json.dumps(data, indent=2, default=lambda v: v.item() if isinstance(v, np.generic) else str(v)))


@app.command()
def stage(file: Optional[Path] = typer.Argument(None, help="stage signature JSON (default: stdin)"),
          seed: int = typer.Option(0, "--seed"), conf: Optional[Path] = CONF) -> None:
    """Run one stage alone on tp GPUs: time_ms, peak_mem_mib, static_mem_mib, status, reason."""
    try:
        text = _read_input(file, "stage")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"stage: not valid JSON: {exc}") from exc
        sig = signature_from_dict(data)
        gpu = load_gpu(sig.gpu, conf)
        run = measure_stage(sig, gpu, load_traits(sig.gpu, conf), rng=np.random.default_rng(seed))
    except InputError as exc:
        _fail(exc)
        return
    _json_out({**sig.to_dict(), **dataclasses.asdict(run), "backend": "simulated", "seed": seed})


@app.command()
def plan(file: Optional[Path] = typer.Argument(None, help="plan JSON (default: stdin)"),
         cluster: str = typer.Option(..., "--cluster", help="cluster name or YAML path"),
         model: str = typer.Option(..., "--model", help="model name or YAML path"),
         seed: int = typer.Option(0, "--seed"), conf: Optional[Path] = CONF) -> None:
    """Run one iteration of a plan: iteration_time_ms, per-GPU peak_mem_mib, oom, breakdown."""
    try:
        p = plan_from_json(_read_input(file, "plan"), source=str(file or "plan"))
        run = simulate_plan(p, load_cluster(cluster, conf), load_model(model, conf), seed=seed, conf_root=conf)
    except InputError as exc:
        _fail(exc)
        return
    _json_out({**dataclasses.asdict(run), "seed": seed})


@app.command()
def sample(cluster: str = typer.Option(..., "--cluster"), model: str = typer.Option(..., "--model"),
           search: str = typer.Option("default", "--search"), n: int = typer.Option(..., "--n", min=1),
           seed: int = typer.Option(..., "--seed"), out: Path = typer.Option(..., "--out"),
           conf: Optional[Path] = CONF) -> None:
    """Measure N random valid plans; write config_runs Parquet atomically."""
    try:
        df = sample_plans(load_cluster(cluster, conf), load_model(model, conf), load_search(search, conf),
                          n=n, seed=seed, conf_root=conf)
    except InputError as exc:
        _fail(exc)
        return
    atomic_write_parquet(df, out)
    typer.echo(f"wrote {len(df)} config_runs ({int(df.oom.sum())} OOM) to {out}")
