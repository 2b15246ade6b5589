"""Start-up and analytic-plan cost of whole `memx` processes (issue #26), against `python -c "import numpy"`
measured in the same run.

CPU s = user + system time of the child process (resource.getrusage(RUSAGE_CHILDREN) deltas), the
minimum over --repeat runs; wall s beside it. Bytecode goes to a temporary PYTHONPYCACHEPREFIX and one
warm-up run compiles it first (an installed package ships its .pyc: compiling is not start-up). MEMX_HOME
is a temporary folder, shared by the runs: from the warm-up (every command once) on, the validated catalog entries
are read from its cache (memx.domain.spec_cache) and the closed form's stage tables from its table cache
(memx.planner.table_cache), as on a user's second and later runs of a problem; --cold gives every run an empty one (the
first run after a catalog or MemX change); --fresh-tables keeps the catalog entries but removes the closed form's
cached stage tables (memx.planner.table_cache, `$MEMX_HOME/cache/tables`) before every run: the first plan of a
new problem; --first-runs runs every plan command both ways in one run (`NAME` with the cached tables beside
`NAME-first` without, interleaved: the same load; the -first runs have a MEMX_HOME of their own). Commands:
  numpy       python -c "import numpy"                                   (the baseline)
  help        memx --help
  peer        memx plan --predictor analytic --cluster a100-v100-16 --format json   (4 × A100-80G + 12 × V100-32G;
              llama2-7b, seq 4096, global batch 128, 25 GB/s)
  peer-4x4    the same GPUs as 4 nodes of 4 (a temporary cluster YAML)
  default     memx plan --predictor analytic --format json              (three-vendor-20, llama2-7b)
  replicas    peer with --search replicas (replica groups of whole nodes)
Last line: numpy_cpu_s=… help_cpu_s=… help_ratio=… peer_cpu_s=… peer4x4_cpu_s=… default_cpu_s=… replicas_cpu_s=…
replicas_ratio=… (replicas / peer).

--baseline DIR: the same commands with DIR (another checkout, e.g. `git worktree add ../base-perf f4d4b0d`) first
on PYTHONPATH, interleaved with this checkout's runs (same load); prints both, the ratio new / baseline, a
`baseline …` figures line, and whether every plan command's JSON is the same in both (timings and the count of
plans scored aside: the work done, not the answer).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEER_4X4 = """name: a100-v100-4x4
inter_node_bandwidth_gbps: 25
nodes:
  - {gpu: a100-80g, count: 4}
  - {gpu: v100-32g, count: 4}
  - {gpu: v100-32g, count: 4}
  - {gpu: v100-32g, count: 4}
"""


WORK_DONE = ("search_s", "timings", "predict_s", "scored", "discarded_by_bound")  # not part of the answer


def run(argv: list[str], env: dict[str, str], out: list | None = None, cold: bool = False,
        fresh_tables: bool = False) -> tuple[float, float]:
    """(CPU s, wall s) of one child process, run in the checkout first on env's PYTHONPATH (`python -m` puts
    the working folder first on sys.path); it must succeed. `out`: its stdout is appended. `cold`: an empty
    MEMX_HOME of its own. `fresh_tables`: no cached stage tables in its MEMX_HOME (removed by this process)."""
    if cold:
        with tempfile.TemporaryDirectory() as home:
            return run(argv, {**env, "MEMX_HOME": home}, out)
    if fresh_tables:
        shutil.rmtree(Path(env["MEMX_HOME"]) / "cache" / "tables", ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE if out is not None else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, cwd=env.get("PYTHONPATH"))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-1000:]}")
    if out is not None:
        out.append(done.stdout)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def answer(text: str):
    """A plan command's JSON without what measures the work done."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in WORK_DONE}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return strip(json.loads(text))


def first_home(env: dict[str, str]) -> dict[str, str]:
    """env with the MEMX_HOME of the -first runs (--first-runs): their catalog entries cached, their tables removed."""
    return {**env, "MEMX_HOME": env["MEMX_HOME"] + "-first"}


