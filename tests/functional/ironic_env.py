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

"""pytest helpers for functional tests against a real, standalone Ironic.

Not a conftest: ``tests/functional/conftest.py`` imports what it needs, e.g.::

    from tests.functional.ironic_env import ironic_client  # noqa: F401
    from tests.functional.ironic_env import ironic_nodes  # noqa: F401
    from tests.functional.ironic_env import ironic_server  # noqa: F401

Fixtures
    ``ironic_server`` (session): an :class:`IronicEnv`.  Starts one Ironic for the whole
    session (``tools/ironic_standalone.py``; installed on first use, ~40 s) with the conductor
    groups ``""``, ``"group-a"``, ``"group-b"`` and a page size of 20 so that listings
    paginate, and stops it at the end.  The fixture may be imported into several modules:
    they all share one server.
    ``ironic_client`` (session): an ironicclient v1 client for it (see :func:`make_client`).
    ``ironic_nodes`` (function): a :class:`NodeFactory` whose nodes are deleted after the test.
    :func:`private_server` (a context manager, not a fixture): an Ironic of the caller's own
    with extra configuration, e.g. slow fake deploys (``tests/functional/test_fencing.py``).

Helpers
    :func:`make_client`, :func:`create_nodes` (``fake-hardware``, state ``enroll``, optional
    ``instance_uuid``/shard/owner), :func:`make_available` (manage + provide),
    :func:`power_off` and :func:`make_buildable` (available with a power state, as an
    allocation needs), :func:`list_allocations`,
    :func:`list_nodes` (filtered listing that stays filtered across pages: ironicclient's
    ``node.list(limit=0, conductor_group=...)`` does NOT, see there), :func:`delete_nodes`,
    :func:`delete_all_nodes`.  ``env.server`` (managed sessions only) is the
    ``IronicServer``: ``stop_process("ironic"|group, sig=...)``, ``start_process(...)``,
    ``restart(down_for=...)``, ``pids``, ``log_tail(name)``.

Environment variables
    ``IRONIC_URL``            use this already-running Ironic instead of starting one; it is
                              neither started nor stopped (``env.server`` is None), and its
                              conductor groups are read from ``GET /v1/conductors``.
    ``IRONIC_MAX_LIMIT``      page size of the Ironic given by ``IRONIC_URL`` (informational).
    ``IRONIC_VENV``           Ironic's own virtualenv (default ``<repo>/.ironic/venv``).
    ``IRONIC_STATE_DIR``      state dir of the session server (default: a pytest temp dir).
    ``IRONIC_PIP_SPEC``       what to pip install (default ``ironic``).
    ``IRONIC_PYTHON``         interpreter for Ironic's venv (default: the running one).
    ``IRONIC_START_TIMEOUT``  seconds to wait for the server (default 120).
    ``IRONIC_DATABASE_URL``   an empty MariaDB/MySQL database for it; by default the session
                              makes one on the local MariaDB (tests/db_fixtures.py) and drops
                              it at the end, or, off CI without MariaDB, uses SQLite, whose
                              locking fails some concurrent conductor work.
    ``CI``                    when true, failing to install or start Ironic fails the tests;
                              otherwise they are skipped with a hint.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import threading
import time
import urllib.error
import uuid as uuidlib
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDALONE_SCRIPT = REPO_ROOT / "tools" / "ironic_standalone.py"

SESSION_GROUPS = ("", "group-a", "group-b")
SESSION_PAGE_SIZE = 20
# Pinned: no negotiation round trip, no version cache file, and the same behaviour whatever
# Ironic release is installed.  1.82 is the first version with everything the project
# filters on (conductor_group 1.46, owner/lessee 1.50/1.65, shard 1.82).
API_VERSION = "1.82"
FAKE_DRIVER = "fake-hardware"
DEFAULT_PROPERTIES = {"cpus": 16, "memory_mb": 65536, "local_gb": 480, "cpu_arch": "x86_64"}
DEFAULT_RESOURCE_CLASS = "baremetal"
INSTALL_HINT = ("run `python tools/ironic_standalone.py install` once (needs PyPI, ~40 s), "
                "or point IRONIC_URL at a running Ironic")


def load_standalone():
    """Import ``tools/ironic_standalone.py`` (tools/ is not a package)."""
    name = "ironic_standalone"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, STANDALONE_SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------- client


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


# --------------------------------------------------------------------------- session server


@dataclass
class IronicEnv:
    """What the ``ironic_server`` fixture yields."""

    url: str
    groups: tuple[str, ...]
    page_size: int | None
    server: Any = None  # ironic_standalone.IronicServer, None when IRONIC_URL was given
    _client: Any = field(default=None, repr=False)

    @property
    def managed(self) -> bool:
        """True when this session started the server (so it may stop/restart it)."""
        return self.server is not None

    def client(self, **kwargs):
        if kwargs:
            return make_client(self.url, **kwargs)
        if self._client is None:
            self._client = make_client(self.url)
        return self._client

    def require_managed(self):
        """The IronicServer, or skip: tests that stop/restart Ironic need one they own."""
        if self.server is None:
            pytest.skip("needs an Ironic started by the test session (IRONIC_URL is set)")
        return self.server


class _Session:
    """One server per process even if the fixture is registered in several modules."""

    lock = threading.Lock()
    env: IronicEnv | None = None
    error: str | None = None
    users = 0
    restore_xdg = False
    database: Any = None  # db_fixtures.ProvisionedDatabase made for the server


def _terminal_output(config) -> contextlib.AbstractContextManager:
    """Let install/start progress reach the terminal despite output capturing."""
    capman = config.pluginmanager.getplugin("capturemanager") if config else None
    if capman is None:
        return contextlib.nullcontext()
    return capman.global_and_fixture_disabled()


def _give_up(message: str):
    if on_ci():
        pytest.fail(f"standalone Ironic unavailable on CI: {message}", pytrace=False)
    pytest.skip(f"standalone Ironic unavailable: {message.splitlines()[0]} -- {INSTALL_HINT}")


def _external_env(url: str) -> IronicEnv:
    standalone = load_standalone()
    try:
        conductors = standalone.list_conductors(url.rstrip("/"))
    except (OSError, ValueError, urllib.error.URLError) as exc:
        _give_up(f"IRONIC_URL={url} does not answer GET /v1/conductors: {exc}")
    groups = sorted({c.get("conductor_group", "") for c in conductors if c.get("alive")})
    page = os.environ.get("IRONIC_MAX_LIMIT")
    return IronicEnv(url=url.rstrip("/"), groups=tuple(groups),
                     page_size=int(page) if page else None)


def start_session_server(config=None, tmp_path_factory=None,
                         groups: Iterable[str] = SESSION_GROUPS,
                         page_size: int = SESSION_PAGE_SIZE) -> IronicEnv:
    """Start (or reuse) the session's Ironic; pair every call with :func:`release_session`."""
    with _Session.lock:
        _Session.users += 1
        if _Session.env is not None:
            return _Session.env
        if _Session.error is not None:
            _give_up(_Session.error)
        if tmp_path_factory is not None:
            base = tmp_path_factory.mktemp("ironic", numbered=True)
        else:
            import tempfile

            base = Path(tempfile.mkdtemp(prefix="ironic-"))
        if "XDG_CACHE_HOME" not in os.environ:
            _Session.restore_xdg = True
            isolate_version_cache(base / "xdg-cache")

        url = os.environ.get("IRONIC_URL")
        if url:
            _Session.env = _external_env(url)
            return _Session.env

        standalone = load_standalone()
        state_dir = os.environ.get("IRONIC_STATE_DIR") or str(base / "state")
        server = standalone.IronicServer(
            state_dir=state_dir, port=0, groups=list(groups), max_limit=page_size,
            die_with_parent=True, log=lambda msg: print(f"[ironic] {msg}", flush=True),
            database_url=_session_database_url())
        try:
            with _terminal_output(config):
                server.start()  # installs first when needed (idempotent)
        except Exception as exc:  # noqa: BLE001 - reported through fail/skip
            with contextlib.suppress(Exception):
                server.stop(quiet=True)
            _Session.error = f"{type(exc).__name__}: {exc}"
            _give_up(_Session.error)
        _Session.env = IronicEnv(url=server.url, groups=tuple(server.groups),
                                 page_size=page_size, server=server)
        return _Session.env


