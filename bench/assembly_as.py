"""Run another bench script with every 1F1B assembly set to one `pipeline_assembly` (issues #22, #27): for the
benches that take no --assembly flag, so their figures can be compared paper vs cycle-mean side by side.

  PYTHONPATH=. .venv/bin/python bench/assembly_as.py cycle-mean bench/context_parallel.py --cases-only

Every path picks its assembly through memx.planner.schedule.assembly_of (the search with the space's field,
estimate_plans and the per-stage-dp closed form with the predictor's); this replaces it, in each module that
imported it, by one that ignores the caller's choice and returns the given assembly — nothing else changes.
"""

from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.specs import PIPELINE_ASSEMBLIES  # noqa: E402
from memx.planner import estimate, schedule, search, stage_dp_search  # noqa: E402


def force(name: str) -> None:
    """Every assembly_of call returns its predictor's assembly with pipeline_assembly `name`."""
    original = schedule.assembly_of

    def forced(predictor, pipeline_assembly=None):
        return dataclasses.replace(original(predictor), pipeline_assembly=name)

    for module in (schedule, estimate, search, stage_dp_search):
        module.assembly_of = forced


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in PIPELINE_ASSEMBLIES:
        sys.exit(f"usage: assembly_as.py {{{'|'.join(PIPELINE_ASSEMBLIES)}}} BENCH.py [ARGS...]")
    name, script = sys.argv[1], sys.argv[2]
    force(name)
    sys.argv = [script, *sys.argv[3:]]
    print(f"pipeline_assembly: {name} (forced by bench/assembly_as.py)", flush=True)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