def figures(best: dict[str, tuple[float, float]]) -> dict[str, str]:
    fig = {f"{k.replace('-', '')}_cpu_s": f"{v[0]:.2f}" for k, v in best.items()}
    if "help" in best:
        fig["help_ratio"] = f"{best['help'][0] / best['numpy'][0]:.1f}"
    if "replicas" in best and "peer" in best:
        fig["replicas_ratio"] = f"{best['replicas'][0] / best['peer'][0]:.1f}"
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="run only these commands (names as in the docstring)")
    ap.add_argument("--baseline", type=Path, help="another checkout to run the same commands with, interleaved")
    ap.add_argument("--cold", action="store_true", help="every run with an empty MEMX_HOME (no cached catalog entries)")
    ap.add_argument("--fresh-tables", action="store_true",
                    help="every run without cached stage tables (the catalog entries still cached)")
    ap.add_argument("--first-runs", action="store_true",
                    help="each plan command also as NAME-first: without cached stage tables, in the same run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Path(tmp) / "a100-v100-4x4.yaml"
        cluster.write_text(PEER_4X4)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPYCACHEPREFIX=str(Path(tmp) / "pyc"), MEMX_HOME=str(Path(tmp) / "home"))
        here = str(Path(__file__).resolve().parents[1])
        envs = {"new": {**env, "PYTHONPATH": here}}
        if args.baseline is not None:
            envs["baseline"] = {**env, "PYTHONPATH": str(args.baseline.resolve()),
                                "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pyc-baseline")}
        memx = [sys.executable, "-m", "memx.cli.app"]
        plan = [*memx, "plan", "--predictor", "analytic", "--format", "json", "--no-progress"]
        commands = {
            "numpy": [sys.executable, "-c", "import numpy"],
            "help": [*memx, "--help"],
            "peer": [*plan, "--cluster", "a100-v100-16"],
            "peer-4x4": [*plan, "--cluster", str(cluster)],
            "default": plan,
            "replicas": [*plan, "--cluster", "a100-v100-16", "--search", "replicas"],
        }
        if args.only:
            commands = {k: v for k, v in commands.items() if k in args.only or k == "numpy"}
        if args.first_runs:
            commands = {**commands, **{f"{k}-first": v for k, v in commands.items() if k not in ("numpy", "help")}}
        for e in envs.values():  # warm-up: bytecode of every module on the plan path; each plan's cached tables
            run([*memx, "--help"], e)
            for name, argv in commands.items():
                if name not in ("numpy", "help"):
                    run(argv, first_home(e) if name.endswith("-first") else e)
        best: dict[str, dict[str, tuple[float, float]]] = {side: {} for side in envs}
        outputs: dict[str, dict[str, list]] = {side: {} for side in envs}
        for _ in range(args.repeat):
            for name, argv in commands.items():
                for side, e in envs.items():
                    out = outputs[side].setdefault(name, []) if name not in ("numpy", "help") else None
                    first = name.endswith("-first")
                    cpu, wall = run(argv, first_home(e) if first else e, out, cold=args.cold,
                                    fresh_tables=args.fresh_tables or first)
                    if name not in best[side] or cpu < best[side][name][0]:
                        best[side][name] = (cpu, wall)
        for name in commands:
            row = f"{name:<9}"
            for side in envs:
                cpu, wall = best[side][name]
                row += f" {side}: cpu_s={cpu:.2f} wall_s={wall:.2f} ×numpy={cpu / best[side]['numpy'][0]:.1f}"
            if "baseline" in envs:
                row += f"  new/baseline={best['new'][name][0] / best['baseline'][name][0]:.2f}"
            print(row)
        if "baseline" in envs:
            same = {name: all(answer(a) == answer(outputs["baseline"][name][0]) for a in outputs["new"][name])
                    for name in outputs["new"]}
            print("same answer as the baseline: " + " ".join(f"{k}={v}" for k, v in same.items()))
            print("baseline " + " ".join(f"{k}={v}" for k, v in figures(best["baseline"]).items()))
        print(" ".join(f"{k}={v}" for k, v in figures(best["new"]).items()))


if __name__ == "__main__":
    main()