def release_session() -> None:
    with _Session.lock:
        _Session.users = max(0, _Session.users - 1)
        if _Session.users or _Session.env is None:
            return
        env, _Session.env = _Session.env, None
        if _Session.restore_xdg:
            os.environ.pop("XDG_CACHE_HOME", None)
            _Session.restore_xdg = False
        if env.server is not None:
            env.server.stop(quiet=True)
        if _Session.database is not None:
            _Session.database.drop()
            _Session.database = None


def _session_database_url() -> str | None:
    """A fresh MariaDB database for the session's Ironic (None: SQLite)."""
    if os.environ.get("IRONIC_DATABASE_URL"):
        return None  # IronicServer reads it
    from tests import db_fixtures

    try:
        _Session.database = db_fixtures.ProvisionedDatabase("mysql")
    except pytest.skip.Exception as exc:  # off CI without MariaDB (on CI it fails)
        print(f"[ironic] SQLite instead of MariaDB: {exc}", flush=True)
        return None
    return _Session.database.url


@contextlib.contextmanager
def private_server(tmp_path_factory, extra_config: dict[str, dict[str, object]],
                   groups: Iterable[str] = ("",), page_size: int = SESSION_PAGE_SIZE):
    """An Ironic of the caller's own, with ``extra_config`` ({section: {key: value}})
    added to its configuration; yields an :class:`IronicEnv` and stops it at the end.

    For what the session's server must not have, e.g. ``{"fake": {"deploy_delay": 4}}``
    (every fake deploy step and tear down sleeps that long): deploys that take long enough
    to freeze a service in the middle of one.  Its database is a fresh MariaDB one when
    the local MariaDB answers (dropped at the end), else SQLite.  Fails on CI, skips
    elsewhere, when Ironic cannot be installed or started.
    """
    standalone = load_standalone()

    class ConfiguredServer(standalone.IronicServer):
        def write_config(self) -> None:
            super().write_config()
            with open(self.etc_dir / "ironic.conf", "a") as f:
                f.write("\n" + standalone.render_config(extra_config))

    from tests import db_fixtures

    database = None
    if not os.environ.get("IRONIC_DATABASE_URL"):
        try:
            database = db_fixtures.ProvisionedDatabase("mysql")
        except pytest.skip.Exception:
            database = None
    base = tmp_path_factory.mktemp("ironic-private", numbered=True)
    server = ConfiguredServer(state_dir=str(base / "state"), port=0, groups=list(groups),
                              max_limit=page_size, die_with_parent=True,
                              log=lambda msg: print(f"[ironic-private] {msg}", flush=True),
                              database_url=database.url if database else None)
    try:
        try:
            server.start()
        except Exception as exc:  # noqa: BLE001 - reported through fail/skip
            _give_up(f"{type(exc).__name__}: {exc}")
        yield IronicEnv(url=server.url, groups=tuple(server.groups), page_size=page_size,
                        server=server)
    finally:
        server.stop(quiet=True)
        if database is not None:
            database.drop()


