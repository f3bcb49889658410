"""One chaos test from start to report.

1. Start the cluster (containers), create the topic, learn where each queue's replicas are (and set
   up the receivers' subscription).
2. Run producers and consumers (offset consumers, receivers, or both: ``workload``), or boto3
   clients through the SQS API (``sqs``), or all of them (``all``), for ``time_limit_s`` while the
   nemesis follows its seeded schedule.
3. Stop the clients, heal everything, wait until every node answers /readyz (recovery).
4. Drain every queue, read every replica (``read_from=local``), drain the receivers' group until
   it has finished everything, drain the SQS queue, check the history, write the report.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import resource
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .client import RaftmqBrokerClient
from .cluster import ChaosCluster
from .group_load import GroupConsumers, GroupLoadConfig
from .history import NEMESIS, History, HistoryFile, fault_windows, nemesis_ops
from .images import APP_IMAGE
from .load import LoadConfig, LoadProcesses
from .logscan import scan_logs
from .nemesis import FAULTS, check_faults, schedule
from .powerloss_nemesis import POWER_LOSS_FAULTS, power_loss_figures
from .receive import ReceiveConfig, Receivers
from .report import write_report
from .resources import ResourceSampler, resource_summary
from .sqs import SqsConfig, SqsWorkload
from .streaming import check_file
from .workload import Workload, WorkloadConfig

__all__ = ["WORKLOADS", "ChaosSpec", "RunResult", "check_spec", "run"]

log = logging.getLogger("raftmq.chaos.runner")

# queue: offset consumers (fetch by offset); receive: receivers of one group (receive/ack); both;
# sqs: boto3 senders and receivers through the SQS API alone (chaos/sqs.py); all: both and sqs.
WORKLOADS = ("queue", "receive", "both", "sqs", "all")


@dataclass(frozen=True)
class ChaosSpec:
    name: str = "chaos"
    nodes: int = 3  # one of nemesis.TOPOLOGIES: 1 (replication 1), 3 or 5
    # Fault names (not shorthands: nemesis.parse_faults expands those). The default, every fault,
    # suits 3 and 5 nodes; one node must name its own (nemesis.faults_for(1)), or the run is refused.
    faults: tuple[str, ...] = tuple(FAULTS)
    time_limit_s: float = 60.0
    seed: int = 0
    quiet_s: tuple[float, float] = (3.0, 6.0)
    fault_s: tuple[float, float] = (6.0, 10.0)
    rate: float = 120.0  # produce attempts per second, all producers together
    # The counts below: None is each one's default, 0 none of them (check_spec refuses 0 queues, a
    # count below 0 and a run in which nothing writes).
    queues: int | None = None  # default: 2 per node
    # default: 8 per node. Many slow producers rather than a few fast ones, as Jepsen runs many
    # client processes: a producer stuck on one request (a cut-off leader) says nothing about the
    # others, and a fault then hits many requests in flight at once.
    producers: int | None = None
    consumers: int | None = None  # default: 1 per node; 0: none (only the drain reads)
    workload: str = "queue"
    receivers: int | None = None  # default: 1 per node (receive and both); 0: none (only the drain)
    producer_client: str = "mixed"  # attempt | producer | mixed (see workload)
    # The SQS workload (sqs, all): messages a second offered through SendMessageBatch by all
    # senders; senders and receivers default to 1 per node each.
    sqs_rate: float = 200.0
    sqs_senders: int | None = None
    sqs_receivers: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # RAFTMQ_* settings for every node
    image: str = APP_IMAGE
    store: Path = Path("store")
    recovery_timeout_s: float = 90.0
    # A client gives up on a request after this long (then it is `info`); the nodes give up on a
    # commit after request_timeout_ms. Short, as a real client's: a worker stuck on one request
    # tells nothing about the others.
    client_timeout_s: float = 3.0
    request_timeout_ms: int = 2500
    # The topic's retention_ms (None: none). Hours, so that nothing a run writes is due: a
    # message removed by retention during the run is then lost (clock-jump-leader checks this).
    retention_ms: int | None = None
    # How long the replica reads wait for a replica to reach the drained high offset. A mutation
    # run that loses data has replicas that never do: there a short wait keeps the run short.
    replica_catch_up_s: float = 20.0
    drain_timeout_s: float = 120.0  # the drain's limit without progress (a drain that stalls is invalid)
    # Production load (chaos/load.py): messages a second offered through the client's batch path
    # by load_producers producers beside the workload's own; 0: none.
    load_rate: float = 0.0
    load_producers: int = 4
    load_processes: int = 2  # the load's producers run in this many processes of their own
    # Members of the consumer group chaos-load (chaos/group_load.py) reading the topic with the
    # client's AsyncConsumer during the load; 0: none. Only with a load.
    load_consumers: int = 3
    # How often each node's RSS, open files and data-directory size are sampled (chaos/resources.py).
    sample_interval_s: float = 5.0
    # Each node's volume (a tmpfs when run as root). A soak at production load keeps tens of millions
    # of messages (no retention: a removed message would be lost): about 35 bytes each on a node.
    disk_mb: int = 256


@dataclass
class RunResult:
    directory: Path
    results: dict[str, Any]

    @property
    def valid(self) -> bool:
        return bool(self.results["valid"])

    @property
    def checks(self) -> dict[str, Any]:
        result: dict[str, Any] = self.results["checks"]
        return result


def run(spec: ChaosSpec) -> RunResult:
    """Run the test; the report is in ``RunResult.directory`` whatever the verdict."""
    return asyncio.run(_run(spec))


def check_spec(spec: ChaosSpec) -> None:
    """Raise ValueError for a spec the run cannot honour, before any container starts (or the
    report directory exists): its faults (``check_faults``), its workload, a count below what it
    counts (a topic has at least one queue; 0 workers of a kind is none of them), writers with no
    rate to write at, and a run that writes nothing (its checkers would pass on an empty history: a
    run that cannot fail), the SQS workload's included (the REST load beside it is not its), alone or
    in the ``all`` workload."""
    check_faults(spec.faults, spec.nodes)
    if spec.workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, not {spec.workload!r}")
    if spec.queues is not None and spec.queues < 1:
        raise ValueError(f"queues must be at least 1 (None: 2 per node), not {spec.queues}")
    for name in ("producers", "consumers", "receivers", "sqs_senders", "sqs_receivers"):
        count = getattr(spec, name)
        if count is not None and count < 0:
            raise ValueError(f"{name} must be at least 0 (0: none; None: the default), not {count}")
    for name in ("load_rate", "load_producers", "load_processes", "load_consumers"):
        if getattr(spec, name) < 0:
            raise ValueError(f"{name} must be at least 0 (0: none), not {getattr(spec, name)}")
    _check_writers(spec)


def _check_writers(spec: ChaosSpec) -> None:
    """Each kind of writer has a rate above 0, and something writes (the counts are at least 0)."""
    producers, sqs = _workload_config(spec).producers, _sqs_config(spec)
    senders = sqs.senders if sqs else 0
    if producers > 0 and spec.rate <= 0:
        raise ValueError(f"rate must be above 0 with {producers} producers, not {spec.rate}")
    if senders > 0 and spec.sqs_rate <= 0:
        raise ValueError(f"sqs_rate must be above 0 with {senders} sqs_senders, not {spec.sqs_rate}")
    if spec.workload == "sqs" and senders < 1:
        raise ValueError("nothing would write: the sqs workload needs sqs_senders (the load is not SQS)")
    if spec.workload == "all" and senders < 1:  # the REST producers write, but no SQS message
        raise ValueError("the all workload needs sqs_senders: its SQS checker would pass on nothing sent")
    if producers + (spec.load_producers if spec.load_rate > 0 else 0) + senders < 1:
        raise ValueError(
            "nothing would write: give producers, sqs_senders or a load_rate (and load_producers)"
        )


def _count(value: int | None, default: int) -> int:
    """A worker count of the spec: None is the default, 0 is none."""
    return default if value is None else value


def _workload_config(spec: ChaosSpec) -> WorkloadConfig:
    rest = spec.workload != "sqs"  # the REST producers run unless the SQS workload runs alone
    return WorkloadConfig(
        queues=_count(spec.queues, 2 * spec.nodes),
        producers=_count(spec.producers, 8 * spec.nodes) if rest else 0,
        consumers=_count(spec.consumers, spec.nodes) if spec.workload in ("queue", "both", "all") else 0,
        rate=spec.rate,
        producer_client=spec.producer_client,
        replica_catch_up_s=spec.replica_catch_up_s,
        drain_timeout_s=spec.drain_timeout_s,
    )


def _receive_config(spec: ChaosSpec) -> ReceiveConfig | None:
    if spec.workload in ("queue", "sqs"):
        return None
    return ReceiveConfig(receivers=_count(spec.receivers, spec.nodes))


def _sqs_config(spec: ChaosSpec) -> SqsConfig | None:
    if spec.workload not in ("sqs", "all"):
        return None
    return SqsConfig(senders=_count(spec.sqs_senders, spec.nodes),
                     receivers=_count(spec.sqs_receivers, spec.nodes),
                     rate=spec.sqs_rate, client_timeout_s=spec.client_timeout_s)  # fmt: skip


async def _threads(targets: list[tuple[Callable[..., None], int]], stop: threading.Event) -> None:
    """Run blocking workers (boto3's) in threads of their own until each returns (after ``stop``)."""
    threads = [threading.Thread(target=fn, args=(w, stop), daemon=True) for fn, w in targets]
    for t in threads:
        t.start()
    for t in threads:
        await asyncio.to_thread(t.join)


def _create_topic(
    cluster: ChaosCluster, topic: str, queues: int, retention_ms: int | None = None, timeout_s: float = 60
) -> dict[int, list[str]]:
    """Create the topic (retrying through the nodes) and return queue -> replica nodes."""
    deadline = time.monotonic() + timeout_s
    settings = {} if retention_ms is None else {"retention_ms": retention_ms}
    body = json.dumps({"name": topic, "queues": queues, **settings}).encode()
    last: Exception | None = None
    for attempt in range(10_000):
        node = cluster.node_ids[attempt % len(cluster.node_ids)]
        try:
            req = urllib.request.Request(
                cluster.url(node) + "/v1/topics", data=body, method="POST",
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409 topic_exists: an earlier attempt got through
                last = e
        except OSError as e:
            last = e
        if last is None:
            with urllib.request.urlopen(cluster.url(node) + f"/v1/topics/{topic}", timeout=10) as r:
                described = json.loads(r.read())
            return {q["queue"]: list(q["replicas"]) for q in described["queues"]}
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not create topic {topic}: {last}")
        last = None
        time.sleep(0.5)
    raise AssertionError("unreachable")


async def _nemesis(cluster: ChaosCluster, history: History, spec: ChaosSpec, t0: float) -> Counter[str]:
    rng = random.Random(spec.seed * 7919 + 1)
    injected: Counter[str] = Counter()
    plan = schedule(list(spec.faults), spec.seed, spec.time_limit_s, spec.quiet_s, spec.fault_s)
    for fault_id, planned in enumerate(plan, start=1):
        await asyncio.sleep(max(0.0, t0 + planned.at_s - time.monotonic()))
        fault = FAULTS[planned.fault]
        try:
            value = await asyncio.to_thread(fault.start, cluster, rng)
        except Exception as e:
            log.warning("nemesis %s start failed: %s", fault.name, e)
            value = {"error": f"{type(e).__name__}: {e}"}
        history.append(
            type="info", process=NEMESIS, f="start", fault=fault.name, fault_id=fault_id, value=value
        )
        injected[fault.name] += 1
        log.info("nemesis start %s %s", fault.name, value)
        await asyncio.sleep(max(0.0, t0 + planned.at_s + planned.duration_s - time.monotonic()))
        error = None
        try:
            if "error" not in value:
                await asyncio.to_thread(fault.stop, cluster, value)
        except Exception as e:
            log.warning("nemesis %s stop failed: %s", fault.name, e)
            error = f"{type(e).__name__}: {e}"
        history.append(type="info", process=NEMESIS, f="stop", fault=fault.name, fault_id=fault_id,
                       value=value, **({"error": error} if error else {}))  # fmt: skip
    await asyncio.sleep(max(0.0, t0 + spec.time_limit_s - time.monotonic()))
    return injected


async def _final_committed(group: GroupConsumers, tries: int = 20) -> dict[str, int | None] | None:
    """The group's committed offsets after the drain (the checker's final read), a few tries."""
    for _ in range(tries):
        offsets = await group.read_committed(final=True)
        if offsets is not None:
            return offsets
        await asyncio.sleep(1)
    return None


async def _run(spec: ChaosSpec) -> RunResult:
    check_spec(spec)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    directory = spec.store / spec.name / stamp
    directory.mkdir(parents=True, exist_ok=True)
    rx_config = _receive_config(spec)
    sqs_config = _sqs_config(spec)
    # On disk only: a soak at production load records tens of millions of operations.
    history = History(directory / "history.jsonl", keep=False)
    wl_config = _workload_config(spec)
    cluster = ChaosCluster(
        spec.nodes, image=spec.image, env=spec.env, request_timeout_ms=spec.request_timeout_ms,
        power_loss=any(f in POWER_LOSS_FAULTS for f in spec.faults), disk_mb=spec.disk_mb,
    )  # fmt: skip
    client = RaftmqBrokerClient(cluster.url, cluster.node_ids, timeout_s=spec.client_timeout_s)
    run_info: dict[str, Any] = {"directory": str(directory), "started": stamp}
    workers: list[asyncio.Task[None]] = []
    group: GroupConsumers | None = None
    sqs_stop = threading.Event()  # the SQS workers are threads (boto3 blocks)
    try:
        t = time.monotonic()
        await asyncio.to_thread(cluster.start)
        replicas = await asyncio.to_thread(
            _create_topic, cluster, wl_config.topic, wl_config.queues, spec.retention_ms
        )
        receivers = Receivers(client, history, cluster.node_ids, rx_config) if rx_config else None
        if receivers is not None:
            await receivers.subscribe()
        sqs = SqsWorkload(cluster.url, history, cluster.node_ids, sqs_config) if sqs_config else None
        if sqs is not None:
            await asyncio.to_thread(sqs.setup)
        run_info["setup_s"] = round(time.monotonic() - t, 1)
        workload = Workload(client, history, cluster.node_ids, wl_config, replicas, seed=spec.seed)
        stop = asyncio.Event()
        workers += [asyncio.create_task(workload.producer(w, stop)) for w in range(wl_config.producers)]
        workers += [asyncio.create_task(workload.consumer(w, stop)) for w in range(wl_config.consumers)]
        load = None
        if spec.load_rate > 0:
            load_config = LoadConfig(producers=spec.load_producers, rate=spec.load_rate,
                                     processes=spec.load_processes)  # fmt: skip
            load = LoadProcesses(history, cluster.node_ids, client.address_map, wl_config.topic, load_config,
                                 directory, seed=spec.seed)  # fmt: skip
            await load.start()
            workers.append(asyncio.create_task(load.run(stop)))
        if spec.load_rate > 0 and spec.load_consumers > 0:
            group = GroupConsumers(history, cluster.node_ids, client.address_map, wl_config.topic,
                                   GroupLoadConfig(members=spec.load_consumers))  # fmt: skip
            workers += [asyncio.create_task(group.member(w, stop)) for w in range(spec.load_consumers)]
            workers.append(asyncio.create_task(group.observe(stop)))
        if receivers is not None:
            count = receivers.config.receivers
            workers += [asyncio.create_task(receivers.receiver(w, stop)) for w in range(count)]
        if sqs is not None:
            targets = [(sqs.sender, w) for w in range(sqs.config.senders)]
            targets += [(sqs.receiver, w) for w in range(sqs.config.receivers)]
            workers.append(asyncio.create_task(_threads(targets, sqs_stop)))
        sampler = ResourceSampler(
            cluster.node_ids,
            cluster.pid,
            cluster.data_dir,
            lambda: history.now_ns() / 1e9,
            spec.sample_interval_s,
        )
        workers.append(asyncio.create_task(sampler.run(stop)))
        injected = await _nemesis(cluster, history, spec, time.monotonic())
        run_info["faults_injected"] = dict(sorted(injected.items()))
        stop.set()
        sqs_stop.set()
        await asyncio.gather(*workers)
        if load is not None:
            seconds = spec.time_limit_s
            run_info["load"] = {"offered": load.offered, "acknowledged": load.acknowledged,
                                "offered_per_s": round(load.offered / seconds),
                                "acknowledged_per_s": round(load.acknowledged / seconds)}  # fmt: skip
        if group is not None:
            run_info["load"]["group"] = {"members": spec.load_consumers, "consumed": group.consumed,
                                         "consumer_restarts": group.restarts}  # fmt: skip

        errors: list[str] = []
        await asyncio.to_thread(cluster.heal_all, lambda n, e: errors.append(f"{n}: {e}"))
        history.append(type="info", process=NEMESIS, f="heal", value={"errors": errors})
        t = time.monotonic()
        try:
            await asyncio.to_thread(cluster.wait_ready, None, spec.recovery_timeout_s)
            run_info["recovery_s"] = round(time.monotonic() - t, 1)
        except TimeoutError as e:
            run_info["recovery_s"] = None
            run_info["recovery_error"] = str(e)
        t = time.monotonic()
        run_info["drain"] = await workload.drain()
        run_info["drain"]["seconds"] = round(time.monotonic() - t, 1)
        run_info["replicas"] = await workload.read_replicas()
        if receivers is not None:
            t = time.monotonic()
            run_info["receive_drain"] = await receivers.drain(workload.high_offsets)
            run_info["receive_drain"]["seconds"] = round(time.monotonic() - t, 1)
        if sqs is not None:
            t = time.monotonic()
            run_info["sqs_drain"] = await asyncio.to_thread(sqs.drain)
            run_info["sqs_drain"]["seconds"] = round(time.monotonic() - t, 1)
            run_info["sqs_sent"] = sqs.sent
        await asyncio.to_thread(sampler.sample)  # after the heal and the drain
        summary = resource_summary(sampler.samples)
        run_info["resources"] = {"interval_s": spec.sample_interval_s, "summary": summary,
                                 "samples": sampler.samples}  # fmt: skip
        if group is not None:
            run_info["load"]["group"]["final_committed"] = await _final_committed(group)
    except BaseException as e:
        # Keep what is known: the history is on disk already; say why there is no verdict.
        run_info["harness_error"] = f"{type(e).__name__}: {e}"
        partial = {"test": spec.name, "valid": False, "run": run_info}
        (directory / "results.json").write_text(json.dumps(partial, indent=2))
        (directory / "summary.txt").write_text(f"{spec.name}: HARNESS ERROR {run_info['harness_error']}\n")
        raise
    finally:
        sqs_stop.set()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        history.close()
        await client.close()
        if group is not None:
            await group.close()
        await asyncio.to_thread(cluster.stop, directory / "logs")
    run_info["log_alerts"] = scan_logs(directory / "logs")
    recorded = HistoryFile(history.path or directory / "history.jsonl")
    nemesis, end = nemesis_ops(recorded)  # one walk: the fault windows and the end, for figures and plots
    if cluster.power_loss_fs:
        run_info["power_losses"] = power_loss_figures(nemesis)
    t = time.monotonic()
    checks, run_info["checker"] = check_file(recorded.path)
    run_info["checker"] |= {"seconds": round(time.monotonic() - t, 1), **_peak_rss()}
    valid = verdict(checks, run_info)
    spec_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()}
    results = {"test": spec.name, "valid": valid, "spec": spec_json, "run": run_info, "checks": checks}
    write_report(directory, spec.name, recorded, results, (fault_windows(nemesis), end))
    return RunResult(directory, results)


def verdict(checks: dict[str, Any], run_info: dict[str, Any]) -> bool:
    """A run is valid when every checker passed, the cluster recovered after the heal, every drain
    finished, and every replica read caught up with what was acknowledged (a replica that cannot be
    read from its first offset has lost what the others hold, even when the checkers, which read
    through the leaders, saw nothing lost)."""
    return bool(
        checks["valid"]
        and run_info["recovery_s"] is not None
        and run_info["drain"]["complete"]
        and run_info.get("receive_drain", {"complete": True})["complete"]
        and run_info.get("sqs_drain", {"complete": True})["complete"]
        and not run_info.get("replicas", {}).get("lagging_replicas")
    )


def _peak_rss() -> dict[str, int]:
    """The harness's peak RSS so far (the run and the checks: the history is not in memory)."""
    return {"harness_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}
