"""The branch-and-bound's boxes on a pool of workers — threads, or a Dask cluster (`memx plan --dask`).

A coordinator (the calling process) keeps the pending boxes and the global kept sets (memx.planner.candidates
.Keeper); a task is a batch of boxes of least time bound that a worker explores for a few rounds of the serial
engine (memx.planner.bnb.advance) against a copy of the kept sets as they were when the task left, over the
stacked tables and bound tables sent to every worker once (`Pool.share`). It returns the plans it kept that its
copy did not hold, its work and the boxes it has not finished; the coordinator merges those plans into its kept
sets (Keeper.merge; nothing when none is new) and puts the boxes back in the pool. The kept sets travel as
columns, packed once per snapshot (memx.planner.kept_wire: pickling them plan by plan was most of the deep case's
coordinator CPU). The answer is the serial search's exactly: every kept set is defined by the plans offered to it,
whatever their order or grouping (candidates.py), and a box is discarded only when kept sets built from a
subset of the plans already prove that none of its plans can enter them — which stays true for every
superset, so a worker pruning against an older copy only does more work. Only the count of plans scored
(work, not the answer) depends on the timing of the tasks.

Granularity (docs/planner.md §Distributed boxes): a task takes TASK_BOXES boxes and runs rounds on them until none
is left or until its boxes outnumber GROWTH × those it took (TASK_S, a clock, is off by default: under load a 0.5 s
clock cut the tasks' descents short and one deep run scored 24 M plans, docs/benchmarks.md §Issue #26: the deep
search's order) — long enough that sending the kept sets and the boxes and merging them costs little (a few ms a
task), short enough that the coordinator's thresholds reach the workers often and that Dask's scheduler holds
several tasks per worker to balance. The coordinator keeps IN_FLIGHT tasks per worker thread queued.

Order (issue #26, docs/benchmarks.md §Issue #26: Dask deep-search spread): until a plan is known no box can be
discarded by time, and the serial engine descends best-first (its pool below bnb.POOL) to the fastest plans,
which set the thresholds. Fanned out at once, the tasks each descended their own boxes and returned ~8× the boxes
they took; the pool overshot POOL (150–200 k boxes on the 405B deep case), so the coordinator handed out the
smallest boxes anywhere in the window for minutes, and the plans scored (0.6–33 M against one process's 1.85 M)
depended on when the good leaves happened to be reached. Now a chunk whose keeper has no thresholds yet is first
descended by one task alone (`seed`: the serial engine's rounds until the keeper is `seeded` or its pool reaches
POOL), and the growth cap keeps the returned boxes near the taken ones, so the pool stays near POOL as the serial
engine's does.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from memx.domain.errors import InputError
from memx.domain.specs import SearchSpace, Weights
from memx.planner import bnb
from memx.planner.bnb import BATCH, Boxes, Work, advance, roots, take
from memx.planner.bounds import BoxBounds
from memx.planner.candidates import Keeper
from memx.planner.kept_wire import Shipped, fold, found
from memx.planner.prepared import score_rows
from memx.planner.tables import StackedTables

TASK_BOXES = BATCH  # boxes a task takes from the pool
TASK_S = float("inf")  # seconds a task may run rounds (at least one; then it returns the rest): none, the growth cap
# decides (issue #26 session 8: with 0.5 s, the order since session 6, a deep 2-worker run under load scored 24.1 M plans
# — the clock cut the descents short, so the pool stayed past bnb.POOL, smallest-first —, 0.87–1.08 M in three others;
# without it 0.87 / 0.95 M; docs/benchmarks.md §Issue #26: the deep search's order)
GROWTH = 2  # a task returns once its boxes outnumber GROWTH × those it took (TASK_BOXES at least)
SEED = True  # the first task of a chunk whose keeper has no thresholds yet descends alone (`seeded`)
IN_FLIGHT = 2  # tasks queued per worker thread (so a free worker always finds one, and Dask can steal)
CONNECT_S = 10.0  # seconds to reach a Dask scheduler before `--dask ADDR` is refused (exit 2)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """What every task of a chunk of layouts needs, sent to each worker once (and kept for both phases of a
    search): the layouts' stacked stage tables and bound tables and their keys (layout indices of the search)."""

    tables: StackedTables
    bounds: BoxBounds
    keys: np.ndarray


