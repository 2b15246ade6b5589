"""Tied input/output embeddings (issue #23): a stage holding both ends (pp = 1) keeps ONE vocab × hidden weight, as
Megatron-LM does (GPTModel's output layer: skip_weight_param_allocation = pre_process and
share_embeddings_and_output_weights); with pp > 1 the last stage keeps its own copy, as an untied output layer would.
The closed form, the records, the learned features, the cache and the virtual cluster, each on its own."""

from __future__ import annotations

import numpy as np
import pytest

from memx.domain.catalog import load_gpu, load_model
from memx.domain.records import signature_key, stage_run_row, stage_runs_frame
from memx.learn.cache import signature_keys
from memx.learn.features import signature_arrays, static_basis
from memx.planner.cost import MIB, AnalyticStageModel, embedding_params, layer_params, stage_params_per_rank
from memx.planner.signatures import signature_columns
from memx.planner.tables import stage_contexts
from memx.profiling.megatron_logs import point_from_args
from memx.simulator import load_traits, signature_from_dict, stage_cost
from memx.simulator.cross_sync import _unit_params
from memx.simulator.schedule import stage_signatures

GPT = dict(hidden=1024, ffn_hidden=4096, heads=16, query_groups=16, vocab=50304, mlp="gelu")
ROW = dict(gpu="a100-80g", tp=2, layers=4, micro_batch=1, seq_len=1024, recompute="none", recompute_layers=None,
           first=True, last=True, inflight=1, **GPT)
EMB = 50304 * 1024  # vocab × hidden


@pytest.mark.parametrize("first,last,tied,embeddings", [
    (True, True, True, 1),     # pp = 1, tied: one weight (Megatron-LM allocates no output weight)
    (True, True, False, 2),    # pp = 1, untied: embedding + output layer
    (True, False, True, 1),    # pp > 1, first stage: the embedding
    (False, True, True, 1),    # pp > 1, last stage: its own copy of the tied weight
    (False, True, False, 1),   # pp > 1, last stage, untied: the output layer
    (False, False, True, 0),   # a middle stage holds neither
])
def test_stage_params_count_the_embedding_weights_a_stage_holds(first, last, tied, embeddings):
    h, L, tp = GPT["hidden"], 4, 2
    per_layer = float(layer_params(h, GPT["ffn_hidden"], GPT["heads"], GPT["query_groups"], GPT["mlp"]))
    want = (L * per_layer + embeddings * EMB + last * h) / tp  # + the final norm on the last stage
    got = stage_params_per_rank(L, tp, first, last, h, GPT["ffn_hidden"], GPT["heads"], GPT["query_groups"],
                                GPT["vocab"], GPT["mlp"], tied=tied)
    assert float(got) == pytest.approx(want, rel=1e-12)


def test_tied_flag_is_per_row():
    args = (np.array([4, 4]), 1, np.array([True, True]), np.array([True, True]), 1024, 4096, 16, 16, 50304, "gelu")
    got = stage_params_per_rank(*args, tied=np.array([True, False]))
    assert got[1] - got[0] == pytest.approx(float(embedding_params(1024, 50304)))


def test_signature_columns_carry_the_flag_on_end_stages_only():
    gpt2, llama = load_model("gpt2-1024"), load_model("llama2-7b")
    for model, tied in ((gpt2, True), (llama, False)):
        ctxs = [*stage_contexts(["a100-80g"] * 3, (1, 1, 1), micro_batch=1, micro_batches=4),
                *stage_contexts(["a100-80g"], (1,), micro_batch=1, micro_batches=4)]  # pp 3 and pp 1
        cols = signature_columns(ctxs, np.ones(len(ctxs), np.int64), np.zeros(len(ctxs), np.int64),
                                 np.arange(len(ctxs)), model, model.seq_len)
        ends = cols["first"] | cols["last"]
        assert (cols["tied_embeddings"] == (ends & tied)).all() and ends.any() and (~ends).any()


def _static(row: dict) -> float:
    model = AnalyticStageModel(gpus={"a100-80g": load_gpu("a100-80g")})
    return float(model.predict_columns({k: np.array([v]) for k, v in row.items()})["static_mem_mib"][0])


@pytest.mark.parametrize("first,last,saved", [(True, True, True), (False, True, False), (True, False, False)])
def test_closed_form_static_memory(first, last, saved):
    row = {**ROW, "recompute_layers": np.nan, "first": first, "last": last}
    drop = _static(row) - _static({**row, "tied_embeddings": True})
    assert drop == pytest.approx(EMB / 2 * 18 / MIB if saved else 0.0, abs=1e-9)  # tp 2, 18 B/param (bf16 Adam)


def test_records_default_untied_and_keep_keys_of_older_rows():
    middle = {**ROW, "first": False, "last": False}
    assert not stage_runs_frame([ROW]).tied_embeddings[0]  # a row from before the column: untied
    assert signature_key(ROW) == signature_key({**ROW, "tied_embeddings": False})
    assert signature_key(middle) == signature_key({**middle, "tied_embeddings": True})  # no-op: canonical false
    assert signature_key(ROW) != signature_key({**ROW, "tied_embeddings": True})
    row = stage_run_row({**middle, "tied_embeddings": True}, status="ok", backend="simulated")
    assert row["tied_embeddings"] is False


