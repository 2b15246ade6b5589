"""The profiler covers the model variants an opt-in search trains (issue #14: heads / query groups /
sequence length options): the learned predictor must not extrapolate to their shapes."""

from __future__ import annotations

import dataclasses

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.profiling import profile


def test_profile_covers_every_variant_and_nothing_more_without_options():
    cluster, model = load_cluster("xy-2"), load_model("llama-6l")
    space = dataclasses.replace(load_search("small"), heads_options=(32, 16), seq_len_options=(1024, 2048))
    plain = profile(cluster, model, load_search("small"), backend="simulated", seed=0)
    opted = profile(cluster, model, space, backend="simulated", seed=0)
    ok = opted.stage_runs[opted.stage_runs.status == "ok"]
    shapes = set(zip(ok.heads.astype(int), ok.query_groups.astype(int), ok.seq_len.astype(int)))
    # every variant of the search space has measured rows on every GPU type
    for heads in (16, 32):
        for seq in (1024, 2048):
            assert (heads, heads, seq) in shapes
            for gpu in {g.name for g in cluster.gpu_types}:
                assert ((ok.gpu == gpu) & (ok.heads == heads) & (ok.seq_len == seq)).any(), (gpu, heads, seq)
    base = plain.stage_runs
    assert set(base.heads.astype(int)) == {32}  # the job as given only (its sweeps vary seq_len, not heads)
    assert (ok.heads == 16).sum() >= 3 * len(cluster.gpu_types)  # a grid per GPU type, not one point
    assert opted.runs > plain.runs
