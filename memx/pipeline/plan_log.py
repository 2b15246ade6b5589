"""Each plan as an MLflow run (issue #17; docs/pipeline.md §MLflow): experiment ``memx-plans`` in the
tracking store of memx.pipeline.registry (default ``sqlite:///$MEMX_HOME/mlflow.db``), so that
`memx ui` compares plans across predictor versions and hardware changes.

- params: cluster, model, search, weights (the profile the search used), predictor (name and registry
  version), predictor_version (the predictor's content hash; empty for the closed form),
  fingerprint (GPU types, model structure, global batch: registry.fingerprint), gpu_types, global_batch,
  reused (a stored search served again).
- metrics of the picked plan: iteration_time_ms, max_mem_mib, mem_std_mib (√ of the memory variance
  across GPUs, Φ's V term: paper §4), min_margin, phi, search_s.
- artifacts: plan.json, plan.md, and whatever else the caller wrote (report.html, PNGs).
mlflow is imported inside the function: ``import memx`` stays light.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Mapping

from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.pipeline import registry

PLAN_EXPERIMENT = "memx-plans"


def plan_params(obj: dict, cluster: Cluster, model: ModelArch, space: SearchSpace,
                predictor_version: str | None = None) -> dict[str, str]:
    fp = registry.fingerprint(cluster, model, space.global_batch)
    return {"predictor_version": predictor_version or "", "cluster": cluster.name, "model": model.name, "search": space.name,
            "weights": str(obj.get("weights", {}).get("profile", "")), "predictor": str(obj.get("predictor", "")),
            "fingerprint": fp.fingerprint, "gpu_types": fp.gpu_types, "global_batch": str(space.global_batch),
            "reused": str("reused" in obj).lower()}


def plan_metrics(obj: dict) -> dict[str, float]:
    pred = obj["predicted"]
    metrics = {"iteration_time_ms": pred["iteration_time_ms"], "max_mem_mib": pred["max_mem_mib"],
               "mem_std_mib": pred["mem_variance_mib2"] ** 0.5, "min_margin": pred["min_margin"], "phi": pred["phi"]}
    if obj.get("search_s") is not None:
        metrics["search_s"] = obj["search_s"]
    return {k: float(v) for k, v in metrics.items()}


def log_plan(obj: dict, *, cluster: Cluster, model: ModelArch, space: SearchSpace, files: Mapping[str, str],
             paths: tuple[Path, ...] = (), predictor_version: str | None = None,
             tracking_uri: str | None = None) -> str:
    """One run in experiment memx-plans for the plan report `obj`; `files` are written as artifacts
    (name → text), `paths` logged as they are. Returns the run id."""
    import mlflow  # heavy (seconds): only when a plan is logged

    registry.setup(tracking_uri, experiment=PLAN_EXPERIMENT)
    params = plan_params(obj, cluster, model, space, predictor_version)
    name = f"{cluster.name}/{model.name} {params['predictor']}"
    with mlflow.start_run(run_name=name) as run, tempfile.TemporaryDirectory() as tmp:
        mlflow.log_params(params)
        mlflow.set_tags({"memx.kind": "plan", "memx.tracking_uri": registry.public_tracking_uri(tracking_uri)})
        mlflow.log_metrics(plan_metrics(obj))
        for fname, text in files.items():
            (Path(tmp) / fname).write_text(text, encoding="utf-8")
            mlflow.log_artifact(str(Path(tmp) / fname))
        for p in paths:
            mlflow.log_artifact(str(p))
        return run.info.run_id
