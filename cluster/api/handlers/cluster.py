"""Cluster changes over HTTP: add or remove a node, move a replica, move a group's leadership,
rebalance.

Public (cluster admin), served by the metadata group's leader (any node forwards)::

    GET    /v1/cluster/placement                 placement, change in progress, recent changes
    POST   /v1/cluster/nodes                     {"id", "http", "raft"}           -> 202 change
    DELETE /v1/cluster/nodes/{node}                                                -> 202 change
    DELETE /v1/cluster/change                    cancel the change in progress    -> 202 change
    POST   /v1/cluster/groups/{group}/move       {"from", "to"}                   -> 202 change
    POST   /v1/cluster/groups/{group}/leader     {"node"}                         -> 202 change
    POST   /v1/cluster/rebalance                 {"dry_run"?: bool} (body optional)
                                                 -> 202 change and plan; dry run: 200 plan

A change is accepted (202) once it is recorded in the metadata group; the coordinator
(``cluster/node/changes.py``) carries it out, and ``GET /v1/cluster/placement`` shows its progress and,
in ``history``, how it ended. One change at a time: another is refused with 409
``change_in_progress``. Peers (``/internal``): the placement as this node's metadata replica has
it, and the ``membership``/``transfer`` actions run by a group's leader for the coordinator.

Adding a node: the node at the request's ``http`` address is sent no credential; it proves it holds
the cluster's peer key over a fresh nonce (``POST /internal/proof``, the one open ``/internal``
route; ``cluster/config/keys.py``). A node that cannot is refused (400 ``bad_request``), nothing recorded.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from raftmq.cluster.api.common import json_response, read_unknown_sender
from raftmq.cluster.api.validation import bad, parse_json
from raftmq.cluster.base import errors
from raftmq.cluster.base.clock import now_ms
from raftmq.cluster.base.errors import ApiError, CatalogError
from raftmq.cluster.base.groups import META
from raftmq.cluster.config.cluster_file import NodeConfig
from raftmq.cluster.config.keys import PROOF_PATH, new_nonce, node_proof, proof_matches
from raftmq.cluster.machines.placement import Change, command
from raftmq.cluster.machines.rebalance import plan
from raftmq.cluster.node.changes import Coordinator
from raftmq.cluster.node.node import Node

if TYPE_CHECKING:
    from raftmq.cluster.api.core import ApiCore

__all__ = ["ClusterApi", "add_cluster_routes"]

MAX_PROOF_BODY_BYTES = 1024  # {"nonce": at most 128 characters}: a stranger's body, kept small
NOTHING_TO_CANCEL = "no cluster change is in progress: nothing to cancel"


def _ended_before_cancel(cancelled: int, now: Change | None) -> ApiError:
    """The answer to a cancel refused because its change ended before the entry applied: the change
    it was aimed at is no longer in progress. Another may have begun meanwhile (read after the
    refusal); it is named but left running, and the code is the non-retriable one, so a client
    retrying by the catalogue does not cancel a change nobody asked to cancel."""
    if now is None:
        return ApiError(errors.NO_CHANGE_IN_PROGRESS, NOTHING_TO_CANCEL)
    return ApiError(
        errors.NO_CHANGE_IN_PROGRESS,
        f"change {cancelled} ended before its cancel applied: nothing cancelled; change {now.id} "
        f"({now.kind}) began since and was left as is",
    )


class ClusterApi:
    """Handlers of the routes above; ``actions`` are the internal actions of a group's leader."""

    def __init__(self, node: Node, api: ApiCore) -> None:
        self.node = node
        self.api = api
        # The change coordinator: made here, run from the app's startup (add_cluster_routes).
        self.coordinator = Coordinator(node, api.router)

    # -- public -----------------------------------------------------------------------------------

    async def placement(self, request: web.Request) -> web.Response:

        if not self.api.router.leads(META):
            return await self.api.forward(request, META)
        machine = self.node.metadata
        assert machine is not None
        placement, change = machine.placement(), machine.change()
        return json_response(
            {
                "placement": None if placement is None else placement.to_json(),
                "change": None if change is None else change.to_json(),
                "history": machine.change_history(),
            }
        )

    async def add_node(self, request: web.Request) -> web.Response:
        body = await self._body(request, {"id", "http", "raft"}, {"id", "http", "raft"})
        for key in ("http", "raft"):
            # ASCII digits only (the placement machine's rule stays as it was: old log entries).
            port = body[key].rpartition(":")[2]
            if not (port.isascii() and port.isdigit()):
                raise bad(f"node {key} must be host:port with a port from 1 to 65535")
        if not self.api.router.leads(META):
            return await self.api.forward(request, META, orjson.dumps(body))
        await self._check_answers(body)
        return await self._begin({"kind": "add_node", "node": body})

    async def remove_node(self, request: web.Request) -> web.Response:
        if not self.api.router.leads(META):
            return await self.api.forward(request, META)
        return await self._begin({"kind": "remove_node", "node": request.match_info["node"]})

    async def move(self, request: web.Request) -> web.Response:
        body = await self._body(request, {"from", "to"}, {"from", "to"})
        if not self.api.router.leads(META):
            return await self.api.forward(request, META, orjson.dumps(body))
        group = request.match_info["group"]
        return await self._begin(
            {"kind": "move", "group": group, "source": body["from"], "target": body["to"]}
        )

    async def leader(self, request: web.Request) -> web.Response:
        body = await self._body(request, {"node"}, {"node"})
        if not self.api.router.leads(META):
            return await self.api.forward(request, META, orjson.dumps(body))
        group = request.match_info["group"]
        return await self._begin({"kind": "transfer_leader", "group": group, "target": body["node"]})

    async def rebalance(self, request: web.Request) -> web.Response:
        """Even out replicas and preferred leaders (``cluster/machines/rebalance.py``). The answer carries
        the plan as of now; a balanced cluster gets a change that ends at once as done."""

        raw = await request.read()
        body = parse_json(raw) if raw else {}
        if (
            not isinstance(body, dict)
            or set(body) - {"dry_run"}
            or not isinstance(body.get("dry_run", False), bool)
        ):
            raise bad('body must be empty or {"dry_run": true | false}')
        if not self.api.router.leads(META):
            return await self.api.forward(request, META, raw or None)
        machine = self.node.metadata
        placement = None if machine is None else machine.placement()
        if placement is None:
            raise ApiError(errors.UNAVAILABLE, "the cluster placement is not initialised yet")
        unavailable = await self.coordinator.unanswering(placement)
        steps = plan(placement, unavailable).to_json()
        if body.get("dry_run", False):
            return json_response({"plan": steps})
        return await self._begin({"kind": "rebalance"}, plan=steps)

    async def cancel(self, request: web.Request) -> web.Response:

        if not self.api.router.leads(META):
            return await self.api.forward(request, META)
        machine = self.node.metadata
        change = None if machine is None else machine.change()
        # Nothing to cancel is the cluster's state, not a malformed request: a conflict (409), as
        # a change refused while another runs.
        if change is None:
            raise ApiError(errors.NO_CHANGE_IN_PROGRESS, NOTHING_TO_CANCEL)
        try:  # (the change may end before the entry applies)
            result = await self.api.router.propose_checked(
                META, orjson.dumps(command("cancel_change", change_id=change.id))
            )
        except CatalogError as e:  # the machine's one refusal of it: that change is no longer on
            if e.error is not errors.BAD_REQUEST:
                raise
            raise _ended_before_cancel(change.id, None if machine is None else machine.change()) from e
        self.coordinator.wake()
        return json_response(result, status=202)

    async def _body(self, request: web.Request, required: set[str], allowed: set[str]) -> dict[str, Any]:
        body = parse_json(await request.read())
        if not isinstance(body, dict) or not required <= set(body) or set(body) - allowed:
            raise bad(f"body must be an object with {', '.join(sorted(required))}")
        for key, value in body.items():
            if not isinstance(value, str) or not value or len(value) > 300:
                raise bad(f"{key!r} must be a non-empty string")
        return body

    async def _begin(self, change: dict[str, Any], **extra: Any) -> web.Response:
        """Record ``change`` and answer 202 ``{"change": ..., **extra}``."""

        result = await self.api.router.propose_checked(
            META, orjson.dumps(command("begin_change", now_ms=now_ms(), change=change))
        )
        self.coordinator.wake()
        return json_response({**result, **extra}, status=202)

    async def _check_answers(self, body: dict[str, Any]) -> None:
        """A node is added only when it runs and proves it is the node named, with these addresses,
        of this cluster (a typo or a stranger's address is not recorded). The address came from the
        request, so it gets no credential: a fresh nonce goes out on the probe session, and the
        node answers with its proof over it (``cluster/config/keys.py``)."""
        me = self.node.me
        probe = NodeConfig(body["id"], body["http"], body["raft"], "", tls_cert_file=me.tls_cert_file)
        nonce = new_nonce()
        try:
            answer = await self.node.probe_post_json(probe, PROOF_PATH, {"nonce": nonce}, timeout_s=3.0)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            raise bad(f"no raftmq node answers at {body['http']}; start it first") from None
        if not isinstance(answer, dict):
            raise bad(f"no raftmq node answers at {body['http']}; start it first")
        if proof_matches(
            self.node.keys.peer, nonce, body["id"], body["http"], body["raft"], answer.get("proof")
        ):
            return
        # No valid proof. The node names nothing of itself (it answers strangers too), so the
        # refusal lists what may differ; the operator compares with that node's cluster file.
        raise bad(
            f"the node at {body['http']} did not prove it is {body['id']!r} with http address "
            f"{body['http']!r} and Raft address {body['raft']!r} of this cluster (its cluster file "
            "gives another id or address, or another cluster.secret)"
        )

    async def internal_proof(self, request: web.Request) -> web.Response:
        """``POST /internal/proof {"nonce"}``, open (the prober sends no credential): this node's
        proof over the nonce and its own id and addresses, and nothing else. The prober knows the id
        and addresses it asks about; a stranger learns no address of this node here (the proof is
        an HMAC under the peer key: it tells nothing of what it covers)."""

        within_s = self.node.config.limits.request_timeout_ms / 1000  # a stranger's body: small, in time
        body = parse_json(await read_unknown_sender(request, within_s, MAX_PROOF_BODY_BYTES))
        nonce = body.get("nonce") if isinstance(body, dict) else None
        if not isinstance(nonce, str) or not 32 <= len(nonce) <= 128 or not nonce.isascii():
            raise bad('body must be {"nonce": "<32 to 128 characters>"}')
        me = self.node.me
        return json_response({"proof": node_proof(self.node.keys.peer, nonce, me.id, me.http, me.raft)})

    async def internal_placement(self, request: web.Request) -> web.Response:

        machine = self.node.metadata
        placement = None if machine is None else machine.placement()
        change = None if machine is None else machine.change()
        return json_response(
            {
                "placement": None if placement is None else placement.to_json(),
                "change": None if change is None else change.to_json(),
            }
        )


def add_cluster_routes(app: web.Application, node: Node, api: ApiCore) -> ClusterApi:
    cluster = ClusterApi(node, api)
    r = app.router
    r.add_get("/v1/cluster/placement", cluster.placement)
    r.add_post("/v1/cluster/nodes", cluster.add_node)
    r.add_delete("/v1/cluster/nodes/{node}", cluster.remove_node)
    r.add_post("/v1/cluster/groups/{group}/move", cluster.move)
    r.add_post("/v1/cluster/groups/{group}/leader", cluster.leader)
    r.add_post("/v1/cluster/rebalance", cluster.rebalance)
    r.add_delete("/v1/cluster/change", cluster.cancel)
    r.add_get("/internal/placement", cluster.internal_placement)
    r.add_post(PROOF_PATH, cluster.internal_proof)

    async def start_coordinator(app: web.Application) -> None:
        task = asyncio.create_task(cluster.coordinator.run_forever())

        async def stop(app: web.Application) -> None:
            task.cancel()

        app.on_cleanup.append(stop)

    app.on_startup.append(start_coordinator)
    return cluster
