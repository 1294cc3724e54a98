# Licensed under the Apache License, Version 2.0 (the "License"); you may
# not use this file except in compliance with the License. You may obtain
# a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
# License for the specific language governing permissions and limitations
# under the License.

"""The fake nodes of a standalone Ironic, one way for the tests, the demo and the
benchmarks, through ironicclient (imported when first needed).

:func:`make_client`; :func:`create_nodes` (``fake-hardware``, state ``enroll``,
optional ``instance_uuid``/shard/owner); :func:`make_available` (manage + provide);
:func:`power_off` and :func:`make_buildable` (available with a power state, as an
allocation needs); :func:`tear_down`; :func:`list_allocations`; :func:`list_nodes` (a
filtered listing that stays filtered across pages); :func:`delete_nodes`,
:func:`delete_all_nodes` and :class:`NodeFactory`.
"""

from __future__ import annotations

import os
import sys
import time
import uuid as uuidlib
from collections.abc import Callable
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode

# Pinned: no negotiation round trip, no version cache file, and the same behaviour whatever
# Ironic release is installed.  1.82 is the first version with everything the project
# filters on (conductor_group 1.46, owner/lessee 1.50/1.65, shard 1.82).
API_VERSION = "1.82"
FAKE_DRIVER = "fake-hardware"
DEFAULT_PROPERTIES = {"cpus": 16, "memory_mb": 65536, "local_gb": 480, "cpu_arch": "x86_64"}
DEFAULT_RESOURCE_CLASS = "baremetal"


def isolate_version_cache(cache_home: str | os.PathLike) -> None:
    """Keep ironicclient's API-version cache out of ``~/.cache`` (it only writes one after
    negotiating, i.e. with ``'latest'``): sets ``XDG_CACHE_HOME`` for child processes and
    re-points an already imported ironicclient."""
    os.environ["XDG_CACHE_HOME"] = str(cache_home)
    filecache = sys.modules.get("ironicclient.common.filecache")
    if filecache is not None and getattr(filecache, "CACHE", None) is None:
        filecache.CACHE_DIR = os.path.join(str(cache_home), "python-ironicclient")
        filecache.CACHE_FILENAME = os.path.join(filecache.CACHE_DIR, "ironic-api-version.dbm")


def make_client(url: str, api_version: str = API_VERSION, timeout: float = 30.0, **kwargs):
    """An ironicclient v1 client for a noauth Ironic at ``url``.

    ``max_retries=0``: ironicclient otherwise retries 409/503 five times, 2 s apart, which
    hides errors and slows tests.  ``api_version`` is pinned (see ``API_VERSION``).
    """
    from ironicclient import client as ironic_client

    params: dict[str, Any] = {
        "endpoint": url.rstrip("/"),
        "os_ironic_api_version": api_version,
        "max_retries": 0,
        "api_timeout": timeout,
    }
    params.update(kwargs)
    return ironic_client.get_client("1", **params)


def _status(exc: Exception) -> int | None:
    return getattr(exc, "http_status", None) or getattr(exc, "status_code", None)


def _value(spec, index: int):
    return spec(index) if callable(spec) else spec


