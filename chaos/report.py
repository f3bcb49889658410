"""The report of one run: ``store/<test>/<timestamp>/``.

- ``history.jsonl``: written by ``History`` as the run goes. The plots walk it (a list or a
  ``HistoryFile``, read again on each walk) and hold only what they draw.
- ``results.json``: the test's settings, what happened at the end (recovery, drain) and every
  checker's result.
- ``latency.png``: every enqueue, fetch, receive and ack as a point (time, latency), coloured by
  outcome, with the fault windows shaded (Jepsen's perf plots).
- ``throughput.png``: completions per second by outcome, same shading.
- ``resources.png``: each node's RSS, open files and data-directory size over the run
  (``chaos/resources.py``).
- ``summary.txt``: the verdict and the numbers a person looks at first.
- ``logs/``: each node's container log.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .history import Op, completed, fault_windows, nemesis_ops
from .resources import plot_resources

__all__ = ["latency_points", "outline", "plot_latency", "plot_throughput", "summary_text", "write_report"]

# Points of one series (function, outcome) the latency plot draws at most; a soak's millions are
# sampled down evenly (the plot would hold them all in memory and show a blot).
MAX_POINTS = 200_000
PLOTTED = {"enqueue": ("o", "-"), "fetch": ("^", ":"), "receive": ("s", "--"), "ack": ("D", "-."),
           "sqs-send": ("v", "-"), "sqs-receive": ("P", "--"), "sqs-delete": ("X", "-.")}  # fmt: skip

COLORS = {"ok": "#2a9d3f", "fail": "#d62728", "info": "#ff9f1c", "pending": "#7f7f7f"}
FAULT_COLORS = ["#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8",
                "#ffbb78", "#98df8a", "#c5b0d5"]  # fmt: skip


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


Windows = list[tuple[str, int, int | None]]


def outline(history: Iterable[Op]) -> tuple[Windows, int]:
    """The fault windows and the last operation's time, in one walk (each plot needs both)."""
    nemesis, end = nemesis_ops(history)
    return fault_windows(nemesis), end


def _shade(ax: Any, shape: tuple[Windows, int]) -> None:
    """Shade each fault window, one colour (and one legend entry) per kind of fault."""
    windows, end_ns = shape
    end = end_ns / 1e9
    colors: dict[str, str] = {}
    for fault, start, stop in windows:
        first = fault not in colors
        color = colors.setdefault(fault, FAULT_COLORS[len(colors) % len(FAULT_COLORS)])
        stop_s = stop / 1e9 if stop is not None else end
        ax.axvspan(start / 1e9, stop_s, color=color, alpha=0.18, lw=0, label=fault if first else None)


