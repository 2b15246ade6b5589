"""Decision quality of the pick rules on the virtual cluster (issue #22): which rule should be the default.

  python bench/decision_quality.py [--space catalog|paper] [--assembly paper|cycle-mean|cycle-mean-drain] [--oracle] [--scenarios v100-t4-6/llama-6l,...]
                                   [--reach 1.10] [--slack 0.10] [--seed 0] [--predictor analytic|calibrated|learned|learned-calibrated]
                                   [--rules R1,R2] [--population-worlds nominal,spike] [--dump DIR] [--nic-efficiency 0.9]
  python bench/decision_quality.py --scenarios mixed-1024/llama3-405b --sample-floors 0.1,0.2 [--fastest 5]

For each scenario (cluster / model, the catalog's `default` search, weights auto) and predictor — `analytic` (the
default): the closed form; `calibrated`: the closed form calibrated on 8 random plans that ran on the virtual
cluster (what `memx plan --measured` does with a user's timed plans); `learned`: the product's registered
predictor, i.e. the scenario profiled on the virtual cluster (memx.pipeline.local profile_step, backend
simulated, seed `--seed`), train_step (held-out split, augment, every variant, Optuna on the best tree variant
with the product's budget, memx.learn.tuning.TuneBudget: 8 trials, split-conformal bands, registered in MLflow)
and registered_predictor (the champion), all in a temporary $MEMX_HOME with its own SQLite MLflow store, deleted
at the end (memx.experiments.common.get_predictor "registered"); `learned-calibrated`: that one calibrated as
`calibrated` (what `memx train --measured` adds).
`--seed` is the simulator seed of the measured worlds and, with `learned`, of the profile and the training split.
1. every rule of memx.planner.pick.PICK_RULES picks by its own search (the paper's `phi` and
   fastest-above-floor without a time window, the others with max_time_ratio 1.25, as docs/results.md);
2. the *population*: every plan the same search can score whose predicted time ≤ `reach` × the fastest
   predicted plan that clears the floor and whose predicted margin ≥ floor − `slack` (the search's keeper
   widened to keep them all, `Population`), plus every rule's pick. It holds every plan any floor rule can
   pick (those lie within (1 + balance_tolerance) × the fastest safe plan, above the floor), so a new rule
   is measured exactly by applying it to the population's predicted metrics (`rule_pick`);
3. every population plan is run on the virtual cluster (memx.simulator, which never imports the cost model)
   in four worlds: nominal; `spike` (+10 % activations on every GPU, time unchanged; the stage costs of
   memx.simulator as in memx.experiments.robustness.headroom); `mb2` (micro batch × 2, global batch kept);
   `seq2` (sequence length × 2);
4. per world, safe = measured smallest margin ≥ margin_floor (and no OOM); the fastest safe plan T*; the
   *window* = safe plans with T ≤ (1 + balance_tolerance) × T*. Per rule and world: OOM, measured margin,
   T / T*, dominated (another population plan no slower and no tighter, one strictly, measured), and the rank
   of the pick's measured Φ in the window (1 = lowest; "—" when the pick is not in the window; Φ's medians
   only scale it, so the rank needs none: memx.planner.objective.log_score), and its rank among the window's
   plans that no plan dominates (where the lowest-Φ plan is dominated, no pick can be both).
`--oracle` adds the floor rules applied to the measured nominal metrics of the population ("oracle RULE": the
pick of a perfect predictor), which separates what the rule decides from what the predictor gets wrong.
`--allowances 0.05,0.1` adds the robustness-allowance variant (`allowance_pick`, not a planner rule): least Φ
among the window's plans whose predicted margin clears floor + allowance (none: as balanced-margin).
Output: one table row per (scenario, rule) with the four worlds side by side, then the totals per rule
(misses counted in the nominal world), then per scenario the predictor's accuracy over the population (measured /
predicted time, 5th–95th percentile; Spearman of predicted and measured time) and the seconds spent.
`--nic-efficiency X` sets every scenario cluster's `nic_efficiency` (the closed form's NICs at X × line rate
instead of the runtime catalog's 0.9, docs/planner.md §Network; 1.0: line rate, as before issue #27; the virtual
cluster never reads it). `--rules` limits the rules searched;
`--population-worlds` the worlds the whole population runs in (the picks always run in all four; the other worlds'
cells then give the pick's margin only); `--dump DIR` writes each scenario's population (bench/decision_rules.py
analyses candidate rules on it). mixed-1024/llama3-405b runs as a population with a narrower reach
(docs/results.md: `--reach 1.05 --slack 0 --population-worlds nominal,spike`).
`--sample-floors F1,F2,...` (`sample`): where the population is out of reach, only the default rule's pick at each
floor and the `--fastest` fastest plans predicted safe at F1, measured in the four worlds (a sample, not a population).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.specs import PIPELINE_ASSEMBLIES
from memx.planner import candidates as cand_module
from memx.planner import search as search_module
from memx.planner.cost import AnalyticStageModel
from memx.planner.objective import log_score
from memx.planner.pick import FLOOR_RULES, PICK_RULES, choose, plan_key
from memx.simulator import load_traits, simulate_plan, stage_cost, stage_signatures

SCENARIOS = ("v100-t4-6/llama-6l", "three-vendor-20/llama2-7b", "h100-h20-16/llama2-13b",
             "h100-mi300x-32/llama2-70b", "a100-v100-16/llama2-7b")  # the last two: mixed capacities
WORLDS = ("nominal", "spike", "mb2", "seq2")
SPIKE = 0.10  # memx.experiments.robustness.SPIKE
WINDOW = {"phi": 0.0, "fastest-above-floor": 0.0}  # rules searched without a time window; the rest at 1.25


class Population(cand_module.Keeper):
    """The search's keeper, widened: it also keeps every scored plan with time ≤ reach × the fastest safe plan
    and floor margin ≥ low (boxes that may hold one are not pruned); `safe()` returns them."""

    reach, low = 1.10, 0.0

    def __init__(self, **kw):
        super().__init__(**kw)
        self.kept: dict = {}

    def _bound(self) -> float:
        return self.reach * self.fastest_safe_ms if self.floor is not None else -np.inf  # step 1 (timed only): as is

    def time_needed(self, time_lb):
        return super().time_needed(time_lb) | (time_lb <= self._bound())

    def needs(self, c, score_lb, weights=None):
        return super().needs(c, score_lb, weights) | ((c.time_ms <= self._bound()) & (cand_module._floor_ub(c) >= self.low))

    def offer(self, sc):
        super().offer(sc)  # first: the batch's fastest safe plan tightens the bound
        if self.floor is None or sc.assignment.time_ms.size == 0:
            return
        rows = np.arange(sc.assignment.time_ms.size)
        t = sc.assignment.time_ms.astype(np.float64)
        ok = rows[(t <= self._bound()) & (sc.floor_margins(rows) >= self.low)]
        for c in cand_module._cands(sc, ok):
            self.kept[c.key] = c

    def merge(self, other):
        super().merge(other)
        self.kept.update(other.kept)

    def safe(self):
        bound = self._bound()
        return [c for c in self.kept.values() if c.time_ms <= bound]


def searched(cluster, model, sp, pred, keeper=None):
    """One search, optionally with another keeper class (the population)."""
    if keeper is None:
        return search_module.search(cluster, model, sp, pred, top_k=10)
    old = search_module.Keeper
    search_module.Keeper = keeper
    try:
        return search_module.search(cluster, model, sp, pred, top_k=10)
    finally:
        search_module.Keeper = old


def _spike_margin(plan, cluster, model) -> float:
    """Smallest margin with every stage's activations × (1 + SPIKE) (memx.simulator stage costs)."""
    worst = np.inf
    for sig in stage_signatures(plan, model):
        c = stage_cost(sig, cluster.gpu(sig.gpu), load_traits(sig.gpu))
        worst = min(worst, 1.0 - c.peak_mem_mib(sig.inflight * (1.0 + SPIKE)) / c.capacity_mib)
    return float(worst)


