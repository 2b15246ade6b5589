"""The kept sets between coordinator and workers (memx.planner.kept_wire, issue #26 session 6): pickled as columns
they arrive field for field as they left; a search whose tasks and results cross pickle (as to worker processes)
gives the one-process answer; folding a task's new plans gives the coordinator the kept sets the whole merge gives."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner import bnb, distributed
from memx.planner.cost import AnalyticStageModel
from memx.planner.distributed import ThreadPool
from memx.planner.kept_wire import FLOATS, LISTS, Shipped, fold, found
from memx.planner.search import search


def _cand(c) -> tuple:
    arrays = tuple((a.dtype.str, a.tolist()) for a in (c.level, c.stage_ms, c.stage_mib))
    return tuple(repr(getattr(c, f)) for f in FLOATS) + (c.layout, c.split) + arrays  # repr: NaN equals NaN


def _sets(k) -> tuple:
    lists = tuple(tuple(_cand(c) for c in getattr(k, name)) for name in LISTS)
    return lists, None if k.widest is None else _cand(k.widest), k.fastest_ms, k.fastest_safe_ms


class PicklingPool(ThreadPool):
    """Worker threads whose tasks' arguments and results cross pickle, as they do to Dask worker processes; keeps
    every keeper sent so the test can check them."""

    def __init__(self, threads: int):
        super().__init__(threads)
        self.sent: list = []

    def submit(self, fn, *args):
        wire = pickle.loads(pickle.dumps(args))
        self.sent.append((args[3].keeper, wire[3].keeper))
        return self._ex.submit(lambda: pickle.loads(pickle.dumps(fn(*wire))))


@pytest.fixture(scope="module")
def problem(conf_root):
    cl = load_cluster("three-vendor-20", conf_root)
    mo = dataclasses.replace(load_model("llama-6l", conf_root), layers=24)
    sp = dataclasses.replace(load_search("small", conf_root), max_pp=4)
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    return cl, mo, sp, pred, search(cl, mo, sp, pred, top_k=5, weights="default")


@pytest.fixture(scope="module")
def pooled(problem):
    """The search on two worker threads whose tasks cross pickle, tasks made tiny (one round of 32 boxes) so that
    many snapshots go out: (its result, the pool)."""
    cl, mo, sp, pred, _ = problem
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed, "TASK_BOXES", 32)
        mp.setattr(distributed, "TASK_S", 0.0)
        mp.setattr(bnb, "POOL", 64)
        with PicklingPool(2) as pool:
            return search(cl, mo, sp, pred, top_k=5, weights="default", pool=pool), pool


def test_pickled_tasks_give_the_serial_answer_and_keepers_arrive_whole(problem, pooled):
    ref, (got, pool) = problem[-1], pooled
    keys = lambda cs: [(c.plan, c.iteration_time_ms, c.max_mem_mib, c.mem_variance_mib2, c.phi) for c in cs]  # noqa: E731
    assert [keys(x) for x in (got.top, got.top_time, got.pareto, got.safe)] == \
        [keys(x) for x in (ref.top, ref.top_time, ref.pareto, ref.safe)]
    assert got.chosen.plan == ref.chosen.plan
    assert max(len(k.phi) + len(k.front) for k, _ in pool.sent) > 3  # keepers with plans in them went out
    for before, after in pool.sent:
        assert _sets(after) == _sets(before)
        for name in ("kth_time", "_stair_t", "_stair_kth", "_front"):
            assert np.array_equal(getattr(after, name), getattr(before, name))


def test_folding_the_new_plans_is_the_whole_merge(pooled):
    snapshots = list({id(k): k for k, _ in pooled[1].sent}.values())  # each snapshot once, in the order sent
    checked = 0
    for early, late in list(zip(snapshots, snapshots[1:]))[:: max(1, len(snapshots) // 12)]:
        coordinator = copy.deepcopy(late)  # `late` grew from the plans `early` had (and more)
        whole, part = copy.deepcopy(coordinator), coordinator
        task = copy.deepcopy(late)  # a task that started from `early` and found what `late` holds
        whole.merge(task)
        new = found(task, early)
        fold(part, new)
        assert _sets(part) == _sets(whole)
        checked += new is not None
    assert checked and found(snapshots[-1], snapshots[-1]) is None
    assert isinstance(pickle.loads(pickle.dumps(Shipped(snapshots[-1]))).keeper, type(snapshots[-1]))
