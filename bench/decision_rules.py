"""Candidate pick rules on dumped decision-quality populations (issue #22): does another rule remove the dominated
and not-Φ-best picks of bench/decision_quality.py, or are they prediction error?

  python bench/decision_quality.py [...] --dump /tmp/dq        # writes one pickle per scenario
  python bench/decision_rules.py '/tmp/dq/learned-catalog-s*'   # every candidate rule on every pickle

A dump holds the population of one scenario (every plan the search can score within `reach` of the fastest
predicted safe plan, bench/decision_quality.py), its predicted metrics (PlanMetrics: point time, point and
upper-bound margin, M, V, Φ), its measurements in the four worlds and each plan's iteration time at the
predictor's stage-time interval ends (`time_bounds`: the learned predictor's 90 % split-conformal band per GPU
type, memx.learn.intervals; the closed form gives none, factor 1). Since the population holds every plan a
floor rule can pick, a rule applied to it is the rule's pick (the first row, `balanced-front`, is checked
against the search's own pick). Candidates (margin = the search's floor margin: the upper-bound margin where
the predictor gives one; window = safe plans within (1 + balance_tolerance) × the fastest safe plan):

* the planner's floor rules (memx.planner.pick) — `balanced-front` (the default), `balanced-margin`,
  `fastest-above-floor`;
* `front: least T_high` — on the safe (T, margin) front within the window, the plan of least upper-bound time;
* `front: least Φ(T_high)` — the same front, least Φ with the upper-bound time in place of the point time;
* `T_high window, front, Φ` — window, front and Φ all on the upper-bound time;
* `interval front: least Φ` — the window's plans that no plan dominates beyond the intervals (no smaller
  margin and an upper-bound time ≤ the plan's lower-bound time), least Φ;
* `robust window, balanced-front` — the window's plans the closed form predicts to fit at micro batch × 2 and at
  sequence × 2 (bench/decision_quality.py's mb2 / seq2 worlds), then balanced-front; balanced-front's pick where
  none does (session 16: docs/results.md §The closed form calibrated on eight timed plans).
Output: each dump's cells (bench/decision_quality.py `_cell`) and the totals per candidate (nominal misses).
"""

from __future__ import annotations

import glob
import pickle
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.estimate import estimate_plans  # noqa: E402
from memx.planner.objective import log_score  # noqa: E402
from memx.planner.pick import choose  # noqa: E402


class _End:
    """The predictor with its time at one end of its interval ("low", "high"; "point": unchanged), memory as is,
    the assembly calibration and plan residual handed on (memx.planner.schedule.assembly_of, corrected_plans)."""

    def __init__(self, inner, end: str):
        self.inner, self.end, self.name = inner, end, f"{getattr(inner, 'name', 'predictor')}[{end}]"

    def __getattr__(self, attr):
        return getattr(self.inner, attr)  # assembly, correct_plans

    def predict(self, sigs):
        out = self.inner.predict(sigs).copy()
        col = f"time_ms_{self.end}"
        if self.end != "point" and col in out.columns:
            out["time_ms"] = out[col].where(out[col].notna(), out["time_ms"])
        return out


def time_bounds(plans, cl, mo, pred) -> dict:
    """Each plan's iteration time at the predictor's stage-time interval ends, as factors of its point estimate
    through the same assembly (memx.planner.estimate.estimate_plans): {"low": (N,), "high": (N,)}."""
    t = {e: np.array([m.iteration_time_ms for m in estimate_plans(plans, cl, mo, _End(pred, e))])
         for e in ("point", "low", "high")}
    return {e: t[e] / t["point"] for e in ("low", "high")}


def dump_population(folder: str, stem: str, keys, pool, meas, rows, info, bounds) -> None:
    """One scenario's population as `folder/stem.pkl` (a temporary name, then renamed)."""
    out = Path(folder) / f"{stem}.pkl"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps({"keys": keys, "pool": [pool[k] for k in keys], "meas": meas, "rows": rows,
                                  "info": info, "time_factor": bounds}))
    tmp.rename(out)


def _front(idx, t, m):
    """Members of idx no other member dominates on (t, m)."""
    return [i for i in idx if not any(t[j] <= t[i] and m[j] >= m[i] and (t[j] < t[i] or m[j] > m[i]) for j in idx)]


