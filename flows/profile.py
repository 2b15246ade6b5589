"""profile flow: one versioned `stage_runs` artifact per GPU type; types already profiled are reused."""

from __future__ import annotations

from prefect import flow, task

from flows.common import load_specs, newest_with, save_stage
from memx.pipeline import steps as stages


@task(persist_result=False)
def measure(cluster, gpu, model, space, backend, seed, conf, options, key):
    from pathlib import Path

    return stages.compute_profile(cluster, gpu, model, space, backend=backend, seed=seed,
                                  conf_root=Path(conf) if conf else None, options=options, key=key)


@flow(name="memx-profile", log_prints=True)
def profile_flow(cluster: str = "three-vendor-20", model: str = "llama2-7b", search: str = "default",
                 conf: str | None = None, backend: str = "simulated", seed: int = 0, store: str | None = None,
                 refresh: list[str] | None = None, refresh_token: str = "",
                 options: dict | None = None) -> dict[str, str]:
    """{gpu: profile version}. GPU types in `refresh` are re-profiled under `refresh_token`.
    `options`: backend options passed to memx.profiling.profile (command, records, jobs, timeout_s …)."""
    cl, mo, sp = load_specs(cluster, model, search, conf)
    options = dict(options or {})
    out = {}
    for g in cl.gpu_types:
        key = stages.profile_key(cl, g.name, mo, sp, backend=backend, seed=seed, options=options)
        found = None if g.name in (refresh or []) else newest_with(store, "profile", key)
        if found is not None:
            out[g.name] = found[0]
            print(f"profile {g.name}: reused {found[0]}")
            continue
        version = stages.version_profile(key, refresh_token if g.name in (refresh or []) else "")
        result = measure(cl, g.name, mo, sp, backend, seed, conf, options, key)
        save_stage(store, "profile", version, result, {"cluster": cluster, "gpu": g.name, "backend": backend})
        out[g.name] = version
        print(f"profile {g.name}: measured {result.manifest['rows']} points → {version}")
    return out
