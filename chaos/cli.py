"""``raftmq-chaos``: run one chaos test (long or short) and write its report.

    raftmq-chaos --time-limit 600 --nemesis all --seed 7 --nodes 5
    raftmq-chaos --nemesis partition,kills --time-limit 120
    raftmq-chaos --workload receive --nemesis kill-leader,partition-leader --time-limit 300
    raftmq-chaos --workload sqs --nemesis kills,partition --time-limit 120   # boto3 through SQS
    raftmq-chaos --recheck store/chaos/20250101T000000/     # check a history again, redraw
    raftmq-chaos --build-only                               # just build the images

Exit status: 0 valid, 1 invalid (a checker failed, or no recovery), 2 a usage error (an option or
a spec ``check_spec`` refuses, before any image is built) or the harness failed.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click

__all__ = ["main"]


def _env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--env")
        env[key] = value
    return env


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--time-limit",
    "time_limit_s",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds of workload under faults (setup, heal and drain come on top).",
)
@click.option(
    "--nemesis",
    "nemesis",
    default="all",
    show_default=True,
    help="all, none, or a comma list of: partition, kills, power-losses, or single nemesis names.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the fault schedule and targets.")
@click.option(
    "--nodes",
    type=click.Choice(["1", "3", "5"]),
    default="3",
    show_default=True,
    help="1: replication 1 (a lone voter in every group; faults that need peers are left out), 3 or 5.",
)
@click.option("--rate", type=float, default=120.0, show_default=True, help="Produce attempts per second.")
@click.option(
    "--producers",
    type=click.IntRange(min=0),
    default=None,
    help="Producer workers (default 8 per node; 0: none, with --load-rate or the SQS workload writing).",
)
@click.option(
    "--workload",
    type=click.Choice(["queue", "receive", "both", "sqs", "all"]),
    default="queue",
    show_default=True,
    help="Consume by offset (queue), through receive/ack in one group (receive), or both at once; "
    "sqs: boto3 clients through the SQS API alone (SendMessageBatch, ReceiveMessage, "
    "DeleteMessageBatch); all: both and sqs.",
)
@click.option(
    "--sqs-rate",
    type=click.FloatRange(min=1),
    default=200.0,
    show_default=True,
    help="Messages a second offered through SendMessageBatch by the SQS workload's senders.",
)
@click.option(
    "--producer-client",
    type=click.Choice(["attempt", "producer", "mixed"]),
    default="mixed",
    show_default=True,
    help="Single attempts through the producer's node, the client's retrying AsyncProducer, or half each.",
)
@click.option(
    "--quiet",
    "quiet_s",
    type=(float, float),
    default=(3.0, 6.0),
    show_default=True,
    help="Seconds without a fault between two faults (min max).",
)
@click.option(
    "--fault",
    "fault_s",
    type=(float, float),
    default=(6.0, 10.0),
    show_default=True,
    help="Seconds each fault lasts (min max).",
)
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="KEY=VALUE",
    help="Environment for every node, e.g. RAFTMQ_FAULTS_ACK_BEFORE_REPLICATION=true.",
)
@click.option(
    "--retention-ms",
    type=click.IntRange(min=1),
    default=None,
    help="The topic's retention_ms (default: none); hours, so that a removed message is lost.",
)
@click.option(
    "--load-rate",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Production load: messages a second offered through the client's batch path (0: none).",
)
@click.option("--load-producers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--load-processes",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Processes the load's producers run in (the harness's own event loop is one core at most).",
)
@click.option(
    "--load-consumers",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Members of the consumer group chaos-load reading the topic during the load (0: none).",
)
@click.option(
    "--disk-mb",
    type=click.IntRange(min=64),
    default=256,
    show_default=True,
    help="Each node's volume in MiB (a tmpfs when run as root); a soak at production load needs more.",
)
@click.option("--name", default=None, help="Report folder name under the store (default chaos-<nemesis>).")
@click.option(
    "--store", type=click.Path(file_okay=False, path_type=Path), default=Path("store"), show_default=True
)
@click.option(
    "--build/--no-build",
    "build",
    default=True,
    show_default=True,
    help="Build the images first (the base only when missing).",
)
@click.option("--build-only", is_flag=True, help="Build the images and exit.")
@click.option(
    "--recheck",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Re-run the checkers and the plots on a finished run's folder.",
)
@click.option("-v", "--verbose", is_flag=True)
def main(
    time_limit_s: float, nemesis: str, seed: int, nodes: str, rate: float, producers: int | None,
    workload: str, sqs_rate: float, producer_client: str, quiet_s: tuple[float, float],
    fault_s: tuple[float, float],
    env: tuple[str, ...], retention_ms: int | None, load_rate: float, load_producers: int,
    load_processes: int, load_consumers: int, disk_mb: int,
    name: str | None, store: Path, build: bool,
    build_only: bool, recheck: Path | None, verbose: bool,
) -> None:  # fmt: skip
    """Run a Jepsen-style chaos test against raftmq nodes in containers."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    logging.getLogger("testcontainers").setLevel(logging.WARNING)
    if recheck is not None:
        sys.exit(_recheck(recheck))
    from .nemesis import parse_faults

    try:
        faults = parse_faults(nemesis, int(nodes))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--nemesis") from None
    from .runner import ChaosSpec, check_spec, run

    spec = ChaosSpec(
        name=name or f"chaos-{_prefix(workload)}{nemesis.replace(',', '+')}-n{nodes}",
        nodes=int(nodes),
        faults=tuple(faults),
        time_limit_s=time_limit_s,
        seed=seed,
        quiet_s=quiet_s,
        fault_s=fault_s,
        rate=rate,
        producers=producers,
        workload=workload,
        sqs_rate=sqs_rate,
        producer_client=producer_client,
        env=_env_pairs(env),
        retention_ms=retention_ms,
        load_rate=load_rate,
        load_producers=load_producers,
        load_processes=load_processes,
        load_consumers=load_consumers,
        disk_mb=disk_mb,
        store=store,
    )
    try:  # a spec the run cannot honour is the caller's mistake: refused before any image is built
        check_spec(spec)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if build or build_only:
        from .images import build_images

        build_images()
        if build_only:
            return
    started = time.monotonic()
    try:
        result = run(spec)
    except Exception:
        logging.getLogger("raftmq.chaos").exception("the chaos run failed")
        sys.exit(2)
    click.echo((result.directory / "summary.txt").read_text())
    click.echo(f"report: {result.directory}  ({time.monotonic() - started:.0f} s)")
    sys.exit(0 if result.valid else 1)


