"""The two step-level collectives of issue #23 against hand calculations, in the closed form
(memx.planner.collectives, through the 1F1B assembly and the search) and, independently, in the virtual
cluster (memx.simulator.step_sync):

- the DP ring's latency, 2(n − 1)·α per collective (Patarasuk & Yuan 2009; NCCL's ring), one collective per
  model chunk (Megatron-LM DDP without --overlap-grad-reduce: one bucket per gradient buffer);
- the tied embedding's gradient all-reduce between the first and last stage at pp > 1 (Megatron-LM
  finalize_model_grads._allreduce_word_embedding_grads): vocab·hidden/tp main-grad bytes over a 2-rank ring,
  bytes / B + 2α.

Every test here fails on the code before issue #23 (which had neither term in the closed form, and neither
the embedding all-reduce nor the per-chunk collectives in the virtual cluster)."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_gpu, load_model
from memx.domain.plan import Plan, Stage
from memx.domain.precision import GRAD_BYTES
from memx.domain.specs import Cluster, Node
from memx.planner.collectives import dp_latency_ms, tail_collectives_ms
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.simulator import load_traits, simulate_plan
from memx.simulator.physics import GRAD_BYTES_OF
from memx.simulator.schedule import _prepare
from memx.simulator.stage import ADAM_STATIC_BYTES_PER_PARAM
from memx.domain.plan import place_plan

LAT, NIC = 0.05, 25.0  # ms per message through a NIC, GB/s per NIC


def _cluster(latency_ms: float = LAT, nodes: int = 4) -> Cluster:
    """`nodes` nodes of one A100 each: every ring hop and every stage boundary crosses a NIC."""
    return Cluster(name="a1x4", inter_node_bandwidth_gbps=NIC, inter_node_latency_ms=latency_ms,
                   nodes=(Node(gpu=load_gpu("a100-80g"), count=1),) * nodes,
                   nic_efficiency=1.0)  # line rate: the arithmetic below is the paper's B (memx.planner.network)


def _plan(dp: int, pp: int, **kw) -> Plan:
    layers = [6 // pp + (1 if s < 6 % pp else 0) for s in range(pp)]
    return Plan(model="llama-6l", cluster="a1x4", global_batch=16, micro_batch=1, seq_len=2048, dp=dp,
                stages=tuple(Stage(gpu="a100-80g", tp=1, layers=n) for n in layers), **kw)


@pytest.fixture(scope="module")
def env():
    model = load_model("llama-6l")
    return model, dataclasses.replace(model, tied_embeddings=True), AnalyticStageModel(gpus={"a100-80g": load_gpu("a100-80g")})


def test_closed_form_dp_step_pays_the_ring_latency(env):
    """pp 1, dp 4 over 4 nodes: the iteration grows by exactly 2·(4 − 1)·α with the NIC latency α (the stage
    time, memory and bandwidth part do not see the latency: no p2p at pp 1)."""
    model, _, pred = env
    plan = _plan(dp=4, pp=1)
    with_lat = estimate_plans([plan], _cluster(LAT), model, pred)[0]
    no_lat = estimate_plans([plan], _cluster(0.0), model, pred)[0]
    assert with_lat.iteration_time_ms - no_lat.iteration_time_ms == pytest.approx(2 * 3 * LAT, rel=1e-9)


def test_closed_form_tied_embedding_all_reduce_between_the_end_stages(env):
    """pp 2 on 2 nodes, dp 1: tied and untied cost the same stage time and static memory at pp > 1 (both ends hold
    a vocab × hidden weight), and the tied model adds the 2-rank all-reduce of the fp32 main grad,
    V·h·4 B / 25 GB/s + 2α, to both end stages' tails: the iteration by exactly that."""
    untied, tied, pred = env
    plan = _plan(dp=1, pp=2)
    a, b = (estimate_plans([plan], _cluster(), m, pred)[0] for m in (untied, tied))
    emb = untied.vocab * untied.hidden * GRAD_BYTES["bf16"] / (NIC * 1e9) * 1e3 + 2 * LAT
    assert b.stage_time_ms == pytest.approx(a.stage_time_ms, rel=1e-12)
    assert b.iteration_time_ms - a.iteration_time_ms == pytest.approx(emb, rel=1e-9)
    # fp16 main grads are 2 B; a pipeline of one stage holds both ends: nothing to exchange
    fp16 = tail_collectives_ms(tied, stage_tp=(1, 1), dp=1, virtual_stages=1, precision="fp16", dp_latency=None,
                               emb_link=(NIC, LAT))
    assert list(fp16) == pytest.approx([untied.vocab * untied.hidden * 2 / (NIC * 1e9) * 1e3 + 2 * LAT] * 2)
    assert list(tail_collectives_ms(tied, stage_tp=(2,), dp=1, virtual_stages=1, precision="bf16", dp_latency=None,
                                    emb_link=(NIC, LAT))) == [0.0]


