"""Bad launcher input (issue #24): an unknown launcher, or a launcher with options it cannot run, exits 2 naming
the fields and the file, before any search; a plan the launcher cannot start exits 6 with the reason."""

from __future__ import annotations

import pytest

from tests.support.bad_plans import assert_bad_search

CASES = [
    ("unknown-launcher", "launcher: slurm\n", ("launcher", "'megatron'", "'flagscale'", "slurm")),
    ("megatron-replica-groups", "launcher: megatron\nmax_replica_groups: 2\n", ("max_replica_groups", "launcher: megatron")),
    ("flagscale-replica-groups", "launcher: flagscale\nmax_replica_groups: 2\n", ("max_replica_groups", "launcher: flagscale")),
    ("megatron-block-only", "launcher: megatron\nrecompute_levels: [block]\n", ("recompute_levels", "launcher: megatron")),
]


@pytest.mark.parametrize("case, extra, names", CASES, ids=[c[0] for c in CASES])
def test_bad_launcher_input_exits_2_naming_the_fields(case, extra, names, tmp_path):
    assert_bad_search(extra, names, tmp_path)


def test_a_plan_flagscale_cannot_run_exits_6_with_the_reason():
    from memx.cli.plan import Fmt, _emit
    from memx.domain.catalog import load_cluster, load_model
    from memx.domain.errors import NotLaunchable
    from memx.domain.groups import GroupedPlan, ReplicaGroup, any_plan_to_dict
    from memx.domain.plan import Stage

    grouped = GroupedPlan(model="llama-6l", cluster="xy-2", global_batch=16, seq_len=1024, groups=(
        ReplicaGroup(dp=1, micro_batch=1, micro_batches=8, stages=(Stage(gpu="vendor-x-32g", tp=1, layers=6),)),
        ReplicaGroup(dp=1, micro_batch=2, micro_batches=4, stages=(Stage(gpu="vendor-y-64g", tp=1, layers=6),))))
    with pytest.raises(NotLaunchable, match="FlagScale cannot run this plan: the plan's replica groups") as exc:
        _emit({"plan": any_plan_to_dict(grouped)}, load_model("llama-6l"), load_cluster("xy-2"), Fmt.flagscale, None)
    assert exc.value.exit_code == 6
