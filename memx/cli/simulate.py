"""`memx simulate`: run a stage or a plan on the virtual cluster, or sample measured plans.

    memx simulate stage [STAGE.json]                 stage signature JSON (stdin when no file) → JSON
    memx simulate plan [PLAN.json] --cluster C --model M [--conf DIR] [--seed S]
    memx simulate sample --cluster C --model M [--search S] --n N --seed S --out runs.parquet [--conf DIR]

Bad input: InputError naming the field (one message on stderr, exit code 2), nothing written.
The simulator is the ground truth: nothing here imports memx.planner (docs/architecture.md §Layers).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer

from memx.cli.options import DEFAULT_SEARCH, ClusterOpt, ConfOpt, ModelOpt, SearchOpt, SeedOpt, load_specs, sub_app
from memx.domain.catalog import load_cluster, load_gpu, load_model
from memx.domain.errors import InputError
from memx.domain.io import atomic_write_parquet
from memx.domain.plan import plan_from_json
from memx.simulator.sample import sample_plans
from memx.simulator.schedule import simulate_plan
from memx.simulator.stage import measure_stage, signature_from_dict
from memx.simulator.traits import load_traits

simulate_app = sub_app("The virtual cluster: run stages and plans, sample measured plans.")


def _read_input(path: Optional[Path], what: str) -> str:
    if path is None:
        return sys.stdin.read()
    if not path.is_file():
        raise InputError(f"{path}: no such {what} file")
    return path.read_text()


def _json_out(data: dict[str, Any]) -> None:
    typer.echo(json.dumps(data, indent=2, default=lambda v: v.item() if isinstance(v, np.generic) else str(v)))


@simulate_app.command()
def stage(file: Annotated[Optional[Path], typer.Argument(help="stage signature JSON (default: stdin)")] = None,
          seed: SeedOpt = 0, conf: ConfOpt = None) -> None:
    """Run one stage alone on tp GPUs: time_ms, peak_mem_mib, static_mem_mib, status, reason."""
    text = _read_input(file, "stage")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"stage: not valid JSON: {exc}") from exc
    sig = signature_from_dict(data)
    run = measure_stage(sig, load_gpu(sig.gpu, conf), load_traits(sig.gpu, conf), rng=np.random.default_rng(seed))
    _json_out({**sig.to_dict(), **dataclasses.asdict(run), "backend": "simulated", "seed": seed})


@simulate_app.command()
def plan(file: Annotated[Optional[Path], typer.Argument(help="plan JSON (default: stdin)")] = None, *,
         cluster: ClusterOpt, model: ModelOpt, seed: SeedOpt = 0, conf: ConfOpt = None) -> None:
    """Run one iteration of a plan: iteration_time_ms, per-GPU peak_mem_mib, oom, breakdown."""
    p = plan_from_json(_read_input(file, "plan"), source=str(file or "plan"))
    run = simulate_plan(p, load_cluster(cluster, conf), load_model(model, conf), seed=seed, conf_root=conf)
    _json_out({**dataclasses.asdict(run), "seed": seed})


@simulate_app.command()
def sample(*, cluster: ClusterOpt, model: ModelOpt, search: SearchOpt = DEFAULT_SEARCH,
           n: Annotated[int, typer.Option("--n", min=1, help="How many plans to sample.")],
           seed: SeedOpt, out: Annotated[Path, typer.Option("--out", help="config_runs Parquet to write.")],
           conf: ConfOpt = None) -> None:
    """Measure N random valid plans; write config_runs Parquet atomically."""
    df = sample_plans(*load_specs(cluster, model, search, conf), n=n, seed=seed, conf_root=conf)
    atomic_write_parquet(df, out)
    typer.echo(f"wrote {len(df)} config_runs ({int(df.oom.sum())} OOM) to {out}")