def _variant(plan, world):
    if world == "mb2":
        return dataclasses.replace(plan, micro_batch=2 * plan.micro_batch)
    if world == "seq2":
        return dataclasses.replace(plan, seq_len=2 * plan.seq_len)
    return plan


def measure(plans, cluster, model, seed: int, worlds=WORLDS, every: frozenset = frozenset()) -> dict:
    """{world: (N, 4) array of measured T, smallest margin, M, V; NaN T = OOM; all NaN = not applicable or not
    measured}: the plans of index in `every` in all WORLDS, the others in `worlds` only."""
    out = {w: np.full((len(plans), 4), np.nan) for w in WORLDS}
    for i, p in enumerate(plans):
        for w in (WORLDS if i in every else worlds):
            if w == "spike":
                t, d = out["nominal"][i, 0], None
                m = _spike_margin(p, cluster, model)
                d0 = out["nominal"][i]
                out[w][i] = (t if m >= 0 else np.nan, m, d0[2] * (1 + SPIKE), d0[3])  # M, V: of the nominal run
                continue
            try:
                r = simulate_plan(_variant(p, w), cluster, model, seed=seed)
            except Exception:  # the variant is not a valid plan (e.g. the micro batches no longer divide)
                continue
            d, cap = np.asarray(r.demand_mem_mib, dtype=float), np.asarray(r.capacity_mib, dtype=float)  # the run's own
            out[w][i] = (r.iteration_time_ms if not r.oom else np.nan, float(np.min((cap - d) / cap)),
                         float(d.max()), float(d.var()))
    return out


