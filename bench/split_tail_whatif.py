"""What-if for issue #27: the drained tail split as Megatron-LM's gradient-norm barrier makes it,
max_s (g_s − D_s) + max_s o_s (g: DP step + step-level collectives, o: optimizer step), against the one-tail term
max_s (tail_s − D_s) that `pipeline_assembly: cycle-mean-drain`, the default, uses (memx.planner.drain).

  PYTHONPATH=. .venv/bin/python bench/split_tail_whatif.py bench/assembly_as.py cycle-mean-drain bench/context_parallel.py --cases-only
  PYTHONPATH=. .venv/bin/python bench/split_tail_whatif.py bench/closed_form_accuracy.py --plans 100 --options --assembly cycle-mean-drain

Runs the given bench script with memx.planner.schedule.Pipeline's single-plan path (tail_ms, then assemble: what
estimate_plans calls) replaced by the split term on plain-1F1B drained pipelines; nothing else changes, so the
figures compare with the same command without this wrapper. The search's tables are not touched: a what-if on
scoring, not a planner option.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.planner import schedule  # noqa: E402


def patch() -> None:
    """Pipeline.tail_ms keeps each stage's optimizer part; Pipeline.assemble splits the drained tail with it."""
    tail_of, assemble_of = schedule.Pipeline.tail_ms, schedule.Pipeline.assemble

    def tail_ms(self, static_mib, params_per_rank):
        k = self.tail_key()
        opt = schedule.optimizer_ms(static_mib, np.asarray(self.memory_bandwidth_gbps)[:, None], k.distributed_optimizer,
                                    k.dp, k.precision) * k.comm_scale
        object.__setattr__(self, "_optimizer_ms", opt)  # frozen dataclass: the what-if's own slot
        return tail_of(self, static_mib, params_per_rank)

    def assemble(self, stage_ms, stage_mib, tail):
        opt = getattr(self, "_optimizer_ms", None)
        if self.virtual_stages > 1 or not schedule.drains(self.assembly) or opt is None or opt.shape != tail.shape:
            return assemble_of(self, stage_ms, stage_mib, tail)
        T = schedule.iteration_time_ms(stage_ms, self.micro_batches, self.fixed_ms, tail - opt,
                                       self.loop_ms(stage_ms.dtype), drain=True) + opt.max(axis=0)
        return T, schedule.memory_stats(stage_mib, self.gpu_weight, self.capacity_mib)

    schedule.Pipeline.tail_ms, schedule.Pipeline.assemble = tail_ms, assemble


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: split_tail_whatif.py BENCH.py [ARGS...]")
    patch()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
