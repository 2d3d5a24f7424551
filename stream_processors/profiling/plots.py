"""PNG plots of a :class:`~stream_processors.profiling.report.ProfileReport` (matplotlib, Agg).

The seed's figures, one file each, written into a directory:

- ``cdf_steps.png``: per-step request-completion CDF on relative rollout time (x = share
  of the step's rollout time, y = share of requests done), with the 40 % / 80 % guides;
- ``cdf_workers_step<N>.png``: per-worker completion CDF of one step in seconds;
  straggler workers drawn thick and red;
- ``event_share.png``: each event's share of total time over steps (stacked; the seven
  largest events by average share, the rest as "other");
- ``turns.png``: engine time per turn index over steps; mean request time by turn count;
  share of requests by turn count over steps;
- ``step_times.png``: step span and rollout time per step, slow steps (beyond ``k x`` the
  recent median) and straggler steps marked.

matplotlib is imported when a plot is drawn (the Agg backend: no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stream_processors.profiling.report import ProfileReport

TOP_EVENTS = 7


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_steps(*axes: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def write_plots(report: ProfileReport, out_dir: str | Path, step: int | None = None) -> list[Path]:
    """Write every plot of ``report`` into ``out_dir`` (created); the paths written.
    ``step`` picks the per-worker CDF's step (default: ``report.focus_step``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not report.steps:
        return []
    chosen = report.focus_step if step is None else step
    return [
        plot_step_cdfs(report, out / "cdf_steps.png"),
        plot_worker_cdfs(report, chosen, out / f"cdf_workers_step{chosen}.png"),
        plot_event_share(report, out / "event_share.png"),
        plot_turns(report, out / "turns.png"),
        plot_step_times(report, out / "step_times.png"),
    ]


def plot_step_cdfs(report: ProfileReport, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    steps = [s for s in report.steps if s.completion_quantiles_s and s.rollout_s]
    cmap = plt.get_cmap("viridis")
    for i, s in enumerate(steps):
        q = s.completion_quantiles_s
        xs = [v / s.rollout_s for v in q]
        ys = [j / (len(q) - 1) for j in range(len(q))]
        label = f"step {s.step}" if len(steps) <= 10 else None
        ax.plot(xs, ys, color=cmap(i / max(1, len(steps) - 1)), lw=1.2, alpha=0.8, label=label)
    ax.axvline(0.4, color="grey", ls="--", lw=0.8)
    ax.axhline(0.8, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("share of the step's rollout time")
    ax.set_ylabel("share of requests completed")
    ax.set_xlim(0, 1.0)
    ax.set_ylim(0, 1.02)
    ax.set_title(f"request completion CDF per step ({report.run_id})")
    if steps and len(steps) <= 10:
        ax.legend(fontsize=7)
    elif steps:
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(steps[0].step, steps[-1].step))
        fig.colorbar(sm, ax=ax, label="step")
    if not steps:
        ax.text(0.5, 0.5, "no completed requests traced", ha="center", transform=ax.transAxes)
    return _save(fig, path)


def plot_worker_cdfs(report: ProfileReport, step: int | None, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    workers = report.workers.get(step, []) if step is not None else []
    stragglers = {s.worker for s in report.stragglers if s.step == step}
    for w in workers:
        q = w.completion_quantiles_s
        if not q:
            continue
        ys = [j / (len(q) - 1) * w.completed_requests for j in range(len(q))]
        slow = w.worker in stragglers
        ax.step(
            q,
            ys,
            where="post",
            lw=2.5 if slow else 1.0,
            color="red" if slow else None,
            label=f"worker {w.worker}" + (" (straggler)" if slow else ""),
        )
    ax.set_xlabel("seconds since the step's rollout started")
    ax.set_ylabel("requests completed")
    ax.set_title(f"per-worker completion, step {step}")
    if workers:
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, f"no workers traced in step {step}", ha="center", transform=ax.transAxes)
    return _save(fig, path)


def plot_event_share(report: ProfileReport, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    top = list(report.event_share_avg)[:TOP_EVENTS]
    xs = [s.step for s in report.steps]
    series = []
    for name in top:
        series.append([dict(s.event_share).get(name, 0.0) or 0.0 for s in report.steps])
    other = [max(0.0, 1.0 - sum(col)) for col in zip(*series)] if series else []
    labels = list(top)
    if other and any(v > 1e-9 for v in other):
        series.append(other)
        labels.append("other")
    if series:
        ax.stackplot(xs, [[100 * v for v in row] for row in series], labels=labels, alpha=0.85)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel("step")
    ax.set_ylabel("% of total traced time")
    ax.set_ylim(0, 100)
    ax.set_title("event share of total time per step")
    _integer_steps(ax)
    return _save(fig, path)


def plot_turns(report: ProfileReport, path: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    xs = [s.step for s in report.steps]
    turn_ids = sorted(report.engine_s_by_turn)
    for t in turn_ids:
        ys = [dict(s.engine_s_by_turn).get(str(t)) for s in report.steps]
        axes[0].plot(
            xs, [float("nan") if v is None else v for v in ys], marker=".", label=f"turn {t}"
        )
    axes[0].set_title("mean engine time per turn")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("seconds")
    counts = sorted(report.request_s_by_turns)
    axes[1].bar([str(c) for c in counts], [report.request_s_by_turns[c] for c in counts])
    axes[1].set_title("mean request time by number of turns")
    axes[1].set_xlabel("turns")
    axes[1].set_ylabel("seconds")
    n_turns = sorted(report.turn_histogram)
    shares = []
    for n in n_turns:
        row = []
        for s in report.steps:
            hist = {int(k): int(v or 0) for k, v in s.turn_histogram}
            total = sum(hist.values())
            row.append(100 * hist.get(n, 0) / total if total else 0.0)
        shares.append(row)
    if shares:
        axes[2].stackplot(xs, shares, labels=[f"{n} turn(s)" for n in n_turns], alpha=0.85)
    axes[2].set_title("share of requests by number of turns")
    axes[2].set_xlabel("step")
    axes[2].set_ylabel("% of requests")
    _integer_steps(axes[0], axes[2])
    for ax in (axes[0], axes[2]):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if not turn_ids:
        axes[0].text(0.5, 0.5, "no turns traced", ha="center", transform=axes[0].transAxes)
    return _save(fig, path)


def plot_step_times(report: ProfileReport, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [s.step for s in report.steps]
    ax.plot(xs, [s.step_span_s for s in report.steps], marker=".", label="step span (s)")
    ax.plot(
        xs,
        [s.rollout_s if s.rollout_s is not None else float("nan") for s in report.steps],
        lw=0.8,
        ls="--",
        label="rollout: last request done (s)",
    )
    slow = [s for s in report.steps if s.slow_step]
    ax.scatter(
        [s.step for s in slow],
        [s.step_span_s for s in slow],
        s=120,
        marker="x",
        color="red",
        zorder=3,
        label="slow step (> k x recent median)",
    )
    strag = [s for s in report.steps if s.straggler_workers]
    ax.scatter(
        [s.step for s in strag],
        [s.step_span_s for s in strag],
        s=90,
        marker="^",
        facecolors="none",
        edgecolors="darkorange",
        zorder=3,
        label="straggler worker",
    )
    for s in slow + strag:
        ax.annotate(
            str(s.step),
            (s.step, s.step_span_s),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=7,
        )
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title(f"rollout time per step ({report.run_id})")
    _integer_steps(ax)
    ax.legend(fontsize=7)
    return _save(fig, path)