def judge(x: np.ndarray, i: int, floor: float, tol: float, weights, eps: float, alone: bool = False) -> dict:
    """The pick i in one world's measurements x (N, 4); `alone`: the world was measured for the picks only (OOM
    and margin, no T*, window or dominance)."""
    t, m = x[:, 0], x[:, 1]
    if np.isnan(m[i]):
        return {"na": True}
    oom = bool(np.isnan(t[i]))
    ok = ~np.isnan(t)
    safe = ok & (m >= floor)
    row = {"na": False, "oom": oom, "margin": float(m[i]), "alone": alone}
    if alone or not safe.any():
        return {**row, "ratio": np.nan, "dominated": False, "rank": None, "window": 0}
    t_star = t[safe].min()
    window = safe & (t <= (1 + tol) * t_star)
    score = np.where(window, log_score(np.where(ok, t, 1.0), np.maximum(x[:, 2], 1.0), x[:, 3], weights, eps), np.inf)
    dominated = (not oom) and bool(np.any(ok & (t <= t[i]) & (m >= m[i]) & ((t < t[i]) | (m > m[i]))))
    rank = int(np.sum(score < score[i]) + 1) if window[i] else None
    front = [j for j in np.nonzero(window)[0]  # the window's plans no plan dominates on (T, margin)
             if not np.any(ok & (t <= t[j]) & (m >= m[j]) & ((t < t[j]) | (m > m[j])))]
    front_rank = int(sum(score[j] < score[i] for j in front) + 1) if i in front else None
    return {**row, "ratio": float(t[i] / t_star) if not oom else np.nan, "dominated": dominated, "rank": rank,
            "window": int(window.sum()), "front_rank": front_rank}


def base_space(kind: str, assembly: str | None = None):
    """`catalog`: conf/search/default.yaml as `memx plan` runs it; `paper`: the same without the distributed
    optimizer and sequence parallelism (memx.experiments.common.space, the earlier comparisons' space). `assembly`:
    its pipeline_assembly (issues #22, #27); None: the YAML's."""
    if kind == "paper":
        from memx.experiments.common import space
        sp = space("default")
    else:
        sp = load_search("default")
    return sp if assembly is None else dataclasses.replace(sp, pipeline_assembly=assembly)


CALIBRATION_PLANS = 8  # `calibrated`: the plans a user times before `memx plan --measured` (issue #16's handful)
CALIBRATION_DRAW = 96  # random plans drawn to find them: the first CALIBRATION_PLANS that ran


