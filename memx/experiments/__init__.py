"""The paper's experiments (and the ones it could not run) on the virtual cluster, against the
re-implemented baselines (memx.planner.baselines). Each experiment is `run(out, scale=, seed=, predictor=)`
returning a `Result` (tables as DataFrames, files written, headline numbers). See docs/results.md.

    from memx.experiments import run_all, EXPERIMENTS
    results = run_all(Path("docs/results"), names=["deployment"], scale="small", seed=0)
"""

from __future__ import annotations

from pathlib import Path

from memx.experiments import deployment, prediction, robustness, scaling, search_cost, table1
from memx.experiments.common import Result

EXPERIMENTS = {"prediction": prediction.run, "search-cost": search_cost.run, "deployment": deployment.run,
               "table1": table1.run, "scaling": scaling.run, "robustness": robustness.run}


def run_all(out: Path, *, names=None, scale: str = "small", seed: int = 0, predictor: str | None = None) -> dict[str, Result]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {n: EXPERIMENTS[n](out, scale=scale, seed=seed, predictor=predictor) for n in (names or EXPERIMENTS)}


__all__ = ["EXPERIMENTS", "Result", "run_all"]
