"""``raftmq status`` and ``raftmq topic ...``: the cluster's state and topics over the HTTP API."""

from __future__ import annotations

import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TextIO

import click
from click.core import ParameterSource
from rich import box
from rich.table import Table
from rich.text import Text

from raftmq.cluster.cli.admin_http import AdminError, AdminHttp, ServerError
from raftmq.cluster.cli.common import _none, _print_json, admin_command, json_option, stdout_console
from raftmq.cluster.machines.metadata import validate_topic_name


@click.command()
@json_option
@admin_command
def status(admin: AdminHttp, as_json: bool) -> None:
    """Show the nodes and every Raft group: leader, term, and commit/applied index per replica."""
    data = admin.get("/v1/cluster")
    if as_json:
        _print_json(data)
        return
    console = stdout_console()
    console.print(f"[bold]nodes[/bold] (as seen by {data['node_id']})")
    nodes = Table(box=box.SIMPLE_HEAD)
    for column in ("node", "http", "raft", "reachable"):
        nodes.add_column(column)
    for n in data["nodes"]:
        reachable = Text("yes", style="green") if n["reachable"] else Text("no", style="bold red")
        nodes.add_row(n["id"], n["http"], n.get("raft", ""), reachable)
    console.print(nodes)
    console.print("[bold]groups[/bold]")
    console.print(_groups_table(data))
    console.print(
        "  cells: commit_index/applied_index, * leader, (-n) entries behind the leader", style="dim"
    )
    console.print(_status_summary(data))


def _groups_table(data: dict[str, Any]) -> Table:
    table = Table(box=box.SIMPLE_HEAD)
    node_ids = [n["id"] for n in data["nodes"]]
    reachable = {n["id"] for n in data["nodes"] if n["reachable"]}
    for column in ("group", "leader", "term", *node_ids):
        table.add_column(column, justify="right" if column in node_ids or column == "term" else "left")
    for g in data["groups"]:
        replicas = {r["node_id"]: r for r in g["replicas"]}
        target = _leader_commit(g)
        cells: list[Text | str] = []
        for nid in node_ids:
            r = replicas.get(nid)
            if r is None:
                cells.append("" if nid in reachable else Text("?", style="red"))
                continue
            behind = target - r["applied_index"]
            mark = "*" if nid == g["leader"] else ""
            cell = Text(f"{mark}{r['commit_index']}/{r['applied_index']}")
            if behind > 0:
                cell.append(f" (-{behind})")
                cell.stylize("bold yellow")
            elif mark:
                cell.stylize("bold")
            cells.append(cell)
        leader = _none(g["leader"], "bold red", "none")
        table.add_row(g["group_id"], leader, str(g["term"]), *cells)
    return table


def _leader_commit(group: dict[str, Any]) -> int:
    """What a replica should have applied: the leader's commit index (the highest seen if none)."""
    for r in group["replicas"]:
        if r["node_id"] == group["leader"]:
            return int(r["commit_index"])
    return max((int(r["commit_index"]) for r in group["replicas"]), default=0)


def _status_summary(data: dict[str, Any]) -> Text:
    nodes, groups = data["nodes"], data["groups"]
    up = sum(1 for n in nodes if n["reachable"])
    led = sum(1 for g in groups if g["leader"])
    lagging = sum(1 for g in groups for r in g["replicas"] if r["applied_index"] < _leader_commit(g))
    ok = up == len(nodes) and led == len(groups)
    text = Text(
        f"{up}/{len(nodes)} nodes reachable, {led}/{len(groups)} groups have a leader, "
        f"{lagging} {'replica' if lagging == 1 else 'replicas'} behind its leader",
        style="green" if ok and not lagging else "yellow",
    )
    return text


@click.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


