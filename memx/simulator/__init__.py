"""The virtual cluster: an event-driven simulator of (heterogeneous) GPU training.

Ground truth for the `simulated` profiling backend and for accuracy tests. It has its own physics
(memx/simulator/physics.py) and its own per-GPU traits (conf/simulator/*.yaml) and must not import the
planner's cost model (memx.planner.cost, memx.planner.schedule, memx.planner.recompute, memx.planner.search, memx.planner.objective).
See docs/simulator.md.
"""

from memx.simulator.runs import (
    CONFIG_RUN_COLUMNS,
    STAGE_RUN_COLUMNS,
    config_runs_frame,
    measure_stage_rows,
    measure_stages,
    stage_runs_frame,
)
from memx.simulator.sample import draw_plans, sample_plans
from memx.simulator.schedule import PlanRun, run_1f1b, simulate_plan, stage_signatures
from memx.simulator.stage import (
    StageCost,
    StageRun,
    StageSignature,
    measure_stage,
    signature_from_dict,
    stage_cost,
)
from memx.simulator.traits import GpuTraits, load_traits

__all__ = [
    "CONFIG_RUN_COLUMNS", "STAGE_RUN_COLUMNS", "GpuTraits", "PlanRun", "StageCost", "StageRun",
    "StageSignature", "config_runs_frame", "draw_plans", "load_traits", "measure_stage", "measure_stage_rows",
    "measure_stages",
    "run_1f1b", "sample_plans", "signature_from_dict", "simulate_plan", "stage_cost", "stage_runs_frame",
    "stage_signatures",
]
