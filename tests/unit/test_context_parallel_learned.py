"""The learned predictor and context parallelism (issue #27): a cp rank's stage is a stage of s/cp tokens, a
sequence length the profiles (taken at s only) may not have (the profiling design sweeps seq_len around s,
memx.profiling.design, so s/2 is usually covered; s/4, s/8 are not) — predicted at the profiled length × the closed form's ratio
(memx.learn.transfer.seq_len_transfer), the ring's terms added by the closed form; the prediction cache keys on
the rank's signature and the predictor's version carries what it saw. Scored against the virtual cluster."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.learn import fit_predictor
from memx.learn.model import from_json
from memx.planner.estimate import estimate_plans
from memx.profiling import profile
from memx.simulator import draw_plans, simulate_plan


@pytest.mark.slow
def test_learned_predictor_transfers_the_ranks_sequence_length():
    cl, mo = load_cluster("h100-h20-16"), dataclasses.replace(load_model("llama-6l"), seq_len=8192)
    sp = dataclasses.replace(load_search("small"), global_batch=16)
    runs = profile(cl, mo, sp, backend="simulated", seed=0).stage_runs
    runs = runs[runs["seq_len"] == 8192]  # profiles at the job's length only (the design also sweeps it)
    pred = fit_predictor(runs, {g.name: g for g in cl.gpu_types}, seed=0)
    assert set(pred.seq_len_seen.values()) == {(8192,)}
    again = from_json(pred.to_json(), pred.booster)
    assert again.seq_len_seen == pred.seq_len_seen and again.version == pred.version
    plans = [dataclasses.replace(p, dp=p.dp // 2, global_batch=p.global_batch // 2, context_parallel=2, idle_gpus=None)
             for p in draw_plans(cl, mo, sp, n=60, seed=2) if p.dp % 2 == 0][:20]
    runs = [simulate_plan(p, cl, mo, seed=i) for i, p in enumerate(plans)]
    ok = [i for i, r in enumerate(runs) if not r.oom]
    assert len(ok) >= 5

    def mape(predictor):
        est = estimate_plans(plans, cl, mo, predictor)
        return np.mean([abs(est[i].iteration_time_ms / runs[i].iteration_time_ms - 1) for i in ok])

    transferred, extrapolated = mape(pred), mape(dataclasses.replace(pred, seq_len_seen={}))
    print("transferred", transferred, "extrapolated", extrapolated)
    assert transferred < 0.15 and transferred <= extrapolated + 0.01


def test_seq_len_transfer_is_the_profiled_prediction_times_the_closed_form_ratio():
    """Fast check of the transfer's formula with a stand-in predictor (the closed form × 1.1 at any length)."""
    import pandas as pd

    from memx.learn.transfer import seen_value, seq_len_transfer
    from memx.planner.cost import AnalyticStageModel
    from memx.planner.signatures import SIGNATURE_COLUMNS
    from memx.simulator import stage_signatures

    cl, mo = load_cluster("h100-h20-16"), load_model("llama3-8b")
    plan = draw_plans(cl, mo, load_search("small"), n=1, seed=0)[0]
    sigs = pd.DataFrame([s.to_dict() for s in stage_signatures(plan, mo)]).loc[:, list(SIGNATURE_COLUMNS)]
    cf = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})

    class Stand:
        gpus, runtime = cf.gpus, "catalog"
        seq_len_seen = {g: (int(sigs["seq_len"][0]),) for g in sigs["gpu"]}

        def predict(self, s):
            return cf.predict(s) * 1.1

    short = sigs.assign(seq_len=sigs["seq_len"] // 4)  # a cp-4 rank's share
    seen = seen_value(Stand.seq_len_seen, short, "seq_len")
    assert (seen == sigs["seq_len"].to_numpy()).all()
    moved = np.ones(len(short), dtype=bool)
    out = seq_len_transfer(Stand(), short, cf.predict(short), seen, moved)
    want = cf.predict(short)
    assert np.allclose(out["time_ms"], 1.1 * want["time_ms"]) and np.allclose(out["peak_mem_mib"], 1.1 * want["peak_mem_mib"])
