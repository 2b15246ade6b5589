"""Start-up budget (issue #26): `memx --help` and the analytic `memx plan` import none of the heavy stacks.

`python -X importtime` lists every module a process imports (CPython docs, "-X importtime"); the heavy
stacks — pandas, scipy, XGBoost, MLflow, Prefect, matplotlib and what they pull in, the learned predictor,
the pipeline, the profiler — are loaded inside the commands that use them (memx/cli/*). One subprocess per
command line; the plan is a small one (xy-2, llama-6l, search small), so the check costs about a second each.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

HEAVY = ("pandas", "scipy", "xgboost", "mlflow", "prefect", "prefect_dask", "dask", "distributed", "matplotlib",
         "optuna", "pyarrow", "boto3", "sklearn", "flows", "memx.learn", "memx.pipeline", "memx.profiling",
         "memx.experiments", "memx.simulator")
SMALL_PLAN = ("plan", "--predictor", "analytic", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small",
              "--top", "3", "--no-progress")


def imported_modules(args: tuple[str, ...], home) -> set[str]:
    """The modules `memx ARGS` imports (every `import time:` line of -X importtime on stderr)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "memx.cli.app", *args], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "MEMX_HOME": str(home)})
    assert r.returncode == 0, r.stderr[-2000:]
    return {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [("--help",), SMALL_PLAN], ids=["help", "plan"])
def test_light_commands_import_no_heavy_stack(args, tmp_path):
    mods = imported_modules(args, tmp_path)
    assert "memx.cli.plan" in mods  # the listing is real: the commands were imported
    assert heavy(mods) == []


def test_a_json_plan_draws_nothing_with_rich_and_validates_nothing_with_pydantic(tmp_path):
    """rich is imported where a table or a progress bar is drawn (memx.cli.progress, memx.report.table), not for
    the JSON a script reads (issue #26, session 3: ~0.02 CPU s of every `memx plan --format json`). From the second
    run on (the catalog entries cached: memx.domain.spec_cache) pydantic is not imported at all: typer's parameter
    adapters are replaced where the conversion is certain (memx.cli.coercion), and the catalog imports pydantic
    only to validate (issue #26, session 4: ≈ 0.1 CPU s); PyYAML neither (the parsed texts are cached:
    spec_cache.parsed_yaml); and no other command's module is imported."""
    args = (*SMALL_PLAN, "--format", "json")
    first = imported_modules(args, tmp_path)
    assert "pydantic" in first  # the first run validated the catalog entries (the listing is real)
    mods = imported_modules(args, tmp_path)
    assert "memx.report.table" in mods and not any(m == "rich" or m.startswith("rich.") for m in mods)
    assert heavy(mods) == [] and not [m for m in mods if m.split(".")[0] in ("pydantic", "pydantic_core")]
    assert "typer._adapters" not in mods and "yaml" not in mods  # the parsed catalog texts are cached too
    assert "numpy.ma" not in mods  # the medians' own quantiles (memx.planner.medians; issue #26, session 6)
    # `memx plan` mounts only plan (memx.cli.app.main): no other command module, no report it does not write
    others = ("memx.cli.inspect", "memx.cli.simulate", "memx.cli.learn", "memx.cli.profile", "memx.cli.artifacts",
              "memx.cli.catalog", "memx.cli.ui", "memx.cli.experiments", "memx.report.check", "memx.report.megatron")
    assert [m for m in others if m in mods] == []



def _columns():
    from memx.domain.catalog import load_cluster, load_model
    from memx.planner.signatures import signature_columns
    from memx.planner.tables import stage_contexts

    cl, mo = load_cluster("three-vendor-20"), load_model("llama2-7b")
    ctx = stage_contexts([g.name for g in cl.gpu_types][:2], [2, 1], micro_batch=1, micro_batches=8,
                         distributed_optimizer=True, dp=2, sequence_parallel=True)
    layers, codes = np.array([4, 4, 8, 8]), np.array([-2, 2, -1, 8])  # none, block 2, selective, full
    return cl, signature_columns(list(ctx), layers, codes, np.array([0, 0, 1, 1]), mo, 4096)


def test_the_column_path_gives_the_frame_path_numbers():
    """The analytic plan predicts from numpy columns (no pandas); `predict` on the DataFrame gives the same."""
    from memx.planner.cost import AnalyticStageModel
    from memx.planner.signatures import PREDICTION_COLUMNS, columns_frame, predict_arrays

    cl, cols = _columns()
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    by_columns, by_frame = predict_arrays(pred, cols), pred.predict(columns_frame(cols))
    for c in PREDICTION_COLUMNS:
        np.testing.assert_array_equal(by_columns[c], by_frame[c].to_numpy())


def test_a_wrapper_that_hands_on_its_base_attributes_is_not_bypassed():
    """Like memx.learn.calibration's and memx.learn.cache's wrappers: `predict_columns` of the base is
    reachable through `__getattr__`, but the wrapper's own `predict` must be what runs."""
    from memx.planner.cost import AnalyticStageModel
    from memx.planner.signatures import predict_arrays

    class Doubled:
        def __init__(self, base):
            self.base = base

        def __getattr__(self, attr):
            return getattr(self.base, attr)

        def predict(self, sigs):
            out = self.base.predict(sigs)
            return out.assign(time_ms=2 * out["time_ms"])

    cl, cols = _columns()
    base = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    np.testing.assert_allclose(predict_arrays(Doubled(base), cols)["time_ms"], 2 * predict_arrays(base, cols)["time_ms"])