def predictor(cl, mo, sp, kind: str, seed: int):
    """The closed form; `calibrated`: the closed form calibrated on CALIBRATION_PLANS random plans of the space that
    ran on the virtual cluster (the first that ran of memx.simulator.sample_plans' CALIBRATION_DRAW at seed
    100 + `seed`, apart from the worlds' seeds: a user times plans that fit;
    memx.learn.calibration.fit_from_config_runs, guarded, as `memx plan --measured` fits it); or the product's
    registered predictor trained on a simulated profile of seed `seed` (the caller points $MEMX_HOME at a temporary
    folder: memx.experiments.common.registered)."""
    if kind == "analytic":
        return AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    if kind == "calibrated":
        return _calibrated(AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}), cl, mo, sp, seed)
    from memx.experiments.common import get_predictor  # the experiments layer: only when a run needs it

    learned = get_predictor(cl, mo, sp, "registered", seed)
    return _calibrated(learned, cl, mo, sp, seed) if kind == "learned-calibrated" else learned


def _calibrated(base, cl, mo, sp, seed: int):
    """`base` calibrated on the first CALIBRATION_PLANS of CALIBRATION_DRAW random plans that ran (`predictor`),
    drawn with the space's distributed-optimizer and sequence-parallel options (session 16's first runs drew them
    off, memx.simulator.sample_plans' default: another region of the space than the population's)."""
    from memx.learn.calibration import fit_from_config_runs
    from memx.simulator import sample_plans

    runs = sample_plans(cl, mo, sp, n=CALIBRATION_DRAW, seed=100 + seed, distributed_optimizer=sp.distributed_optimizer,
                        sequence_parallel=sp.sequence_parallel)  # plans with the space's options, as users run them
    runs = runs[~runs["oom"].astype(bool)].head(CALIBRATION_PLANS)
    cal = fit_from_config_runs(runs, cl, mo, base, pipeline_assembly=sp.pipeline_assembly)
    print(f"{cl.name}/{mo.name} calibration: {cal.summary()}", flush=True)
    return cal.wrap(base)


def accuracy(keys, pool, meas) -> dict:
    """Over the population (nominal world, plans that ran): measured / predicted time (5th, 95th percentile)
    and the Spearman rank correlation of predicted and measured time."""
    from scipy.stats import spearmanr

    t_meas = meas["nominal"][:, 0]
    t_pred = np.array([pool[k].iteration_time_ms for k in keys])
    ok = ~np.isnan(t_meas)
    r = t_meas[ok] / t_pred[ok]
    rho = float(spearmanr(t_pred[ok], t_meas[ok]).statistic) if ok.sum() > 2 else np.nan
    return {"ratio_p5": float(np.percentile(r, 5)), "ratio_p95": float(np.percentile(r, 95)), "spearman": rho}


def scenario(name: str, *, reach: float, slack: float, seed: int, space: str = "catalog", rules=PICK_RULES,
             oracle: bool = False, allowances: tuple[float, ...] = (), kind: str = "analytic", dump: str = "",
             worlds: tuple[str, ...] = WORLDS, assembly: str | None = None, nic_efficiency: float | None = None):
    cl_name, mo_name = name.split("/")
    cl, mo = load_cluster(cl_name), load_model(mo_name)
    if nic_efficiency is not None:  # the closed form's NICs (memx.planner.network); the simulator never reads it
        cl = dataclasses.replace(cl, nic_efficiency=nic_efficiency)
    sp0 = base_space(space, assembly)
    tp = time.perf_counter()
    pred = predictor(cl, mo, sp0, kind, seed)
    t0 = time.perf_counter()
    picks, results = {}, {}
    for rule in rules:
        sp = dataclasses.replace(sp0, pick_rule=rule, max_time_ratio=WINDOW.get(rule, 1.25))
        results[rule] = searched(cl, mo, sp, pred)
        picks[rule] = results[rule].chosen
    Population.reach, Population.low = reach, sp0.margin_floor - slack
    pop_r = searched(cl, mo, dataclasses.replace(sp0, pick_rule="fastest-above-floor"), pred, Population)
    pool = {plan_key(c): c for c in pop_r.safe}
    for m in picks.values():
        pool.setdefault(plan_key(m), m)
    keys = list(pool)
    plans = [pool[k].plan for k in keys]
    t1 = time.perf_counter()
    chosen = frozenset(keys.index(plan_key(m)) for m in picks.values())
    meas = measure(plans, cl, mo, seed, worlds, chosen)
    t2 = time.perf_counter()
    w, eps = pop_r.weights, sp0.epsilon_mib2
    rows = []
    if oracle:  # the floor rules on the measured nominal metrics: what each would pick with a perfect predictor
        known = [dataclasses.replace(pool[k], iteration_time_ms=float(x[0]), min_margin=float(x[1]), max_mem_mib=float(x[2]),
                                     mem_variance_mib2=float(x[3]), min_margin_high=None,
                                     phi=float(np.exp(log_score(x[0], x[2], x[3], w, eps))))
                 for k, x in zip(keys, meas["nominal"]) if not np.isnan(x[0])]
        for rule in FLOOR_RULES:
            picks[f"oracle {rule}"] = rule_pick(known, sp0, rule)
    for a in allowances:  # not a planner rule: least Φ among the window's plans whose margin clears floor + a
        picks[f"allowance {a:g}"] = allowance_pick(list(pool.values()), sp0, a)
    for rule, m in picks.items():
        i = keys.index(plan_key(m))
        rows.append({"scenario": name, "rule": rule, "pred_margin": m.min_margin, "pred_ms": m.iteration_time_ms,
                     **{wd: judge(meas[wd], i, sp0.margin_floor, sp0.balance_tolerance, w, eps, wd not in worlds)
                        for wd in WORLDS}})
    info = {"scenario": name, "population": len(keys), "train_s": t0 - tp, "search_s": t1 - t0,
            "simulate_s": t2 - t1, "weights": w, "worlds": worlds, **accuracy(keys, pool, meas)}
    if dump:  # the population for offline pick-rule analysis (bench/decision_rules.py)
        from bench.decision_rules import dump_population, time_bounds

        dump_population(dump, f"{kind}-{space}-s{seed}-{name.replace('/', '+')}", keys, pool, meas, rows, info,
                        time_bounds(plans, cl, mo, pred))
    return rows, info, (keys, pool, meas)