def create_nodes(
    client,
    count: int,
    conductor_group: str = "",
    name_prefix: str | None = "node",
    properties: dict | Callable[[int], dict] | None = None,
    resource_class: str | Callable[[int], str] | None = DEFAULT_RESOURCE_CLASS,
    shard: str | Callable[[int], str] | None = None,
    instance_uuids: bool | list | Callable[[int], str | None] | None = None,
    owner: str | None = None,
    extra: dict | Callable[[int], dict] | None = None,
    start_index: int = 0,
    workers: int = 2,
    created: list[str] | None = None,
    **fields: Any,
) -> list[str]:
    """Create ``count`` ``fake-hardware`` nodes through the API; return their uuids in order.

    Nodes are created in state ``enroll`` (use :func:`make_available` to reach ``available``).

    * ``name_prefix``: names are ``<prefix>-0000``, ``<prefix>-0001``...; None for no name.
    * ``properties``: dict, or ``callable(i) -> dict``; default :data:`DEFAULT_PROPERTIES`.
    * ``instance_uuids``: None (no instance), True (a random uuid per node), a list (one per
      node, None for "no instance"), or ``callable(i) -> str | None``.
    * ``conductor_group`` must be served by a conductor (lower case), otherwise HTTP 400.
    * ``shard`` needs API 1.82 (the default pinned version); ``fields``: any other node field
      (``uuid``, ``name``...).  ``shard`` and every field may be ``callable(i)`` too.
    * ``workers``: parallel POSTs.  Ironic on SQLite serialises the writes: ~30 nodes/s
      whatever the number of workers; 2 overlaps the round trips a little.
    * ``created``: a list that each new uuid is appended to as soon as it exists, so a caller
      can clean up after a batch that failed half way (:class:`NodeFactory` uses it).
    """
    if isinstance(instance_uuids, list) and len(instance_uuids) < count:
        raise ValueError(f"instance_uuids has {len(instance_uuids)} entries for {count} nodes")

    def body(i: int) -> dict:
        index = start_index + i
        node: dict[str, Any] = {
            "driver": FAKE_DRIVER,
            "conductor_group": conductor_group,
            "properties": dict(_value(properties, i) if properties is not None
                               else DEFAULT_PROPERTIES),
        }
        if name_prefix:
            node["name"] = f"{name_prefix}-{index:04d}"
        rc = _value(resource_class, i)
        if rc is not None:
            node["resource_class"] = rc
        if shard is not None:
            node["shard"] = _value(shard, i)
        if owner is not None:
            node["owner"] = owner
        if extra is not None:
            node["extra"] = dict(_value(extra, i))
        if instance_uuids is True:
            node["instance_uuid"] = str(uuidlib.uuid4())
        elif isinstance(instance_uuids, list):
            if instance_uuids[i] is not None:
                node["instance_uuid"] = str(instance_uuids[i])
        elif instance_uuids is not None:
            value = instance_uuids(i)
            if value is not None:
                node["instance_uuid"] = str(value)
        node.update({key: _value(value, i) for key, value in fields.items()})
        return node

    def post(i: int) -> str:
        # ironicclient's node.create() refuses instance_uuid, Ironic's POST /v1/nodes accepts
        # it: POST the body through the client's HTTP layer (same session, version header).
        _resp, node = retry_locked(
            lambda: client.node.api.json_request("POST", "/v1/nodes", body=body(i)))
        if created is not None:
            created.append(node["uuid"])
        return node["uuid"]

    if workers <= 1 or count <= 1:
        return [post(i) for i in range(count)]

    with ThreadPoolExecutor(max_workers=min(workers, count)) as pool:
        return list(pool.map(post, range(count)))


def _transient(exc: Exception) -> bool:
    """409 "node locked" (another operation holds the node), 503, a 500 "database is locked"
    or a connection that failed or timed out (a busy Ironic on SQLite): worth retrying."""
    status = _status(exc)
    if status is None:
        return any(kind in cls.__name__
                   for cls in type(exc).__mro__ for kind in ("Connect", "Timeout"))
    return status == 503 or (status in (409, 500) and "locked" in str(exc).lower())


