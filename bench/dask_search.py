"""The branch-and-bound's boxes on local Dask workers (issue #26) against one process, same answer checked.

Scenario (docs/planner.md "Where it stops scaling"): llama3-405b on mixed-1024, conf/search/default.yaml with
max_pp 16, the analytic stage model, top 10. First the one-process search (optionally also without the joint
(T, margin) front bound, `--without-joint`: the engine before issue #26), then `memx.planner.distributed`
on a LocalCluster of N single-threaded worker processes on 127.0.0.1 for each N of `--workers` (the cluster
is started before the clock starts; its start-up is printed apart). Wall seconds, CPU seconds (this process
plus the workers' processes) and plans scored; ratio = serial wall / pool wall. The load average is printed
before and after: the machine is shared.
Last lines: one `workers=N wall_s=… ratio=… scored_ratio=…` line per N (scored_ratio: plans scored against the
one-process run's), then `same answer: yes|no`; `--workers 2,2,2` repeats a count (a fresh cluster each time).
On a loaded machine the serial run can be done once and reused: `--save PATH` stores its answer and wall
time (pickle), `--reference PATH` compares against them instead of running it again (the ratio is then
against a run in another process: say so with the figures); with `--serial` the one-process search runs too, its
answer is compared with the stored one (e.g. another commit's) and the ratios are against it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import time


def _answer(r) -> tuple:
    keys = lambda cs: [(c.plan, c.iteration_time_ms, c.max_mem_mib, c.mem_variance_mib2, c.phi) for c in cs]  # noqa: E731
    return (r.weights, r.refs, r.chosen.plan, keys(r.top), keys(r.top_time), keys(r.pareto), keys(r.safe))


def _cpu() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="mixed-1024")
    ap.add_argument("--model", default="llama3-405b")
    ap.add_argument("--search", default="default")
    ap.add_argument("--max-pp", type=int, default=16)
    ap.add_argument("--workers", default="1,2,4", help="comma-separated local worker counts (\"\": none)")
    ap.add_argument("--without-joint", action="store_true", help="also time one process without the joint bound")
    ap.add_argument("--task-s", type=float, help="seconds a task may run (memx.planner.distributed.TASK_S; none by "
                    "default, 0.5 before issue #26 session 8; one process never has a clock)")
    ap.add_argument("--no-seed", action="store_true", help="no seeding task (memx.planner.distributed.SEED = False)")
    ap.add_argument("--growth", type=float, help="a task's growth cap (memx.planner.distributed.GROWTH; 1e9: none, "
                    "the engine before issue #26's spread section)")
    ap.add_argument("--leaf", type=int, help="splits of a leaf box (memx.planner.bnb.LEAF) in this process: the one-process runs")
    ap.add_argument("--front-tolerance", help="the search's front_tolerance (a fraction, or null: the whole window, "
                    "the engine before issue #26 session 10); default: the shipped search's")
    ap.add_argument("--save", help="store the serial answer and wall time here")
    ap.add_argument("--reference", help="the serial answer and wall time stored by --save (no serial run)")
    ap.add_argument("--serial", action="store_true", help="with --reference: run the one-process search too and "
                    "compare its answer with the stored one (another commit's, e.g. before a change of order)")
    args = ap.parse_args()

    from distributed import Client

    from memx.domain.catalog import load_cluster, load_model, load_search
    from memx.planner import bnb, bounds, distributed
    from memx.planner.cost import AnalyticStageModel
    from memx.planner.distributed import DaskPool, local_cluster
    from memx.planner.search import search

    if args.task_s is not None:
        distributed.TASK_S = args.task_s
    if args.no_seed:
        distributed.SEED = False
    if args.growth is not None:
        distributed.GROWTH = args.growth
    if args.leaf is not None:
        bnb.LEAF = args.leaf
    cl, mo = load_cluster(args.cluster), load_model(args.model)
    sp = dataclasses.replace(load_search(args.search), max_pp=args.max_pp)
    if args.front_tolerance is not None:
        sp = dataclasses.replace(sp, front_tolerance=None if args.front_tolerance == "null" else float(args.front_tolerance))
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    print(f"case: {mo.name} on {cl.name}, search {sp.name} max_pp {sp.max_pp} front_tolerance {sp.front_tolerance}; load average {os.getloadavg()[0]:.1f}",
          flush=True)

    def timed(label: str, **kw):
        t0, c0 = time.perf_counter(), _cpu()
        r = search(cl, mo, sp, pred, top_k=10, **kw)
        wall = time.perf_counter() - t0
        print(f"{label} wall_s={wall:.1f} cpu_s={_cpu() - c0:.1f} scored={r.space.scored:,} pick_ms="
              f"{r.chosen.iteration_time_ms:.0f} front={len(r.pareto)} load={os.getloadavg()[0]:.1f}", flush=True)
        return r, wall

    same = True
    if args.reference:
        with open(args.reference, "rb") as fh:
            answer, serial, *rest = pickle.load(fh)  # (answer, wall) before issue #26's spread section, then + scored
        one_scored = rest[0] if rest else None
        print(f"serial (stored, {args.reference}) wall_s={serial:.1f}"
              + ("" if one_scored is None else f" scored={one_scored:,}"), flush=True)
        if args.serial:  # this process's one-process run: the ratios below are against it
            r, serial = timed("serial")
            same = _answer(r) == answer
            print(f"serial: same answer as stored: {'yes' if same else 'no'}"
                  + ("" if one_scored is None else f" scored_ratio={r.space.scored / one_scored:.3f}"), flush=True)
            one_scored = r.space.scored
    else:
        ref, serial = timed("serial")
        answer, one_scored = _answer(ref), ref.space.scored
        if args.save:
            with open(args.save, "wb") as fh:
                pickle.dump((answer, serial, one_scored), fh)
    if args.without_joint:
        bounds.JOINT_TIME = False
        r, wall = timed("serial_without_joint")
        bounds.JOINT_TIME = True
        print(f"joint bound: {wall / serial:.2f}x faster, same answer: {_answer(r) == answer}", flush=True)
        same &= _answer(r) == answer
    lines = []
    for n in [int(x) for x in args.workers.split(",") if x]:  # --workers "": the one-process run only
        t0 = time.perf_counter()
        with local_cluster(n) as lc, Client(lc) as client:
            print(f"LocalCluster of {n}: started in {time.perf_counter() - t0:.1f} s", flush=True)
            worker_cpu = lambda: sum(client.run(_cpu).values())  # noqa: E731
            w0 = worker_cpu()
            with DaskPool(client) as pool:
                r, wall = timed(f"workers={n}", pool=pool)
            ok = _answer(r) == answer
            same &= ok
            scored = "" if one_scored is None else f" scored_ratio={r.space.scored / one_scored:.2f}"
            lines.append(f"workers={n} wall_s={wall:.1f} ratio={serial / wall:.2f} workers_cpu_s={worker_cpu() - w0:.1f}"
                         f"{scored} same={'yes' if ok else 'no'}")
            print(lines[-1], flush=True)
    print(f"serial_s={serial:.1f}")
    for line in lines:
        print(line)
    print(f"same answer: {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