def test_learned_static_basis_and_cache_key():
    df = stage_runs_frame([ROW, {**ROW, "tied_embeddings": True}])
    basis = static_basis(signature_arrays(df))
    assert basis[0] - basis[1] == pytest.approx(EMB / 2 * 18 / MIB)
    old = df.drop(columns="tied_embeddings")  # a frame from before the column hashes as it always did
    keys, old_keys = signature_keys(df, "v1"), signature_keys(old, "v1")
    assert keys[0] == old_keys[0] and keys[1] != keys[0]


def test_profile_points_carry_the_model_flag_on_end_stages():
    from memx.profiling.design import point

    gpt2 = load_model("gpt2-1024")
    kw = dict(tp=1, layers=2, micro_batch=1, seq_len=1024, source="t")
    assert point("a100-80g", gpt2, first=True, last=True, **kw)["tied_embeddings"] is True
    assert point("a100-80g", gpt2, **kw)["tied_embeddings"] is False
    assert point("a100-80g", load_model("llama2-7b"), first=True, last=True, **kw)["tied_embeddings"] is False


def test_megatron_log_arguments_say_whether_tied():
    base = {"tensor_model_parallel_size": "1", "num_layers": "2", "micro_batch_size": "1"}
    assert point_from_args({**base, "untie_embeddings_and_output_weights": "False"})["tied_embeddings"] is True
    assert point_from_args({**base, "untie_embeddings_and_output_weights": "True"})["tied_embeddings"] is False
    assert "tied_embeddings" not in point_from_args(base)


# ---------------------------------------------------------------- the virtual cluster, against a hand count


def _sim_params(**over) -> float:
    sig = signature_from_dict({**ROW, **over})
    return stage_cost(sig, load_gpu("a100-80g"), load_traits("a100-80g")).params


def test_simulator_holds_one_weight_on_a_tied_single_stage():
    # by hand, per GPU of tp 2, layers 0: embedding 50304·1024/2 + learned positions 1024·1024 (GPT: GELU);
    # output layer 50304·1024/2 + final norm 1024 — without its weight when tied
    embedding, output_weight, norm = 50304 * 1024 / 2 + 1024 * 1024, 50304 * 1024 / 2, 1024
    assert _sim_params(layers=0) == embedding + output_weight + norm
    assert _sim_params(layers=0, tied_embeddings=True) == embedding + norm
    assert _sim_params(layers=0, first=False, tied_embeddings=True) == output_weight + norm  # pp > 1: its copy
    assert _sim_params(layers=4) - _sim_params(layers=4, tied_embeddings=True) == output_weight


def test_simulator_and_closed_form_save_the_same_static_bytes():
    sig = signature_from_dict(ROW)
    gpu, traits = load_gpu("a100-80g"), load_traits("a100-80g")
    sim = stage_cost(sig, gpu, traits).static_mem_mib - stage_cost(
        signature_from_dict({**ROW, "tied_embeddings": True}), gpu, traits).static_mem_mib
    planner = _static({**ROW, "recompute_layers": np.nan}) - _static({**ROW, "recompute_layers": np.nan,
                                                                     "tied_embeddings": True})
    assert sim == pytest.approx(planner, rel=1e-12)


def test_simulator_plan_signatures_and_cross_group_units():
    from memx.domain.plan import Plan, Stage

    gpt2 = load_model("gpt2-1024")
    one = Plan(model=gpt2.name, cluster="c", global_batch=8, micro_batch=1, seq_len=1024, dp=1,
               stages=(Stage(gpu="a100-80g", tp=1, layers=gpt2.layers, recompute="none"),))
    three = Plan(model=gpt2.name, cluster="c", global_batch=8, micro_batch=1, seq_len=1024, dp=1,
                 stages=tuple(Stage(gpu="a100-80g", tp=1, layers=n, recompute="none") for n in (8, 8, 8)))
    assert [s.tied_embeddings for s in stage_signatures(three, gpt2)] == [True, False, True]
    assert [s.tied_embeddings for s in stage_signatures(three, load_model("llama2-7b"))] == [False] * 3
    # cross-group units: the output unit has no weight of its own only when every group is one stage deep
    assert _unit_params(gpt2, [one, one])[-1] == gpt2.hidden
    assert _unit_params(gpt2, [one, three])[-1] == gpt2.vocab * gpt2.hidden + gpt2.hidden
    assert _unit_params(load_model("llama2-7b"), [one])[-1] > gpt2.hidden


def test_embedding_communicator_only_where_the_two_copies_are_reduced():
    from memx.domain.runtime import load_runtime

    model = AnalyticStageModel(gpus={"a100-80g": load_gpu("a100-80g")}, runtime="catalog")
    coll = load_runtime("a100-80g", "nvidia").collective_comm_mib

    def peak(**over):
        row = {**ROW, "recompute_layers": np.nan, **over}
        return float(model.predict_columns({k: np.array([v]) for k, v in row.items()})["peak_mem_mib"][0])

    last = dict(first=False, last=True)  # pp > 1: the last stage's copy is all-reduced with stage 0's
    assert peak(**last, tied_embeddings=True) - peak(**last) == pytest.approx(coll)
    assert peak(tied_embeddings=True) < peak()  # pp = 1: one weight, no embedding group collective
