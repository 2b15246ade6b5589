"""The experiments' figures (matplotlib, Agg backend, PNG, small: ~6×4 in at 100 dpi)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

DPI = 100
MARKERS = {"amp": "s", "metis": "D", "hexiscale": "v", "fasop": "^", "ours": "*", "ours-uniform": "P",
           "ours-default": "X", "ours-safety": "h", "ours-throughput": "p", "fastest": "o"}


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def predicted_vs_measured(series: dict[str, tuple[np.ndarray, np.ndarray]], path: Path, *, what: str = "iteration time (ms)") -> Path:
    """Scatter of predicted vs measured, one colour per method, y = x line."""
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    lo, hi = np.inf, 0.0
    for name, (pred, meas) in series.items():
        ax.scatter(meas, pred, s=10, alpha=0.6, label=name, marker=MARKERS.get(name, "o"))
        lo, hi = min(lo, np.min(meas), np.min(pred)), max(hi, np.max(meas), np.max(pred))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"measured {what} (virtual cluster)")
    ax.set_ylabel(f"predicted {what}")
    ax.legend(fontsize=8)
    return _save(fig, path)


def search_cost(points: list[tuple[str, float, float]], amp_s_per_config: float, path: Path) -> Path:
    """log-log seconds vs configurations: MemX searches (label, configs, seconds) and AMP's extrapolation."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    xs = np.array([p[1] for p in points], dtype=float)
    for label, n, s in points:
        ax.scatter([n], [s], s=30)
        ax.annotate(label, (n, s), fontsize=7, xytext=(3, 3), textcoords="offset points")
    grid = np.logspace(np.log10(max(xs.min() / 3, 1)), np.log10(xs.max() * 3), 50)
    ax.plot(grid, grid * amp_s_per_config, "r-", label=f"AMP-style profile every plan ({amp_s_per_config:.0f} s/plan)")
    ax.axhline(86400, color="grey", lw=0.8, ls=":")
    ax.text(grid[0], 86400 * 1.3, "1 day", fontsize=7, color="grey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("configurations scored")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
    return _save(fig, path)


def memory_bars(gpus: list[str], bars: dict[str, np.ndarray], capacity: np.ndarray, path: Path) -> Path:
    """Per-GPU peak memory (GiB) of two or more plans side by side, with each GPU's capacity."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    n = max(len(v) for v in bars.values())
    x = np.arange(n)
    width = 0.8 / len(bars)
    for i, (label, peaks) in enumerate(bars.items()):
        ax.bar(x[:len(peaks)] + i * width - 0.4 + width / 2, np.asarray(peaks) / 1024, width, label=label)
    ax.step(np.arange(len(capacity) + 1) - 0.5, np.append(capacity, capacity[-1]) / 1024, where="post", color="k",
            lw=1, label="capacity")
    ax.set_xticks(x)
    ax.set_xticklabels(gpus[:n], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("peak memory (GiB)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def pareto_tv(t: np.ndarray, v: np.ndarray, picks: dict[str, tuple[float, float]], path: Path) -> Path:
    """Measured plans in (T, V), their Pareto front, and each method's pick."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter(t, v, s=8, c="lightgrey", label="measured plans")
    order = np.argsort(t)
    front, best = [], np.inf
    for i in order:
        if v[i] < best:
            best = v[i]
            front.append(i)
    ax.plot(t[front], v[front], "k-", lw=1, label="Pareto front (T, V)")
    for name, (pt, pv) in picks.items():
        ax.scatter([pt], [pv], s=70, marker=MARKERS.get(name, "o"), label=name, edgecolors="k", zorder=3)
    ax.set_yscale("symlog", linthresh=1e4)
    ax.set_xlabel("measured iteration time T (ms)")
    ax.set_ylabel("measured memory variance V (MiB²)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def scaling(gpus: np.ndarray, seconds: np.ndarray, mape: np.ndarray, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(gpus, seconds, "o-", label="search time (s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("search seconds")
    ax2 = ax.twinx()
    ax2.plot(gpus, 100 * np.asarray(mape), "s--", color="tab:red", label="time MAPE (%)")
    ax2.set_ylabel("iteration-time MAPE (%)", color="tab:red")
    fig.legend(fontsize=8, loc="upper left")
    return _save(fig, path)