def sample(name: str, *, floors: tuple[float, ...], fastest: int, seed: int, space: str = "catalog",
           kind: str = "analytic", assembly: str | None = None) -> str:
    """A small sample where the population is out of reach (mixed-1024 / llama3-405b): the default rule's pick at
    each margin floor of `floors` (the first: the catalog's), and the `fastest` fastest predicted plans that clear
    the first floor (the population at reach 1.02, no slack), each run in the four worlds; a Markdown table."""
    cl_name, mo_name = name.split("/")
    cl, mo = load_cluster(cl_name), load_model(mo_name)
    sp0 = dataclasses.replace(base_space(space, assembly), margin_floor=floors[0])
    pred = predictor(cl, mo, sp0, kind, seed)
    rows: dict = {}  # plan key → (label, PlanMetrics)

    def add(m, label):
        rows[plan_key(m)] = (f"{rows[plan_key(m)][0]}; {label}" if plan_key(m) in rows else label, m)

    for f in floors:
        pick = searched(cl, mo, dataclasses.replace(sp0, margin_floor=f), pred).chosen
        add(pick, f"{sp0.pick_rule} pick, floor {f:.0%}")
    Population.reach, Population.low = 1.02, sp0.margin_floor
    pop = searched(cl, mo, dataclasses.replace(sp0, pick_rule="fastest-above-floor"), pred, Population)
    near = sorted((c for c in pop.safe if c.min_margin >= sp0.margin_floor), key=lambda c: c.iteration_time_ms)
    for k, m in enumerate(near[:fastest], 1):
        add(m, f"fastest safe #{k} (predicted)")
    t0 = time.perf_counter()
    meas = measure([m.plan for _, m in rows.values()], cl, mo, seed)
    head = (f"{name}: {len(rows)} plans (of {len(pop.safe)} predicted safe within 1.02 × the fastest), "
            f"{(time.perf_counter() - t0) / len(rows):.2f} s per plan for the four worlds")
    return head + "\n" + sample_table(list(rows.values()), meas, floors[0])


