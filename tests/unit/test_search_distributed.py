"""The branch-and-bound's boxes on a pool of workers (memx.planner.distributed, issue #26) give exactly the
one-process answer: weights, medians, pick, top-k by Φ and by time, Pareto front and safe sets. Tasks are made
tiny here (32 boxes, one round) so that many run at once against stale copies of the kept sets."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner import bnb, distributed
from memx.planner.cost import AnalyticStageModel
from memx.planner.distributed import DaskPool, Pool, ThreadPool
from memx.planner.search import search


def _answer(r):
    keys = lambda cs: [(c.plan, c.iteration_time_ms, c.max_mem_mib, c.mem_variance_mib2, c.phi) for c in cs]  # noqa: E731
    return (r.weights, r.refs, r.space, r.chosen.plan, keys(r.top), keys(r.top_time), keys(r.pareto), keys(r.safe))


@pytest.fixture(scope="module")
def problem(conf_root):
    cl = load_cluster("three-vendor-20", conf_root)
    mo = dataclasses.replace(load_model("llama-6l", conf_root), layers=24)  # 59,117 splits, 55 % scored
    sp = dataclasses.replace(load_search("small", conf_root), max_pp=4)
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    return cl, mo, sp, pred, search(cl, mo, sp, pred, top_k=5)


@pytest.fixture
def tiny_tasks(monkeypatch):
    monkeypatch.setattr(distributed, "TASK_BOXES", 32)
    monkeypatch.setattr(distributed, "TASK_S", 0.0)  # one round a task
    monkeypatch.setattr(bnb, "POOL", 64)  # a "large" pool: rounds take 1/SHRINK of it, in several tasks


def test_boxes_on_worker_threads_give_the_serial_answer(problem, tiny_tasks):
    cl, mo, sp, pred, ref = problem
    assert ref.space.scored < ref.space.evaluated  # the bound prunes here: the pool's pruning is exercised
    for weights in (None, "default"):
        one = ref if weights is None else search(cl, mo, sp, pred, top_k=5, weights=weights)
        with ThreadPool(3) as pool:
            got = search(cl, mo, sp, pred, top_k=5, weights=weights, pool=pool)
        assert _answer(got) == _answer(one)
    assert _answer(search(cl, mo, sp, pred, top_k=5)) == _answer(ref)  # one process, with the large-pool rounds


@pytest.mark.slow  # ~1.6 CPU s (importing distributed); the thread-pool test above is the default set's check
def test_boxes_on_a_dask_local_cluster_give_the_serial_answer(problem, tiny_tasks):
    """A real dask.distributed LocalCluster (two in-process workers: no process start-up)."""
    from distributed import Client, LocalCluster

    cl, mo, sp, pred, ref = problem
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client, DaskPool(client) as pool:
        assert pool.threads == 2
        got = search(cl, mo, sp, pred, top_k=5, pool=pool)
    assert _answer(got) == _answer(ref)


class InlinePool(Pool):
    """Two "workers" that run each task when it is submitted, in order: deterministic, and every task of a batch of
    submissions runs against the same snapshot of the kept sets (stale, as on a cluster)."""

    threads = 2

    def submit(self, fn, *args) -> Future:
        done = Future()
        done.set_result(fn(*args))
        return done

    def first_done(self, futures: list) -> list:
        return futures[:1]


def test_the_pool_scores_about_as_many_plans_as_one_process(conf_root, monkeypatch):
    """Issue #26 (docs/benchmarks.md §Issue #26: Dask deep-search spread): before the seeding task a pool's first
    tasks ran before any plan set the thresholds, and the plans scored grew with the staleness (here 12,964
    against one process's 7,932 without the seed). Tasks end only at the growth cap here (no clock)."""
    cl = load_cluster("three-vendor-20", conf_root)
    mo = dataclasses.replace(load_model("llama-6l", conf_root), layers=24)
    sp = dataclasses.replace(load_search("default", conf_root), max_pp=6)
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    one = search(cl, mo, sp, pred, top_k=5)
    monkeypatch.setattr(distributed, "TASK_S", 60.0)
    got = search(cl, mo, sp, pred, top_k=5, pool=InlinePool())
    assert _answer(got)[3:] == _answer(one)[3:] and got.weights == one.weights and got.refs == one.refs
    assert got.space.scored <= 1.25 * one.space.scored, (got.space.scored, one.space.scored)


def test_a_pool_and_a_mapper_are_refused(problem):
    cl, mo, sp, pred, _ = problem
    with ThreadPool(1) as pool, pytest.raises(ValueError, match="not both"):
        search(cl, mo, sp, pred, pool=pool, mapper=lambda f, xs: [f(x) for x in xs])


def test_dask_specs_parse_to_local_workers_or_a_scheduler_address():
    from memx.planner.distributed import parse_dask

    assert parse_dask("local") == (2, None) and parse_dask("local:4") == (4, None)
    assert parse_dask("127.0.0.1:8786") == (0, "tcp://127.0.0.1:8786")
    assert parse_dask("tls://[::1]:8786") == (0, "tls://[::1]:8786")


class CountingInline(distributed.Inline):
    """distributed.Inline (the one-process search's pool) counting its tasks."""

    tasks = 0

    def submit(self, fn, *args) -> Future:
        self.tasks += 1
        return super().submit(fn, *args)


def test_one_process_takes_the_pools_order_and_the_order_before_gives_its_answer(problem, monkeypatch):
    """Issue #26 (docs/benchmarks.md §Issue #26: the deep search's order): without a pool the search explores its
    boxes through distributed.Inline — the seeding task, then tasks of TASK_BOXES boxes of least time bound, each
    descended to its growth cap — as a pool does, deterministically. Without the seed and the cap one task runs the
    rounds to the end (the one-process order before, which scored 19.9 M plans on the 405B deep case against 0.87 M):
    the same answer."""
    cl, mo, sp, pred, ref = problem
    monkeypatch.setattr(distributed, "TASK_BOXES", 32)
    monkeypatch.setattr(bnb, "POOL", 64)
    one = search(cl, mo, sp, pred, top_k=5)
    pool = CountingInline()
    inline = search(cl, mo, sp, pred, top_k=5, pool=pool)
    assert pool.tasks > 10  # the boxes went in many tasks
    assert inline.space.scored == one.space.scored and _answer(inline) == _answer(one) == _answer(ref)
    monkeypatch.setattr(distributed, "SEED", False)
    monkeypatch.setattr(distributed, "GROWTH", float("inf"))
    monkeypatch.setattr(distributed, "TASK_BOXES", bnb.BATCH)  # every root box in the first task
    pool = CountingInline()
    before = search(cl, mo, sp, pred, top_k=5, pool=pool)
    assert pool.tasks == 2  # one task a phase (the auto pre-pass, the search): bnb's rounds alone
    assert _answer(before) == _answer(ref)