def _new_axes(plt: Any, title: str, ylabel: str) -> tuple[Any, Any]:
    fig, ax = plt.subplots(figsize=(12, 6), dpi=100)
    ax.set_title(title)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _legend(ax: Any, **kw: Any) -> None:
    """Below the plot, so that it hides no data."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=7, ncol=7, frameon=False, **kw)


def latency_points(
    history: Iterable[Op], max_points: int = MAX_POINTS
) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """(function, outcome) -> (invoke times in s, latencies in ms) of the plotted operations; past
    ``max_points`` a series keeps an even sample of its points (reservoir sampling, seeded)."""
    points: dict[tuple[str, str], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    seen: Counter[tuple[str, str]] = Counter()
    rng = random.Random(0)
    for invoke, done in completed(history):
        if invoke["f"] not in PLOTTED or done is None:
            continue
        series = (invoke["f"], done["type"])
        xs, ys = points[series]
        seen[series] += 1
        slot = len(xs) if len(xs) < max_points else rng.randrange(seen[series])
        if slot < max_points:
            x, y = invoke["time"] / 1e9, max((done["time"] - invoke["time"]) / 1e6, 0.01)
            if slot == len(xs):
                xs.append(x)
                ys.append(y)
            else:
                xs[slot], ys[slot] = x, y
    return points


def plot_latency(
    history: Iterable[Op], path: Path, title: str, shape: tuple[Windows, int] | None = None
) -> None:
    """``shape``: the history's :func:`outline`, if known (a walk less)."""
    plt = _plt()
    fig, ax = _new_axes(plt, f"{title}: latency", "latency (ms)")
    _shade(ax, shape or outline(history))
    for (f, kind), (xs, ys) in sorted(latency_points(history).items()):
        marker = PLOTTED[f][0]
        ax.scatter(xs, ys, s=6, marker=marker, color=COLORS[kind], alpha=0.6, label=f"{f} {kind}", lw=0)
    ax.set_yscale("log")
    _legend(ax, markerscale=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_throughput(
    history: Iterable[Op],
    path: Path,
    title: str,
    bucket_s: float | None = None,
    shape: tuple[Windows, int] | None = None,
) -> None:
    """Completions per second in buckets of ``bucket_s`` (default: 1 s, or 1/300 of a long run);
    ``shape``: the history's :func:`outline`, if known."""
    plt = _plt()
    shape = shape or outline(history)
    if bucket_s is None:
        bucket_s = max(1.0, round(shape[1] / 1e9 / 300))
    fig, ax = _new_axes(plt, f"{title}: throughput", "completions / s")
    _shade(ax, shape)
    counts: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    end = 0
    for invoke, done in completed(history):
        if invoke["f"] not in PLOTTED or done is None:
            continue
        b = int(done["time"] / 1e9 / bucket_s)
        end = max(end, b)
        counts[(invoke["f"], done["type"])][b] += 1
    for (f, kind), by_bucket in sorted(counts.items()):
        xs = [b * bucket_s for b in range(end + 1)]
        ys = [by_bucket.get(b, 0) / bucket_s for b in range(end + 1)]
        style = PLOTTED[f][1]
        ax.plot(xs, ys, style, color=COLORS[kind], lw=1.2, label=f"{f} {kind}")
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summary_text(name: str, results: dict[str, Any]) -> str:
    checks = results["checks"]
    names = ("total_queue", "log_consistency", "queue_order", "lost_write", "availability")
    tq, lc, order, lw, av = (checks[k] for k in names)
    spec = results["spec"]
    lines = [
        f"{name}: {'VALID' if results['valid'] else 'INVALID'}",
        f"  nodes {spec['nodes']}, seed {spec['seed']}, time limit {spec['time_limit_s']} s, "
        f"nemeses: {', '.join(spec['faults']) or 'none'}",
        f"  faults injected: {results['run']['faults_injected']}",
        f"  recovery after heal: {results['run']['recovery_s']} s; drain: {results['run']['drain']}",
        f"  replicas behind the drained high offset after the wait: "
        f"{results['run'].get('replicas', {}).get('lagging_replicas') or 'none'}",
        f"  node log alerts: {results['run'].get('log_alerts') or 'none'}",
        "total queue  "
        f"attempts {tq['attempt_count']}, acknowledged {tq['acknowledged_count']}, "
        f"failed {tq['failed_count']}, indefinite {tq['indefinite_count']}, "
        f"dequeued {tq['dequeue_count']}",
        f"  lost {tq['lost_count']}, unexpected {tq['unexpected_count']}, "
        f"duplicated {tq['duplicated_count']} ({tq.get('duplicated_idempotent_count', 0)} sent by the "
        f"idempotent producer), recovered {tq['recovered_count']} "
        f"({tq['recovered_after_definite_fail_count']} after a definite fail)",
        f"log consistency  {'ok' if lc['valid'] else 'DIVERGED'}: {lc['positions_checked']} positions, "
        f"{lc['divergent_count']} divergent, {lc['duplicate_offsets_count']} values at several offsets",
        f"queue order  {'ok' if order['valid'] else 'VIOLATED'}: {order['problem_count']} problems",
        f"lost write  {'ok' if lw['valid'] else 'LOST'}: {lw['checked']} checked, {lw['lost_count']} lost",
        f"availability  ok share during faults {av['during_faults']['ok_share']}, "
        f"outside {av['outside_faults']['ok_share']}",
    ]
    for fault, b in av["by_fault"].items():
        lines.append(
            f"  {fault:18} ok {b['ok']:6}  fail {b['fail']:6}  info {b['info']:5}  share {b['ok_share']}"
        )
    for loss in results["run"].get("power_losses", []):
        lines.append(
            f"  power loss #{loss['fault_id']} ({loss['fault']}): "
            f"unsynced bytes dropped {loss['dropped_bytes']}"
        )
    lines += _load_lines(results["run"].get("load"), checks.get("group_consume"))
    lines += _resource_lines(results["run"].get("resources"))
    lines += _receive_lines(checks.get("receive_ack"), results["run"].get("receive_drain"))
    lines += _sqs_lines(checks.get("sqs_queue"), results["run"].get("sqs_drain"))
    if tq["lost"]:
        lines.append(f"lost (sample): {', '.join(tq['lost'])}")
    if lc["divergent"]:
        lines.append(f"divergent (first): {json.dumps(lc['divergent'][0])}")
    return "\n".join(lines) + "\n"


def _load_lines(load: dict[str, Any] | None, group: dict[str, Any] | None) -> list[str]:
    lines = []
    if load is not None:
        lines.append(
            f"production load  offered {load['offered']} ({load['offered_per_s']}/s), acknowledged "
            f"{load['acknowledged']} ({load.get('acknowledged_per_s')}/s)"
        )
    if group is not None:
        lines += [
            f"group consumers  {'ok' if group['valid'] else 'INVALID'}: consumed {group['consumed_count']} "
            f"({group['delivery_count']} deliveries, {group['redelivered_count']} redelivered), final "
            f"committed {group['committed_total']} (covering {group['acknowledged_below_committed']} "
            f"acknowledged), {group['committed_reads']} committed reads",
            f"  skipped {group['skipped_count']}, backwards {group['backwards_count']}, divergent "
            f"{group['divergent_count']}, unexpected {group['unexpected_count']}",
        ]
    return lines


def _resource_lines(resources: dict[str, Any] | None) -> list[str]:
    if not resources or not resources["summary"]["nodes"]:
        return []
    summary = resources["summary"]
    verdict = {True: "bounded", False: "GROWING", None: "not judged (under 5 minutes)"}[summary["bounded"]]
    lines = [f"node resources  {verdict} ({summary['rule']}; resources.png)"]
    for node, metrics in summary["nodes"].items():
        parts = []
        for metric, m in metrics.items():
            unit = 1 << 20 if metric.endswith("bytes") else 1
            figures = "/".join(f"{m[k] / unit:.0f}" for k in ("first", "peak", "last"))
            parts.append(f"{metric.removesuffix('_bytes')} {figures}{' MiB' if unit > 1 else ''}"
                         f"{' GROWING' if m['bounded'] is False else ''}")  # fmt: skip
        lines.append(f"  {node} (first/peak/last): {', '.join(parts)}")
    return lines


def _receive_lines(rx: dict[str, Any] | None, drain: dict[str, Any] | None) -> list[str]:
    if rx is None:
        return []
    lines = [
        f"receive/ack  {'ok' if rx['valid'] else 'INVALID'}: acknowledged {rx['acknowledged_count']}, "
        f"received {rx['received_count']} ({rx['delivery_count']} deliveries), acked {rx['acked_count']} "
        f"(+{rx['ack_unknown_count']} unknown); drain: {drain}",
        f"  lost {rx['lost_count']}, unexpected {rx['unexpected_count']}, never acked "
        f"{rx['never_acked_count']}, divergent {rx['divergent_count']}; duplicated {rx['duplicated_count']}, "
        f"redelivered {rx['redelivered_count']}, stale acks {rx['stale_ack_count']}, delivered after an "
        f"ok ack {rx['delivered_after_ack_count']}, recovered {rx['recovered_count']}",
    ]
    if rx["lost"]:
        lines.append(f"  receive lost (sample): {', '.join(rx['lost'])}")
    if rx["never_acked"]:
        lines.append(f"  never acked (sample): {', '.join(rx['never_acked'])}")
    return lines


def _sqs_lines(sq: dict[str, Any] | None, drain: dict[str, Any] | None) -> list[str]:
    if sq is None:
        return []
    lines = [
        f"sqs total queue  {'ok' if sq['valid'] else 'INVALID'}: attempts {sq['attempt_count']}, "
        f"acknowledged {sq['acknowledged_count']}, failed {sq['failed_count']}, indefinite "
        f"{sq['indefinite_count']}, received {sq['received_count']} ({sq['delivery_count']} deliveries); "
        f"drain: {drain}",
        f"  lost {sq['lost_count']}, unexpected {sq['unexpected_count']}, never deleted "
        f"{sq['never_deleted_count']}; duplicated {sq['duplicated_count']}, redelivered "
        f"{sq['redelivered_count']}, recovered {sq['recovered_count']}",
        f"  deleted {sq['deleted_count']} (+{sq['delete_unknown_count']} unknown, {sq['stale_delete_count']} "
        f"with an older receipt), delivered again after an ok delete {sq['delivered_after_delete_count']}",
    ]
    if sq["lost"]:
        lines.append(f"  sqs lost (sample): {', '.join(sq['lost'])}")
    if sq["never_deleted"]:
        lines.append(f"  never deleted (sample): {', '.join(sq['never_deleted'])}")
    if sq["delivered_after_delete"]:
        lines.append(f"  delivered after an ok delete (sample): {', '.join(sq['delivered_after_delete'])}")
    return lines


def write_report(
    directory: Path,
    name: str,
    history: Iterable[Op],
    results: dict[str, Any],
    shape: tuple[Windows, int] | None = None,
) -> None:
    """``history``: a list or a ``HistoryFile`` (walked once per plot and once for ``shape``, the
    history's :func:`outline`, unless given)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    (directory / "summary.txt").write_text(summary_text(name, results))
    shape = shape or outline(history)
    plot_latency(history, directory / "latency.png", name, shape)
    plot_throughput(history, directory / "throughput.png", name, shape=shape)
    resources = results.get("run", {}).get("resources")
    if resources:
        windows, end = shape
        spans = [(f, start / 1e9, (stop if stop is not None else end) / 1e9) for f, start, stop in windows]
        plot_resources(resources["samples"], spans, directory / "resources.png", name)