def run_task(problem: Problem, weights: Weights | None, space: SearchSpace, kept: Shipped, boxes: Boxes,
             seconds: float | None = None, seed: bool = False) -> tuple[Shipped | None, Work, Boxes]:
    """A worker's task: rounds of the serial engine on `boxes` with its own copy of the kept sets `kept` for
    `seconds` (TASK_S, none by default; at least one round) or until its boxes outnumber GROWTH × those it took; with `seed`,
    instead until its copy is `seeded` or its boxes reach bnb.POOL (the serial engine's best-first phase); returns
    (the plans it kept that `kept` did not hold — memx.planner.kept_wire.found —, the work, the boxes left)."""
    start = kept.keeper
    keeper = copy.copy(start)  # the coordinator's snapshot may be shared (in-process workers): never mutated
    evaluate = partial(score_rows, problem.tables, weights=weights, space=space, keys=problem.keys)
    work = Work()
    end = time.perf_counter() + (TASK_S if seconds is None else seconds)  # inf: the growth cap alone
    most = max(GROWTH * len(boxes[0]), TASK_BOXES)
    while len(boxes[0]):
        boxes = advance(problem.bounds, keeper, evaluate, weights, space.epsilon_mib2, boxes, work)
        if seed:
            if seeded(keeper) or len(boxes[0]) >= bnb.POOL:
                break
        elif time.perf_counter() >= end or len(boxes[0]) > most:
            break
    new = found(keeper, start)
    return (None if new is None else Shipped(new)), work, boxes


def seeded(keeper: Keeper) -> bool:
    """Whether the keeper's time thresholds are set: a fastest plan, and a fastest safe plan when it keeps safe
    sets (until then no box can be discarded by time: Keeper.time_needed)."""
    return bool(np.isfinite(keeper.fastest_ms)) and (keeper.floor is None or bool(np.isfinite(keeper.fastest_safe_ms)))


def explore_pool(pool: Pool, shared: Any, bounds: BoxBounds, keeper: Keeper, weights: Weights | None,
                 space: SearchSpace, layouts: np.ndarray) -> Work:
    """The branch-and-bound (rounds of memx.planner.bnb.advance) with its boxes explored in tasks by `pool`'s workers
    (`Inline`: this process, the one-process search; `shared`: the Problem as `pool.share` returned it); the kept
    sets end in `keeper`."""
    work = Work()
    pending = roots(bounds, layouts)
    ready: list[Boxes] = []  # batches taken, not yet sent (a large pool yields many tasks at one take)
    back: list[Boxes] = []  # boxes tasks returned, joined to the pool at the next take (one copy for many)
    running: dict[Any, None] = {}
    slots = max(1, pool.threads * (IN_FLIGHT if pool.in_flight is None else pool.in_flight))
    snapshot = Shipped(copy.copy(keeper))  # sent with every task until a task's plans change the kept sets
    if SEED and not seeded(keeper):  # one task descends best-first until the thresholds are set (module docstring)
        new, w, pending = pool.submit(run_task, shared, weights, space, snapshot, pending, None, True).result()
        if fold(keeper, None if new is None else new.keeper):
            snapshot = Shipped(copy.copy(keeper))
        work.add(w)
    while len(pending[0]) or back or ready or running:
        while len(running) < slots and (ready or back or len(pending[0])):
            if not ready:
                if back:
                    pending = tuple(np.concatenate(parts) for parts in zip(*back, pending))
                    back = []
                batch, rest = take(bounds, keeper, pending, TASK_BOXES * slots)  # a batch for every slot: one take
                pending = rest if rest is not None else _empty(batch)
                ready = [tuple(x[i:i + TASK_BOXES] for x in batch) for i in range(0, len(batch[0]), TASK_BOXES)]
                if not ready:
                    continue
            running[pool.submit(run_task, shared, weights, space, snapshot, ready.pop(0), pool.task_s)] = None
        if not running:
            break
        for fut in pool.first_done(list(running)):
            del running[fut]
            new, w, left = fut.result()
            if fold(keeper, None if new is None else new.keeper):
                snapshot = Shipped(copy.copy(keeper))
            work.add(w)
            if len(left[0]):
                back.append(left)
    return work


def _empty(boxes: Boxes) -> Boxes:
    return tuple(x[:0] for x in boxes)


class Pool:
    """Workers that run tasks: `share(obj)` once per problem, `submit(fn, *args)` → a future (`.result()`),
    `first_done(futures)` → those done (waits for one); `threads`: how many run at once; `in_flight`: tasks queued
    per thread (None: IN_FLIGHT); `task_s`: the seconds a task runs (None: TASK_S)."""

    threads: int = 1
    in_flight: int | None = None
    task_s: float | None = None

    def share(self, obj: Any) -> Any:
        return obj

    def submit(self, fn: Callable, *args) -> Any:
        raise NotImplementedError

    def first_done(self, futures: list) -> list:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Inline(Pool):
    """This process, one task at a time, each run when it is submitted against the current kept sets: the
    one-process search (memx.planner.search) explores its boxes through it, so one process and a pool take their
    boxes in one order — the seeding task, then batches of least time bound (past bnb.POOL the smallest), each
    descended until its boxes outnumber GROWTH × those it took (issue #26, docs/benchmarks.md §Issue #26: the deep
    search's order). Never a clock (`task_s` = inf, whatever TASK_S): the plans scored are the same in every run."""

    in_flight = 1
    task_s = float("inf")

    def submit(self, fn: Callable, *args) -> Future:
        done = Future()
        done.set_result(fn(*args))
        return done

    def first_done(self, futures: list) -> list:
        return futures[:1]


