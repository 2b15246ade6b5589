"""`memx simulate`: run a stage or a plan on the virtual cluster, or sample measured plans.

    memx simulate stage [STAGE.json]                 stage signature JSON (stdin when no file) → JSON
    memx simulate plan [PLAN.json ...] [--cluster C] [--model M] [--conf DIR] [--seed S] [--runs FILE]
                     PLAN.json: a `memx plan --format json` / `--out` plan.json, or a bare plan, schema 1 or 2
                     (docs/architecture.md §Plan JSON); cluster and model default to the ones the plan names.
                     One plan: its run as a JSON object; several: a JSON list. --runs writes the runs as
                     config_runs (Parquet, or JSONL for .jsonl) for `memx evaluate --measured`. A schema-2
                     plan's per-group lines and the cross-group exchange also go to stderr.
    memx simulate sample --cluster C --model M [--search S] --n N --seed S --out runs.parquet [--conf DIR]

Bad input: InputError naming the field (one message on stderr, exit code 2), nothing written.
The simulator is the ground truth: nothing here imports memx.planner (docs/architecture.md §Layers).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from memx.cli.options import DEFAULT_SEARCH, ClusterOpt, ConfOpt, ModelOpt, SearchOpt, SeedOpt, load_specs, sub_app
from memx.domain.errors import InputError
from memx.domain.groups import (AnyPlan, GroupedPlan, any_plan_from_dict, any_plan_to_dict, group_plans,
                                validate_any_plan)
from memx.domain.io import atomic_write_parquet, atomic_write_text
from memx.domain.plan import json_document
from memx.report.notation import group_line

if TYPE_CHECKING:
    from memx.simulator.schedule import PlanRun

# The simulator and the records (numpy, pandas) are imported inside the commands: `memx --help` stays light.

simulate_app = sub_app("The virtual cluster: run stages and plans, sample measured plans.")


def _read_input(path: Optional[Path], what: str) -> str:
    if path is None:
        return sys.stdin.read()
    if not path.is_file():
        raise InputError(f"{path}: no such {what} file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a UTF-8 text file ({what} JSON expected)") from exc


def read_plan(text: str, source: str) -> AnyPlan:
    """A plan of either schema from `memx plan`'s answer (its "plan" field) or from a bare plan JSON."""
    data = json_document(text, source)
    if isinstance(data, dict) and isinstance(data.get("plan"), dict):
        data = data["plan"]
    return any_plan_from_dict(data, source=source)


def _plain(v: Any) -> Any:
    import numpy as np

    return v.item() if isinstance(v, np.generic) else str(v)


def _json_out(data: dict[str, Any]) -> None:
    typer.echo(json.dumps(data, indent=2, default=_plain))


@simulate_app.command()
def stage(file: Annotated[Optional[Path], typer.Argument(help="stage signature JSON (default: stdin)")] = None,
          seed: SeedOpt = 0, conf: ConfOpt = None) -> None:
    """Run one stage alone on tp GPUs: time_ms, peak_mem_mib, static_mem_mib, status, reason."""
    import numpy as np

    from memx.domain.catalog import load_gpu
    from memx.simulator.stage import measure_stage, signature_from_dict
    from memx.simulator.traits import load_traits

    sig = signature_from_dict(json_document(_read_input(file, "stage"), "stage"))
    run = measure_stage(sig, load_gpu(sig.gpu, conf), load_traits(sig.gpu, conf), rng=np.random.default_rng(seed))
    _json_out({**sig.to_dict(), **dataclasses.asdict(run), "backend": "simulated", "seed": seed})


def _groups_summary(p: GroupedPlan, run: PlanRun) -> dict[str, Any]:
    """Per group: its share, its own iteration and its GPUs' largest peak (schema 2 only)."""
    out, first = [], 0
    for g, (grp, gp) in enumerate(zip(p.groups, group_plans(p))):
        n = gp.dp * sum(st.tp for st in gp.stages)
        peaks = run.demand_mem_mib[first:first + n]
        first += n
        out.append({"group": g, "samples": grp.samples, "gpus": n, "max_mem_mib": max(peaks),
                    "iteration_time_ms": run.group_iteration_ms[g] if run.group_iteration_ms else None})
    return {"groups": out, "cross_sync_ms": run.cross_sync_ms}