def candidates(d: dict, sp) -> dict:
    """{candidate: index of its pick in the dump's population}."""
    pool = d["pool"]
    mg = np.array([c.min_margin_high if c.min_margin_high is not None else c.min_margin for c in pool])
    t = np.array([c.iteration_time_ms for c in pool])
    t_hi, t_lo = t * d["time_factor"]["high"], t * d["time_factor"]["low"]
    phi = np.array([c.phi if c.phi is not None else np.inf for c in pool])
    mx, v = np.array([c.max_mem_mib for c in pool]), np.array([c.mem_variance_mib2 for c in pool])
    phi_hi = log_score(t_hi, mx, v, d["info"]["weights"], sp.epsilon_mib2)
    safe = [i for i in range(len(pool)) if mg[i] >= sp.margin_floor]
    out = {}
    index = {id(c): i for i, c in enumerate(pool)}
    for rule in ("balanced-front", "balanced-margin", "fastest-above-floor"):
        out[rule] = index[id(choose(pool[:1], pool[1:], rule=rule, margin_floor=sp.margin_floor,
                                    balance_tolerance=sp.balance_tolerance, margin=lambda c: mg[index[id(c)]]).plan)]

    def window(tt):
        t0 = min(tt[i] for i in safe)
        return [i for i in safe if tt[i] <= (1 + sp.balance_tolerance) * t0]

    front = _front(window(t), t, mg)
    out["front: least T_high"] = min(front, key=lambda i: (t_hi[i], -mg[i]))
    out["front: least Φ(T_high)"] = min(front, key=lambda i: (phi_hi[i], t[i]))
    out["T_high window, front, Φ"] = min(_front(window(t_hi), t_hi, mg), key=lambda i: (phi_hi[i], t_hi[i]))
    near = window(t)
    loose = [i for i in near if not any(j != i and mg[j] >= mg[i] and t_hi[j] <= t_lo[i] for j in near)]
    out["interval front: least Φ"] = min(loose, key=lambda i: (phi[i], t[i]))
    if "scenario" in d["info"]:  # closed-form dumps: the window's plans predicted to fit with doubled activations
        cl, mo = (f(n) for f, n in zip((load_cluster, load_model), d["info"]["scenario"].split("/")))
        pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
        robust = [i for i in near if _fits_doubled(pool[i].plan, cl, mo, pred)]
        out["robust window, balanced-front"] = out["balanced-front"] if not robust else index[id(choose(
            [pool[robust[0]]], [pool[i] for i in robust[1:]], rule="balanced-front", margin_floor=sp.margin_floor,
            balance_tolerance=sp.balance_tolerance, margin=lambda c: mg[index[id(c)]]).plan)]
    return out


def _fits_doubled(plan, cl, mo, pred) -> bool:
    """Whether the closed form `pred` predicts `plan` to fit at micro batch × 2 and at sequence × 2
    (bench/decision_quality's mb2 / seq2 worlds; a variant that is no valid plan does not count against it)."""
    from bench.decision_quality import _variant

    for w in ("mb2", "seq2"):
        try:
            (e,) = estimate_plans([_variant(plan, w)], cl, mo, pred)
        except Exception:  # the variant is not a valid plan (e.g. the micro batches no longer divide)
            continue
        if not e.feasible:
            return False
    return True


def main(argv=None) -> int:
    import argparse

    from bench.decision_quality import WORLDS, _cell, judge

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dumps", nargs="+", help="pickles of bench/decision_quality.py --dump (glob patterns)")
    ap.add_argument("--population-worlds", default="", help="for dumps that do not record them (default: all four)")
    args = ap.parse_args(argv)
    sp = load_search("default")
    files = sorted(f for pat in args.dumps for f in glob.glob(pat))
    totals: dict = {}
    for f in files:
        d = pickle.loads(Path(f).read_bytes())
        picks = candidates(d, sp)
        worlds = d["info"].get("worlds") or (args.population_worlds.split(",") if args.population_worlds else WORLDS)
        search = next(r for r in d["rows"] if r["rule"] == "balanced-front")
        same = abs(d["pool"][picks["balanced-front"]].iteration_time_ms - search["pred_ms"]) < 1e-6
        print(f"\n{Path(f).stem}: population {len(d['pool'])}, balanced-front here = the search's pick: {same}")
        for rule, i in picks.items():
            j = {w: judge(d["meas"][w], i, sp.margin_floor, sp.balance_tolerance, d["info"]["weights"],
                          sp.epsilon_mib2, w not in worlds) for w in WORLDS}
            print(f"| {rule} | " + " | ".join(_cell(j[w]) for w in WORLDS) + " |")
            totals.setdefault(rule, []).append(j)
    print("\n| candidate | OOM nominal / spike / mb2 / seq2 | ratio > 1.05 | dominated | not Φ-best | worst ratio |")
    print("|---|---|---|---|---|---|")
    for rule, js in totals.items():
        nom = [j["nominal"] for j in js]
        ooms = " / ".join(str(sum(1 for j in js if not j[w].get("na") and j[w]["oom"])) for w in WORLDS)
        print(f"| {rule} | {ooms} | {sum(1 for j in nom if not j['oom'] and j['ratio'] > 1.05)} | "
              f"{sum(j['dominated'] for j in nom)} | {sum(j['rank'] != 1 for j in nom)} | "
              f"{max(j['ratio'] for j in nom if not j['oom']):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