class ThreadPool(Pool):
    """Worker threads of this process (numpy releases the GIL in the large array operations)."""

    def __init__(self, threads: int = 2):
        self.threads = threads
        self._ex = ThreadPoolExecutor(max_workers=threads)

    def submit(self, fn: Callable, *args) -> Future:
        return self._ex.submit(fn, *args)

    def first_done(self, futures: list) -> list:
        return list(wait(futures, return_when=FIRST_COMPLETED).done)

    def close(self) -> None:
        self._ex.shutdown(wait=True)


class DaskPool(Pool):
    """A dask.distributed client: tasks go to the cluster's workers, whose scheduler balances them (work
    stealing moves queued tasks from busy workers to idle ones); the Problem is scattered to every worker once.
    `owned`: what `close` closes (the client and the LocalCluster this pool started; nothing for a client lent
    by a Dask worker, `distributed.worker_client`)."""

    def __init__(self, client, owned: tuple = ()):
        self.client, self._owned = client, owned
        self.threads = max(1, sum(client.nthreads().values()))

    def share(self, obj: Any) -> Any:
        return self.client.scatter(obj, broadcast=True, hash=False)

    def submit(self, fn: Callable, *args) -> Any:
        return self.client.submit(fn, *args, pure=False)

    def first_done(self, futures: list) -> list:
        from distributed import wait as dask_wait

        return list(dask_wait(futures, return_when="FIRST_COMPLETED").done)

    def close(self) -> None:
        for x in self._owned:
            x.close()


LOCAL = re.compile(r"local(?::(\d+))?")
ADDRESS = re.compile(r"(tcp|tls|ws|wss)://(\[[0-9a-fA-F:.]+\]|[^\s/:\[\]]+):\d{1,5}")


def dask_pool(spec: str, connect_s: float | None = None) -> DaskPool:
    """`--dask SPEC`: 'local' (2 single-threaded worker processes on 127.0.0.1), 'local:N' (N of them), or the
    address of a running dask.distributed scheduler ('tcp://host:8786', 'host:8786'). InputError (exit 2) with
    one line when the address is malformed or nothing answers there within `connect_s` seconds (CONNECT_S)."""
    workers, address = parse_dask(spec)
    from distributed import Client

    if workers:
        cluster = local_cluster(workers)
        client = Client(cluster)
        return DaskPool(client, owned=(client, cluster))
    connect_s = CONNECT_S if connect_s is None else connect_s
    try:
        client = Client(address, timeout=connect_s)
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(f"--dask {spec}: no Dask scheduler answered at {address} within {connect_s:g} s "
                         f"({type(exc).__name__}); start one with `dask scheduler` or use --dask local") from None
    return DaskPool(client, owned=(client,))


def local_cluster(workers: int):
    """A LocalCluster of single-threaded worker processes on 127.0.0.1, without the workers' statistical
    profiler (a stack sample every 10 ms, of no use here) and without Dask's MALLOC_TRIM_THRESHOLD_ for them:
    setting it turns off glibc's dynamic mmap threshold (mallopt(3)), so every large numpy temporary is
    mapped and unmapped afresh — the workers spent 2.2× the one-process CPU on the same boxes."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.worker.profile.enabled": False,
                          "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                            dashboard_address=None)


def parse_dask(spec: str) -> tuple[int, str | None]:
    """(local workers, None) or (0, scheduler address) of a `--dask` value; InputError when it is neither."""
    if m := LOCAL.fullmatch(spec):
        n = int(m.group(1) or 2)
        if n < 1:
            raise InputError(f"--dask {spec!r}: local needs at least one worker ('local', 'local:N' with N ≥ 1)")
        return n, None
    address = spec if "://" in spec else f"tcp://{spec}"
    if not ADDRESS.fullmatch(address):
        raise InputError(f"--dask {spec!r}: expected 'local', 'local:N' or a scheduler address such as "
                         f"tcp://127.0.0.1:8786")
    return 0, address


@contextmanager
def search_pool(spec: str | None) -> Iterator[Pool | None]:
    """The pool `--dask SPEC` names (`dask_pool`), closed on leaving; None without one."""
    if spec is None:
        yield None
        return
    with dask_pool(spec) as pool:
        yield pool