def _echo_groups(p: GroupedPlan, summary: dict[str, Any], source: str) -> None:
    data = any_plan_to_dict(p)
    for g in summary["groups"]:
        t = g["iteration_time_ms"]
        typer.echo(f"{source}: {group_line(data, g['group'])}: "
                   + (f"{t:,.1f} ms alone" if t is not None else "not run") + f", max memory {g['max_mem_mib'] / 1024:.1f} GiB",
                   err=True)
    typer.echo(f"{source}: cross-group gradient sync adds {summary['cross_sync_ms']:,.1f} ms", err=True)


@simulate_app.command()
def plan(files: Annotated[Optional[list[Path]], typer.Argument(help="plan JSON files: memx plan's answer or a bare plan, schema 1 or 2 (default: stdin)")] = None, *,
         cluster: Annotated[Optional[str], typer.Option("--cluster", help="Cluster name or YAML path (default: the plan's).")] = None,
         model: Annotated[Optional[str], typer.Option("--model", help="Model name or YAML path (default: the plan's).")] = None,
         seed: SeedOpt = 0, conf: ConfOpt = None,
         runs: Annotated[Optional[Path], typer.Option("--runs", help="Also write the runs as config_runs (.parquet, or .jsonl).")] = None) -> None:
    """Run one iteration of each plan: iteration_time_ms, per-GPU peak_mem_mib, oom, breakdown (schema 2: per group)."""
    from memx.domain.catalog import load_cluster, load_model
    from memx.domain.records import config_runs_frame, now_iso
    from memx.simulator.runs import config_run_row
    from memx.simulator.schedule import simulate_plan

    if runs is not None and runs.is_dir():
        raise InputError(f"--runs {runs}: is a folder; give a .parquet or .jsonl file")
    sources = [(_read_input(f, "plan"), str(f)) for f in files] if files else [(_read_input(None, "plan"), "plan")]
    plans = [read_plan(text, src) for text, src in sources]  # every file parsed before any run
    specs = [(load_cluster(cluster or p.cluster, conf), load_model(model or p.model, conf)) for p in plans]
    for p, (cl, mo), (_, src) in zip(plans, specs, sources):
        validate_any_plan(p, cl, mo, source=src)  # errors name the file; nothing runs before all are valid
    outs, rows, stamp = [], [], now_iso()
    for p, (cl, mo), (_, src) in zip(plans, specs, sources):
        run = simulate_plan(p, cl, mo, seed=seed, conf_root=conf)
        out = {**dataclasses.asdict(run), "seed": seed}
        if isinstance(p, GroupedPlan):
            out.update(_groups_summary(p, run))
            _echo_groups(p, out, src)
        outs.append(out)
        rows.append(config_run_row(p, run, seed=seed, measured_at=stamp))
    if runs is not None:
        if runs.suffix in (".jsonl", ".ndjson"):  # one exact JSON object per row (pandas would round floats)
            atomic_write_text(runs, "".join(json.dumps(r, default=_plain) + "\n" for r in rows))
        else:
            atomic_write_parquet(config_runs_frame(rows), runs)
        typer.echo(f"wrote {len(rows)} config_runs ({sum(r['oom'] for r in rows)} OOM) to {runs}", err=True)
    _json_out(outs[0] if len(outs) == 1 else outs)  # type: ignore[arg-type]


@simulate_app.command()
def sample(*, cluster: ClusterOpt, model: ModelOpt, search: SearchOpt = DEFAULT_SEARCH,
           n: Annotated[int, typer.Option("--n", min=1, help="How many plans to sample.")],
           seed: SeedOpt, out: Annotated[Path, typer.Option("--out", help="config_runs Parquet to write.")],
           conf: ConfOpt = None) -> None:
    """Measure N random valid plans; write config_runs Parquet atomically."""
    from memx.simulator.sample import sample_plans

    df = sample_plans(*load_specs(cluster, model, search, conf), n=n, seed=seed, conf_root=conf)
    atomic_write_parquet(df, out)
    typer.echo(f"wrote {len(df)} config_runs ({int(df.oom.sum())} OOM) to {out}")
