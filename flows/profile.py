"""profile flow: one versioned `stage_runs` artifact per GPU type; types already profiled are reused."""

from __future__ import annotations

from prefect import flow, task

from flows.common import STEP_RETRIES, conf_path, load_specs, store
from memx.pipeline import steps


@task(**STEP_RETRIES)
def profile_gpu(store_uri, cl, gpu, mo, sp, backend, seed, conf, options, refresh_token):
    return steps.profile_one(store(store_uri), cl, gpu, mo, sp, backend=backend, seed=seed, conf_root=conf_path(conf),
                             options=options, refresh_token=refresh_token)


@flow(name="memx-profile", log_prints=True)
def profile_flow(cluster: str = "three-vendor-20", model: str = "llama2-7b", search: str = "default",
                 conf: str | None = None, backend: str = "simulated", seed: int = 0, store: str | None = None,
                 refresh: list[str] | None = None, refresh_token: str = "",
                 options: dict | None = None) -> dict[str, str]:
    """{gpu: profile version}. GPU types in `refresh` are re-profiled under `refresh_token`.
    `options`: backend options passed to memx.profiling.profile (command, records, jobs, timeout_s …)."""
    cl, mo, sp = load_specs(cluster, model, search, conf)
    out = {}
    for g in cl.gpu_types:  # the loop of memx.pipeline.steps.profile_all, one task per GPU type
        token = refresh_token if g.name in (refresh or []) else None
        run = profile_gpu(store, cl, g.name, mo, sp, backend, seed, conf, dict(options or {}), token)
        print(run.line())
        out[g.name] = run.version
    return out