@topic.command("create")
@click.argument("names", metavar="NAME...", nargs=-1)
@click.option(
    "--from-file",
    type=click.File("r"),
    help="Also create the topics named in this file, one a line ('-': stdin; blank lines and "
    "lines starting with # are skipped).",
)
@click.option("--queues", type=click.IntRange(min=1), default=8, show_default=True, help="Queue count.")
@click.option("--retention-ms", type=click.IntRange(min=1), help="Remove messages older than this.")
@click.option("--retention-bytes", type=click.IntRange(min=1), help="Keep at most this much per queue.")
@click.option("--max-message-bytes", type=click.IntRange(min=1), help="Per-topic message size limit.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Requests at once when several topics are created one by one (a cluster that cannot "
    "create them in bulk yet).",
)
@json_option
@admin_command
def topic_create(
    admin: AdminHttp,
    names: tuple[str, ...],
    from_file: TextIO | None,
    queues: int,
    retention_ms: int | None,
    retention_bytes: int | None,
    max_message_bytes: int | None,
    concurrency: int,
    as_json: bool,
) -> None:
    """Create topic NAME, or many topics with the same settings (NAME... and --from-file).

    Of several names every one is checked first: one that is not a topic name, or given twice,
    is a usage error and nothing is created. They are created in bulk, up to 1,000 in one
    request (and one Raft entry), with progress on stderr when there are more; a topic that
    fails (topic_exists, ...) is reported on stderr, the others are created, and the exit status
    is 1. A cluster that cannot create topics in bulk yet (a node of an earlier release) gets
    them one by one, --concurrency at a time."""
    wanted = list(names)
    if from_file is not None:
        wanted += [line.strip() for line in from_file if line.strip() and not line.lstrip().startswith("#")]
    if not wanted:
        raise click.UsageError("name at least one topic (NAME... or --from-file)")
    # One name goes to the node as it is (its bad_request); of several, none is sent while one is bad.
    problems = [f"{name!r}: {problem}" for name in wanted if (problem := validate_topic_name(name))]
    problems += [f"{name!r} is given twice" for name, n in Counter(wanted).items() if n > 1]
    if problems and len(wanted) > 1:
        raise click.UsageError("nothing created: " + "; ".join(problems[:10]))
    body: dict[str, Any] = {"queues": queues}
    for key, value in (
        ("retention_ms", retention_ms),
        ("retention_bytes", retention_bytes),
        ("max_message_bytes", max_message_bytes),
    ):
        if value is not None:
            body[key] = value
    if len(wanted) == 1:
        data = admin.post("/v1/topics", {"name": wanted[0], **body})
        if as_json:
            _print_json(data)
            return
        queues = len(data["queues"])
        stdout_console().print(
            f"created topic {data['name']!r} with {queues} queue{'' if queues == 1 else 's'}"
        )
        _print_topic(data)
        return
    _create_many(admin, wanted, body, concurrency, as_json)


BULK_CHUNK = 1000  # topics per request (a node's limits.max_topics_per_request, by default)


def _create_many(
    admin: AdminHttp, names: list[str], body: dict[str, Any], concurrency: int, as_json: bool
) -> None:
    """Create ``names``: in bulk requests of up to :data:`BULK_CHUNK` (fewer when the node's
    limit is lower), or one by one (``concurrency`` requests at once) from the first name a
    cluster cannot create in bulk yet. Failures on stderr, exit status 1."""
    outcomes: list[tuple[str, AdminError | dict[str, str] | None]] = []
    done = _create_in_bulk(admin, names, body, outcomes, show_progress=not as_json)
    if done < len(names):

        def create(name: str) -> tuple[str, AdminError | dict[str, str] | None]:
            try:
                admin.post("/v1/topics", {"name": name, **body})
            except AdminError as e:
                return name, e
            return name, None

        with ThreadPoolExecutor(concurrency) as pool:
            outcomes += pool.map(create, names[done:])
    created = [name for name, error in outcomes if error is None]
    failed = [(name, _failure(error)) for name, error in outcomes if error is not None]
    if as_json:
        _print_json({"created": created, "failed": [{"name": name, **fields} for name, fields in failed]})
    else:
        stdout_console().print(f"created {len(created)} of {len(names)} topics")
        for name, fields in failed:
            click.echo(f"error {fields['code']}: {name}: {fields['message']}", err=True)
    if failed:
        sys.exit(1)


def _create_in_bulk(
    admin: AdminHttp,
    names: list[str],
    body: dict[str, Any],
    outcomes: list[tuple[str, AdminError | dict[str, str] | None]],
    show_progress: bool,
) -> int:
    """Create ``names`` with ``POST /v1/topics {"topics": [...]}``, adding each one's outcome
    (None: created) to ``outcomes``; returns how many names were tried. Stops early when the
    cluster cannot create topics in bulk: a metadata voter of an earlier release (503
    ``upgrade_in_progress``) or an entry node of one (400 for the ``topics`` field, an error that
    names no spec: no ``index``)."""
    chunk, done = BULK_CHUNK, 0
    while done < len(names):
        part = names[done : done + chunk]
        try:
            answer = admin.post("/v1/topics", {"topics": [{"name": name, **body} for name in part]})
        except ServerError as e:
            limit = e.details.get("limit")
            if e.code == "request_too_large" and isinstance(limit, int) and 1 <= limit < chunk:
                chunk = limit
                continue
            if e.code == "upgrade_in_progress" or (e.code == "bad_request" and "index" not in e.details):
                return done
            outcomes += [(name, e) for name in part]  # e.g. forbidden: nothing of the request created
        except AdminError as e:  # no answer: the topics may or may not exist
            outcomes += [(name, e) for name in part]
        else:
            for name, item in zip(part, answer["results"], strict=True):
                outcomes.append((name, None if "topic" in item else item["error"]))
        done += len(part)
        if show_progress and len(names) > chunk:
            created = sum(1 for _, error in outcomes if error is None)
            click.echo(f"created {created:,} of {len(names):,} topics ({done:,} asked)", err=True)
    return done


def _failure(error: AdminError | dict[str, str]) -> dict[str, str]:
    """The code and message of a topic that was not created: a per-topic error of a bulk answer,
    or a failed request (``no_answer``: no node answered, or the answer was lost and the topic
    may exist)."""
    if isinstance(error, dict):
        return {"code": str(error.get("code")), "message": str(error.get("message", ""))}
    return _error_fields(error)