def test_one_dp_collective_per_model_chunk():
    """Interleaved (v chunks): v collectives' latency, the same bytes (memx.planner.collectives)."""
    assert float(dp_latency_ms(4, LAT, 2)) == pytest.approx(2 * 2 * 3 * LAT)
    assert float(dp_latency_ms(1, LAT, 2)) == 0.0


def test_search_scores_the_terms_as_the_estimate_does(env):
    """The batched engine's tails (memx.planner.tables) carry the same collectives as estimate_plans."""
    from memx.domain.catalog import load_search
    from memx.planner.search import search

    _, tied, pred = env
    cluster = _cluster()
    space = dataclasses.replace(load_search("small"), tp_options=(1,), micro_batch_options=(1,),
                                recompute_levels=("none",), max_stage_slowdown=0.0)
    r = search(cluster, tied, space, pred, top_k=3)
    for cand in r.top:
        est = estimate_plans([cand.plan], cluster, tied, pred)[0]
        assert est.iteration_time_ms == pytest.approx(cand.iteration_time_ms, rel=1e-5)
    assert any(c.plan.pp > 1 for c in r.top) or any(c.plan.dp > 1 for c in r.top)


def _traits(noise: float = 0.0) -> dict:
    return {"a100-80g": dataclasses.replace(load_traits("a100-80g"), noise_std_fraction=noise)}


def test_simulator_tied_embedding_all_reduce(env):
    """The virtual cluster: a 2-rank ring of the V·h fp32 main grad at the A100's link efficiency, 2 steps of
    (collective step latency + NIC latency), both ends leaving it together before their Adam steps."""
    untied, tied, _ = env
    cluster, plan, tr = _cluster(), _plan(dp=1, pp=2), _traits()
    a, b = (simulate_plan(plan, cluster, m, traits=tr) for m in (untied, tied))
    t = tr["a100-80g"]
    nbytes = GRAD_BYTES_OF["bf16"] * untied.vocab * untied.hidden
    emb = nbytes / (NIC * 1e6 * t.link_efficiency) + 2 * (t.collective_step_latency_ms + LAT)
    assert a.embedding_sync_ms == 0.0 and b.embedding_sync_ms == pytest.approx(emb, rel=1e-9)
    # stage 0 finishes last in 1F1B: both ends wait for it and exchange; behind the gradient-norm barrier every
    # stage then waits for the later of them, so the exchange adds itself and nothing more
    assert b.iteration_time_ms - a.iteration_time_ms == pytest.approx(emb, rel=1e-9)
    # without the barrier (--clip-grad 0) untied each stage steps on its own
    a, b = (simulate_plan(plan, cluster, m, traits=tr, grad_norm_barrier=False) for m in (untied, tied))
    o0, o1 = b.optimizer_ms
    assert b.iteration_time_ms - a.iteration_time_ms == pytest.approx(emb + max(o0, o1) - o0, rel=1e-9)


def test_simulator_runs_one_dp_collective_per_model_chunk(env):
    """Interleaved v = 2 on 4 replicas: the DP step pays the ring's 2·(4 − 1) latency steps twice, the bytes
    once (memx.simulator.step_sync.chunk_latency_ms)."""
    model = env[0]
    cluster, tr = _cluster(nodes=8), _traits()
    plan = Plan(model="llama-6l", cluster="a1x4", global_batch=16, micro_batch=1, seq_len=2048, dp=4,
                stages=(Stage(gpu="a100-80g", tp=1, layers=4), Stage(gpu="a100-80g", tp=1, layers=2)))
    inter = dataclasses.replace(plan, virtual_stages=2)
    one, two = (_prepare(p, place_plan(p, cluster), cluster, model, tr, ADAM_STATIC_BYTES_PER_PARAM)
                for p in (plan, inter))
    step = tr["a100-80g"].collective_step_latency_ms + LAT
    assert [y - x for x, y in zip(one.dp_ar, two.dp_ar)] == pytest.approx([2 * 3 * step] * 2, rel=1e-9)