def _prefix(workload: str) -> str:
    return "" if workload == "queue" else f"{workload}-"


def _recheck(directory: Path) -> int:
    import resource

    from .history import HistoryFile
    from .logscan import scan_logs
    from .report import write_report
    from .streaming import check_file

    old = (
        json.loads((directory / "results.json").read_text()) if (directory / "results.json").exists() else {}
    )
    started = time.monotonic()
    checks, figures = check_file(directory / "history.jsonl")
    run_info = old.get("run", {"faults_injected": {}, "recovery_s": None, "drain": {}})
    if (directory / "logs").is_dir():
        run_info["log_alerts"] = scan_logs(directory / "logs")
    valid = (
        checks["valid"]
        and run_info.get("recovery_s") is not None
        and run_info.get("drain", {}).get("complete")
        and run_info.get("receive_drain", {"complete": True}).get("complete")
        and run_info.get("sqs_drain", {"complete": True}).get("complete")
    )
    results = {**old, "valid": bool(valid), "run": run_info, "checks": checks}
    results.setdefault("spec", {"nodes": "?", "seed": "?", "time_limit_s": "?", "faults": []})
    name = str(old.get("test", directory.parent.name))
    write_report(directory, name, HistoryFile(directory / "history.jsonl"), results)
    click.echo((directory / "summary.txt").read_text())
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    seconds = time.monotonic() - started
    click.echo(
        f"checked {figures['history_bytes'] / 2**20:.0f} MiB of history in {seconds:.0f} s "
        f"({figures['buckets']} buckets, at most {figures['largest_bucket_records']} records in one); "
        f"peak RSS {peak_mib} MiB"
    )
    return 0 if valid else 1


if __name__ == "__main__":
    main()