def _error_fields(e: AdminError) -> dict[str, str]:
    """The error code and message of a failed request (``no_answer``: no node answered, or the
    answer was lost and the topic may exist)."""
    if isinstance(e, ServerError):
        return {"code": e.code, "message": e.message}
    return {"code": "no_answer", "message": str(e)}


def _grouped(topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each topic followed by its dead-letter topics (``dead_letter_of``; a node answers them in
    that order already, this keeps an older node's answer readable too)."""
    under: dict[str, list[dict[str, Any]]] = {}
    for t in topics:
        source = t.get("dead_letter_of")
        if source:
            under.setdefault(source["topic"], []).append(t)
    names = {t["name"] for t in topics}
    out: list[dict[str, Any]] = []

    def add(t: dict[str, Any]) -> None:
        out.append(t)
        for child in under.pop(t["name"], []):  # a dead-letter topic's name is longer: no cycle
            add(child)

    for t in topics:
        source = t.get("dead_letter_of")
        if not (source and source["topic"] in names):  # else listed under its source
            add(t)
    return out


@topic.command("list")
@json_option
@admin_command
def topic_list(admin: AdminHttp, as_json: bool) -> None:
    """List the topics; each dead-letter topic is shown under its source topic (└)."""
    data = admin.get("/v1/topics")
    if as_json:
        _print_json(data)
        return
    console = stdout_console()
    if not data["topics"]:
        console.print("no topics")
        return
    table = Table(
        "topic", "queues", "retention_ms", "retention_bytes", "max_message_bytes", box=box.SIMPLE_HEAD
    )
    for t in _grouped(data["topics"]):
        source = t.get("dead_letter_of")
        table.add_row(
            Text(f"└ {t['name']}", style="dim") if source else t["name"],
            str(t["queues"]),
            _none(t.get("retention_ms")),
            _none(t.get("retention_bytes")),
            _none(t.get("max_message_bytes")),
        )
    console.print(table)


@topic.command("describe")
@click.argument("name")
@json_option
@admin_command
def topic_describe(admin: AdminHttp, name: str, as_json: bool) -> None:
    """Show topic NAME's settings and queues: queue group, leader, replicas, low/high offsets."""
    data = admin.get(f"/v1/topics/{AdminHttp.quote(name)}")
    if as_json:
        _print_json(data)
        return
    _print_topic(data)


def _print_topic(t: dict[str, Any]) -> None:
    settings = ", ".join(
        f"{k} {t.get(k) if t.get(k) is not None else '-'}"
        for k in ("retention_ms", "retention_bytes", "max_message_bytes")
    )
    table = Table(
        "queue",
        "group",
        "leader",
        "replicas",
        "low",
        "high",
        box=box.SIMPLE_HEAD,
    )
    console = stdout_console()
    console.print(f"[bold]topic {t['name']}[/bold] (id {t['id']}, created {_time(t.get('created_ms'))})")
    console.print(f"  {settings}")
    for q in t["queues"]:
        table.add_row(
            str(q["queue"]),
            str(q["group_id"]),
            _none(q["leader"], "bold red", "none"),
            ",".join(q["replicas"]),
            _none(q["low_offset"], "red", "?"),
            _none(q["high_offset"], "red", "?"),
        )
    console.print(table)


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


class _Bound(click.ParamType[int | None]):
    """A retention bound: a positive integer, or ``off`` (None: no bound)."""

    name = "bound"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or value == "off" or isinstance(value, int):
            return None if value == "off" else value
        if not (str(value).isascii() and str(value).isdigit()) or int(value) < 1:
            self.fail(f"{value!r} is neither a positive integer nor 'off'", param, ctx)
        return int(value)


@topic.command("retention")
@click.argument("name")
@click.option("--retention-ms", type=_Bound(), metavar="MS|off", help="Remove messages older than this.")
@click.option(
    "--retention-bytes", type=_Bound(), metavar="BYTES|off", help="Keep at most this much per queue."
)
@json_option
@admin_command
def topic_retention(
    admin: AdminHttp, name: str, retention_ms: Any, retention_bytes: Any, as_json: bool
) -> None:
    """Change topic NAME's retention ('off': no bound; an option left out keeps its bound).
    Messages past a bound turned on or tightened are removed at the queue groups' next retention
    look (raft.retention_check_ms, 10 s), and their disk freed."""
    ctx = click.get_current_context()
    given = [
        k
        for k in ("retention_ms", "retention_bytes")
        if ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE
    ]
    if not given:
        raise click.UsageError("give --retention-ms or --retention-bytes (a number, or off)")
    change = {k: {"retention_ms": retention_ms, "retention_bytes": retention_bytes}[k] for k in given}
    data = admin.request("PATCH", f"/v1/topics/{AdminHttp.quote(name)}", change)
    if as_json:
        _print_json(data)
        return
    _print_topic(data)


@topic.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@admin_command
def topic_delete(admin: AdminHttp, name: str, yes: bool) -> None:
    """Delete topic NAME and all its messages."""
    if not yes:
        click.confirm(f"Delete topic {name!r} and all its messages?", abort=True)
    admin.delete(f"/v1/topics/{AdminHttp.quote(name)}")
    click.echo(f"deleted topic {name!r}")