@pytest.fixture(scope="session")
def ironic_server(request, tmp_path_factory) -> Iterable[IronicEnv]:
    """The session's standalone Ironic (see the module docstring)."""
    try:
        env = start_session_server(request.config, tmp_path_factory)
    except BaseException:
        release_session()
        raise
    try:
        yield env
    finally:
        release_session()


@pytest.fixture(scope="session")
def ironic_client(ironic_server):
    return ironic_server.client()


@pytest.fixture
def ironic_nodes(ironic_server, request):
    """A :class:`NodeFactory` with a per-test name prefix; its nodes are deleted afterwards."""
    factory = NodeFactory(ironic_server.client(), name_prefix=node_name_prefix(request))
    try:
        yield factory
    finally:
        factory.cleanup()


# --------------------------------------------------------------------------- nodes


def node_name_prefix(request) -> str:
    """A node-name prefix unique to the running test (node names must be unique)."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40] or "test"
    return f"{base}-{uuidlib.uuid4().hex[:6]}"


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
    shard: str | None = None,
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
    * ``shard`` needs API 1.82 (the default pinned version); ``fields``: any other node field.
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
            node["shard"] = shard
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
        node.update(fields)
        return node

    def post(i: int) -> str:
        # ironicclient's node.create() refuses instance_uuid, Ironic's POST /v1/nodes accepts
        # it: POST the body through the client's HTTP layer (same session, version header).
        _resp, node = client.node.api.json_request("POST", "/v1/nodes", body=body(i))
        if created is not None:
            created.append(node["uuid"])
        return node["uuid"]

    if workers <= 1 or count <= 1:
        return [post(i) for i in range(count)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(workers, count)) as pool:
        return list(pool.map(post, range(count)))


def _transient(exc: Exception) -> bool:
    """409 "node locked" (another operation holds the node), 503, or a connection that failed
    or timed out (a busy Ironic on SQLite): worth retrying."""
    status = _status(exc)
    if status is None:
        return any(kind in cls.__name__
                   for cls in type(exc).__mro__ for kind in ("Connect", "Timeout"))
    return status == 503 or (status == 409 and "locked" in str(exc).lower())


def _retry_locked(fn: Callable[[], Any], timeout: float = 30.0):
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
        _retry_locked(lambda u=u: client.node.set_provision_state(u, "manage"))
    _wait_states(client, to_manage, "manageable", {"enroll", "verifying"}, timeout)
    to_provide = [u for u, s in states.items() if s in ("enroll", "manageable")]
    for u in to_provide:
        _retry_locked(lambda u=u: client.node.set_provision_state(u, "provide"))
    _wait_states(client, to_provide, "available",
                 {"manageable", "cleaning", "clean wait"}, timeout)


def power_off(client, uuids: str | Iterable[str], timeout: float = 60.0) -> None:
    """Set the power state ``power off`` and wait for it.

    A fresh ``fake-hardware`` node has no power state (manage and provide do not give it
    one), and Ironic allocates only nodes that have one.
    """
    uuids = [uuids] if isinstance(uuids, str) else list(uuids)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:  # overlaps the round trips
        list(pool.map(lambda u: _retry_locked(lambda: client.node.set_power_state(u, "off")),
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


def list_allocations(client) -> list[dict]:
    """Every allocation (uuid, name, node_uuid, state, last_error) as plain dicts."""
    return [a.to_dict() for a in client.allocation.list(
        limit=0, fields=["uuid", "name", "node_uuid", "state", "last_error"])]


def delete_nodes(client, uuids: Iterable[str], timeout: float = 30.0, workers: int = 4) -> int:
    """Delete nodes, whatever their state (maintenance on when Ironic refuses, e.g. a node with
    an instance or in ``active``); missing nodes are ignored.  Returns how many were deleted."""

    def delete(uuid: str) -> int:
        try:
            _retry_locked(lambda: client.node.delete(uuid), timeout)
        except Exception as exc:
            status = _status(exc)
            if status == 404:
                return 0
            if status not in (400, 409):
                raise
            try:
                _retry_locked(lambda: client.node.update(uuid, [
                    {"op": "replace", "path": "/maintenance", "value": True},
                    {"op": "replace", "path": "/protected", "value": False},
                ]), timeout)
                _retry_locked(lambda: client.node.delete(uuid), timeout)
            except Exception as again:
                if _status(again) == 404:
                    return 0
                raise
        return 1

    uuids = list(uuids)
    if workers <= 1 or len(uuids) <= 1:
        return sum(delete(u) for u in uuids)
    from concurrent.futures import ThreadPoolExecutor

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
        _resp, body = client.node.api.json_request("GET", "/v1/nodes?" + urlencode(query))
        page = body.get("nodes", [])
        nodes.extend(page)
        if not page or not body.get("next"):
            return nodes
        marker = page[-1]["uuid"]


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
