"""What the benchmarks show: progress on stderr, a summary table, JSON, plots.

Progress lines go to stderr (`[3/12] collectives all_gather 16 MB ... 0.8 s`)
so stdout keeps only the results; the summary table is Markdown, ready for
docs/BENCHMARKS.md. Plots need matplotlib (`pip install "zipccl_jax[bench]"`),
imported only when a plot is asked for.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


class Progress:
    """Numbered progress lines for a run of `total` items, each timed."""

    def __init__(self, total: int, stream=None):
        self.total, self.done = total, 0
        self.stream = stream if stream is not None else sys.stderr
        self._started = None

    def start(self, what: str) -> None:
        self.done += 1
        self._started = time.perf_counter()
        print(f"[{self.done}/{self.total}] {what} ...", end="", file=self.stream, flush=True)

    def finish(self, note: str = "") -> None:
        took = time.perf_counter() - self._started
        print(f" {took:.1f} s" + (f" ({note})" if note else ""), file=self.stream, flush=True)


def format_value(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def table(rows: list[dict]) -> str:
    """Rows (dicts with the same keys) as a Markdown table."""
    if not rows:
        return "(no results)"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(format_value(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def save_json(path: str | Path, **results) -> None:
    Path(path).write_text(json.dumps(results, indent=2, default=str) + "\n")


def pyplot():
    """matplotlib.pyplot on a file-only backend, or a clear error."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit('--plot needs matplotlib: pip install "zipccl_jax[bench]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_plot(path: str | Path, title: str, groups: list[str], series: dict[str, list[float]], ylabel: str,
             notes: dict[str, list[str]] | None = None) -> None:
    """Grouped bars: one group per entry of `groups`, one bar per series;
    `notes` labels the bars of a series (e.g. the speedup)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.6 + 1.8 * len(groups), 4.2))
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        xs = [g + (k - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name)
        if notes and name in notes:
            ax.bar_label(bars, notes[name], padding=2, fontsize=8)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def line_plot(path: str | Path, title: str, x: list[float], series: dict[str, list[float]], xlabel: str,
              ylabel: str, logx: bool = True) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, values in series.items():
        ax.plot(x, values, marker="o", label=name)
    if logx:
        ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