def retry_locked(fn: Callable[[], Any], timeout: float = 30.0):
    """Call ``fn``, retrying while the node is locked (the client has ``max_retries=0``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception as exc:
            if not _transient(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _wait_states(client, uuids: list[str], target: str, transient: set[str],
                 timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(uuids)
    while pending:
        still = []
        for uuid in pending:
            node = client.node.get(uuid, fields=["uuid", "provision_state", "last_error"])
            if node.provision_state == target:
                continue
            if node.provision_state not in transient:
                raise RuntimeError(f"node {uuid} went to {node.provision_state!r} instead of "
                                   f"{target!r}: {node.last_error}")
            still.append(uuid)
        pending = still
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} node(s) not {target!r} after {timeout} s: "
                                   f"{pending[:5]}")
            time.sleep(0.2)


def make_available(client, uuids: str | Iterable[str], timeout: float = 60.0) -> None:
    """Drive nodes ``enroll`` -> ``manageable`` -> ``available`` (manage, then provide, with the
    fake interfaces: instant) and wait.  Nodes already further along are left alone."""
    uuids = [uuids] if isinstance(uuids, str) else list(uuids)
    states = {u: client.node.get(u, fields=["uuid", "provision_state"]).provision_state
              for u in uuids}
    to_manage = [u for u, s in states.items() if s == "enroll"]
    for u in to_manage:
        retry_locked(lambda u=u: client.node.set_provision_state(u, "manage"))
    _wait_states(client, to_manage, "manageable", {"enroll", "verifying"}, timeout)
    to_provide = [u for u, s in states.items() if s in ("enroll", "manageable")]
    for u in to_provide:
        retry_locked(lambda u=u: client.node.set_provision_state(u, "provide"))
    _wait_states(client, to_provide, "available",
                 {"manageable", "cleaning", "clean wait"}, timeout)


def power_off(client, uuids: str | Iterable[str], timeout: float = 60.0) -> None:
    """Set the power state ``power off`` and wait for it.

    A fresh ``fake-hardware`` node has no power state (manage and provide do not give it
    one), and Ironic allocates only nodes that have one.
    """
    uuids = [uuids] if isinstance(uuids, str) else list(uuids)

    with ThreadPoolExecutor(max_workers=4) as pool:  # overlaps the round trips
        list(pool.map(lambda u: retry_locked(lambda: client.node.set_power_state(u, "off")),
                      uuids))
    deadline = time.monotonic() + timeout
    pending = set(uuids)
    while pending:
        pending = {u for u in pending
                   if client.node.get(u, fields=["uuid", "power_state"]).power_state
                   != "power off"}
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} node(s) not powered off after {timeout} s")
            time.sleep(0.2)


def make_buildable(client, uuids: str | Iterable[str], timeout: float = 60.0) -> None:
    """:func:`make_available` and :func:`power_off`: nodes an Ironic allocation can pick."""
    make_available(client, uuids, timeout)
    power_off(client, uuids, timeout)


def tear_down(client, uuids: str | Iterable[str], timeout: float = 120.0,
              workers: int = 4) -> None:
    """Undeploy nodes (``deleted``: ``active`` -> cleaning -> ``available``) and wait.

    Ironic removes each node's allocation itself; nodes not in a state that can be
    undeployed are left alone (``available`` ones are waited for like the rest).
    """
    uuids = [uuids] if isinstance(uuids, str) else list(uuids)
    states = {u: client.node.get(u, fields=["uuid", "provision_state"]).provision_state
              for u in uuids}
    to_delete = [u for u, s in states.items() if s in ("active", "deploy failed", "error")]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(lambda u: retry_locked(
            lambda: client.node.set_provision_state(u, "deleted")), to_delete))
    _wait_states(client, uuids, "available",
                 {"active", "deploy failed", "error", "deleting", "cleaning", "clean wait"},
                 timeout)


def list_allocations(client) -> list[dict]:
    """Every allocation (uuid, name, node_uuid, state, last_error) as plain dicts,
    read once more when the first read found its connection closed (see
    :func:`_read_once_more_if_dropped`)."""
    return _read_once_more_if_dropped(lambda: [a.to_dict() for a in client.allocation.list(
        limit=0, fields=["uuid", "name", "node_uuid", "state", "last_error"])])


def delete_nodes(client, uuids: Iterable[str], timeout: float = 30.0, workers: int = 4) -> int:
    """Delete nodes, whatever their state (maintenance on when Ironic refuses, e.g. a node with
    an instance or in ``active``); missing nodes are ignored.  Returns how many were deleted."""

    def delete(uuid: str) -> int:
        try:
            retry_locked(lambda: client.node.delete(uuid), timeout)
        except Exception as exc:
            status = _status(exc)
            if status == 404:
                return 0
            if status not in (400, 409):
                raise
            try:
                retry_locked(lambda: client.node.update(uuid, [
                    {"op": "replace", "path": "/maintenance", "value": True},
                    {"op": "replace", "path": "/protected", "value": False},
                ]), timeout)
                retry_locked(lambda: client.node.delete(uuid), timeout)
            except Exception as again:
                if _status(again) == 404:
                    return 0
                raise
        return 1

    uuids = list(uuids)
    if workers <= 1 or len(uuids) <= 1:
        return sum(delete(u) for u in uuids)

    with ThreadPoolExecutor(max_workers=min(workers, len(uuids))) as pool:
        return sum(pool.map(delete, uuids))


def list_nodes(client, fields: Iterable[str] | None = None, page_size: int | None = None,
               **filters: Any) -> list[dict]:
    """Every node matching ``filters`` (query parameters of ``GET /v1/nodes``, e.g.
    ``conductor_group="group-a"``, ``shard="s1"``, ``associated=True``), as plain dicts.

    Do not use ``client.node.list(limit=0, conductor_group=...)`` across pages: Ironic's
    ``next`` links keep only sort_key/sort_dir/fields/limit/marker (and associated,
    maintenance, retired, detail), so from the second page on ironicclient lists nodes of
    *every* group.  This helper sends the filters with every page and pages with
    ``marker`` = the last uuid of the previous page, while the server says there is more.
    """
    params: dict[str, Any] = {}
    for key, value in filters.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (list, tuple, set)):
            value = ",".join(value)
        params[key] = value
    if fields is not None:
        fields = list(fields)
        if "uuid" not in fields:
            fields.append("uuid")
        params["fields"] = ",".join(fields)
    if page_size:
        params["limit"] = page_size
    nodes: list[dict] = []
    marker = None
    while True:
        query = dict(params, **({"marker": marker} if marker else {}))
        url = "/v1/nodes?" + urlencode(query)
        body = _read_once_more_if_dropped(
            lambda url=url: client.node.api.json_request("GET", url)[1])
        page = body.get("nodes", [])
        nodes.extend(page)
        if not page or not body.get("next"):
            return nodes
        marker = page[-1]["uuid"]


def _read_once_more_if_dropped(read: Callable[[], Any]) -> Any:
    """What ``read()`` returns, called a second time when the first found its
    kept-alive connection closed by the server (the harness client's
    ``max_retries=0`` retries nothing). A read changes nothing, so sending
    it again is safe; Ironic's API closes idle connections, and the next
    request on one may race that close. A second failure is raised."""
    from keystoneauth1 import exceptions as ks_exceptions

    try:
        return read()
    except ks_exceptions.ConnectFailure:
        return read()


def delete_all_nodes(client, name_prefix: str | None = None) -> int:
    """Delete every node (or those whose name starts with ``name_prefix``)."""
    nodes = client.node.list(limit=0, fields=["uuid", "name"])  # no filter: paging is safe
    uuids = [n.uuid for n in nodes
             if name_prefix is None or (n.name or "").startswith(name_prefix)]
    return delete_nodes(client, uuids)


class NodeFactory:
    """Creates nodes under one name prefix and deletes them all in :meth:`cleanup`."""

    def __init__(self, client, name_prefix: str) -> None:
        self.client = client
        self.name_prefix = name_prefix
        self.uuids: list[str] = []
        self._batches = 0

    def create(self, count: int, conductor_group: str = "", **kwargs: Any) -> list[str]:
        """:func:`create_nodes` with a unique name prefix per call
        (``<test>-<rand>-<batch>-<i>``); the uuids are remembered for cleanup."""
        kwargs.setdefault("name_prefix", f"{self.name_prefix}-{self._batches}")
        self._batches += 1
        return create_nodes(self.client, count, conductor_group=conductor_group,
                            created=self.uuids, **kwargs)

    def make_available(self, uuids: str | Iterable[str], timeout: float = 60.0) -> None:
        make_available(self.client, uuids, timeout)

    def cleanup(self) -> None:
        uuids, self.uuids = self.uuids, []
        delete_nodes(self.client, uuids)


# --------------------------------------------------------------------------- CLI