def sample_table(rows, meas, floor: float) -> str:
    """One row per sampled plan; cell = measured margin · T / T* (nominal: and T), T* = the fastest plan of the
    sample measured safe (margin ≥ floor) in that world."""
    from memx.experiments.common import describe

    out = ["", "| plan | stages | pred. ms | pred. margin | " + " | ".join(WORLDS) + " |",
           "|" + "---|" * (4 + len(WORLDS))]
    for i, (label, m) in enumerate(rows):
        cells = []
        for w in WORLDS:
            t, mg = meas[w][:, 0], meas[w][:, 1]
            safe = ~np.isnan(t) & (mg >= floor)
            if np.isnan(mg[i]):
                cells.append("n/a")
            elif np.isnan(t[i]):
                cells.append(f"**OOM** ({mg[i]:.1%})")
            else:
                ratio = f"{t[i] / t[safe].min():.3f}" if safe.any() else "—"
                cells.append(f"{mg[i]:.1%} · {ratio}" + (f" ({t[i]:,.0f} ms)" if w == "nominal" else ""))
        out.append(f"| {label} | {describe(m.plan).replace('|', '/')} | {m.iteration_time_ms:,.0f} | "
                   f"{m.min_margin:.1%} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def rule_pick(pool, sp, rule: str):
    """A planner rule applied to the population's predicted metrics (memx.planner.pick.choose)."""
    return choose(pool[:1], pool[1:], rule=rule, margin_floor=sp.margin_floor,
                  balance_tolerance=sp.balance_tolerance).plan


def allowance_pick(pool, sp, allowance: float):
    """The robustness-allowance variant (issue #22 brief): least predicted Φ among the plans that clear the floor
    within the tolerance of the fastest of them whose margin ≥ floor + allowance; none: as balanced-margin."""
    near = [c for c in pool if c.min_margin >= sp.margin_floor]
    fastest = min(c.iteration_time_ms for c in near)
    near = [c for c in near if c.iteration_time_ms <= (1 + sp.balance_tolerance) * fastest]
    roomy = [c for c in near if c.min_margin >= sp.margin_floor + allowance]
    if not roomy:
        return rule_pick(near, sp, "balanced-margin")
    return min(roomy, key=lambda c: (c.phi, c.iteration_time_ms, c.mem_variance_mib2))


def _cell(j: dict) -> str:
    if j.get("na"):
        return "n/a"
    if j["oom"]:
        return "**OOM**"
    if j.get("alone"):
        return f"{j['margin']:.1%} (picks only)"
    rank = "—" if j["rank"] is None else f"{j['rank']}/{j['window']}"
    dom = " dom" if j["dominated"] else ""
    ratio = "—" if np.isnan(j["ratio"]) else f"{j['ratio']:.3f}"
    return f"{j['margin']:.1%} · {ratio} · {rank}{dom}"


def table(rows) -> str:
    head = "| scenario | rule | pred. margin | " + " | ".join(WORLDS) + " |"
    out = [head, "|" + "---|" * (3 + len(WORLDS))]
    for r in rows:
        out.append(f"| {r['scenario']} | {r['rule']} | {r['pred_margin']:.1%} | "
                   + " | ".join(_cell(r[w]) for w in WORLDS) + " |")
    return "\n".join(out)


def totals(rows) -> str:
    """Per rule over the scenarios: OOMs per world, goal misses (nominal world), worst ratio."""
    out = ["| rule | OOM nominal / spike / mb2 / seq2 | nominal: ratio > 1.05 | dominated | not Φ-best | "
           "not Φ-best of the undominated | worst ratio |", "|---|---|---|---|---|---|---|"]
    for rule in dict.fromkeys(r["rule"] for r in rows):
        rs = [r for r in rows if r["rule"] == rule]
        ooms = " / ".join(str(sum(1 for r in rs if not r[w].get("na") and r[w]["oom"])) for w in WORLDS)
        nom = [r["nominal"] for r in rs]
        slow = sum(1 for j in nom if not j["oom"] and j["ratio"] > 1.05)
        dom = sum(1 for j in nom if j["dominated"])
        notbest = sum(1 for j in nom if j["rank"] != 1)
        notfront = sum(1 for j in nom if j.get("front_rank") != 1)
        worst = max((j["ratio"] for j in nom if not j["oom"]), default=np.nan)
        out.append(f"| {rule} | {ooms} | {slow} | {dom} | {notbest} | {notfront} | {worst:.3f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--reach", type=float, default=1.10)
    ap.add_argument("--slack", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--space", choices=("catalog", "paper"), default="catalog")
    ap.add_argument("--predictor", choices=("analytic", "calibrated", "learned", "learned-calibrated"),
                    default="analytic")
    ap.add_argument("--assembly", choices=PIPELINE_ASSEMBLIES, default=None,
                    help="the search's pipeline_assembly (1F1B steady state, issues #22/#27); default: the YAML's")
    ap.add_argument("--nic-efficiency", type=float, default=None,
                    help="the clusters' nic_efficiency (docs/planner.md §Network); default: as the YAML, else the "
                         "runtime catalog's (0.9); 1.0: line rate")
    ap.add_argument("--oracle", action="store_true", help="also the floor rules applied to the measured metrics")
    ap.add_argument("--allowances", default="", help="e.g. 0.05,0.1: also least Φ above floor + allowance")
    ap.add_argument("--sample-floors", default="", help="e.g. 0.1,0.2,0.3: the small-sample mode (`sample`)")
    ap.add_argument("--rules", default=",".join(PICK_RULES), help="the rules searched (e.g. the floor rules only)")
    ap.add_argument("--population-worlds", default=",".join(WORLDS),
                    help="worlds the whole population runs in (the picks: all four), e.g. nominal,spike")
    ap.add_argument("--dump", default="", help="folder: each scenario's population as a pickle (analysis)")
    ap.add_argument("--fastest", type=int, default=5, help="sample mode: the N fastest predicted safe plans")
    args = ap.parse_args(argv)
    bad = sorted(set(args.population_worlds.split(",")) - set(WORLDS)) + ([] if "nominal" in args.population_worlds.split(",") else ["(nominal missing)"])
    if bad:
        ap.error(f"--population-worlds: {', '.join(bad)}; allowed: {', '.join(WORLDS)}, nominal among them")
    with contextlib.ExitStack() as stack:
        if args.predictor.startswith("learned"):  # the registry, store and caches of this run only
            home = stack.enter_context(tempfile.TemporaryDirectory(prefix="memx-dq-"))
            stack.enter_context(_env(MEMX_HOME=home, MLFLOW_TRACKING_URI=None))
        if args.sample_floors:
            floors = tuple(float(f) for f in args.sample_floors.split(","))
            for name in args.scenarios.split(","):
                print(sample(name, floors=floors, fastest=args.fastest, seed=args.seed, space=args.space,
                             kind=args.predictor, assembly=args.assembly) + "\n")
            return 0
        rows, infos = run(args)
    print(f"predictor {args.predictor}, space {args.space}, pipeline_assembly {args.assembly or 'as the YAML'}, "
          f"nic_efficiency {args.nic_efficiency or 'as the YAML / runtime catalog'}, simulator seed {args.seed}")
    print("cell = measured margin · T / T* (fastest safe) · Φ rank in the window / window size [dom = dominated]\n")
    print(table(rows))
    print()
    print(totals(rows))
    print()
    print("| scenario | population | measured / predicted time (p5–p95) | Spearman | train s | search s "
          "| simulate s |")
    print("|---|---|---|---|---|---|---|")
    for i in infos:
        print(f"| {i['scenario']} | {i['population']} | {i['ratio_p5']:.2f}–{i['ratio_p95']:.2f} | "
              f"{i['spearman']:.2f} | {i['train_s']:.0f} | {i['search_s']:.0f} | {i['simulate_s']:.0f} |")
    return 0


def run(args):
    rows, infos = [], []
    for name in args.scenarios.split(","):
        r, info, _ = scenario(name, reach=args.reach, slack=args.slack, seed=args.seed, space=args.space,
                               assembly=args.assembly, nic_efficiency=args.nic_efficiency,
                               oracle=args.oracle, kind=args.predictor, dump=args.dump,
                               rules=tuple(args.rules.split(",")), worlds=tuple(args.population_worlds.split(",")),
                               allowances=tuple(float(a) for a in args.allowances.split(",") if a))
        rows += r
        infos.append(info)
        print(f"{name}: population {info['population']}, train {info['train_s']:.1f} s, "
              f"search {info['search_s']:.1f} s, simulate {info['simulate_s']:.1f} s", file=sys.stderr, flush=True)
    return rows, infos


@contextlib.contextmanager
def _env(**values):
    """Environment variables set (None: unset) for the block, restored after."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


if __name__ == "__main__":
    sys.exit(main())
