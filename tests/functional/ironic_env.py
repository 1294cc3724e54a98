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

"""pytest fixtures for functional tests against a real, standalone Ironic.

The server and the node helpers are ``ironic_compute.harness.ironic``'s; this module
is the pytest side (the session's one server, skip or fail when it cannot start) and
re-exports the helpers for the tests.

Not a conftest: ``tests/functional/conftest.py`` imports what it needs, e.g.::

    from tests.functional.ironic_env import ironic_client  # noqa: F401
    from tests.functional.ironic_env import ironic_nodes  # noqa: F401
    from tests.functional.ironic_env import ironic_server  # noqa: F401

Fixtures
    ``ironic_server`` (session): an :class:`IronicEnv`.  Starts one Ironic for the whole
    session (``ironic_compute.harness.ironic``; installed on first use, ~40 s) with the conductor
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
                              makes one on the local MariaDB (``harness.databases``) and drops
                              it at the end, or, off CI without MariaDB, uses SQLite, whose
                              locking fails some concurrent conductor work.
    ``CI``                    when true, failing to install or start Ironic fails the tests;
                              otherwise they are skipped with a hint.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import urllib.error
import uuid as uuidlib
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import pytest

from ironic_compute.harness import databases
from ironic_compute.harness import ironic as standalone
from ironic_compute.harness.databases import on_ci
from ironic_compute.harness.ironic import API_VERSION  # noqa: F401
from ironic_compute.harness.ironic import DEFAULT_PROPERTIES  # noqa: F401
from ironic_compute.harness.ironic import DEFAULT_RESOURCE_CLASS  # noqa: F401
from ironic_compute.harness.ironic import FAKE_DRIVER  # noqa: F401
from ironic_compute.harness.ironic import NodeFactory
from ironic_compute.harness.ironic import create_nodes  # noqa: F401
from ironic_compute.harness.ironic import delete_all_nodes  # noqa: F401
from ironic_compute.harness.ironic import delete_nodes  # noqa: F401
from ironic_compute.harness.ironic import isolate_version_cache
from ironic_compute.harness.ironic import list_allocations  # noqa: F401
from ironic_compute.harness.ironic import list_nodes  # noqa: F401
from ironic_compute.harness.ironic import make_available  # noqa: F401
from ironic_compute.harness.ironic import make_buildable  # noqa: F401
from ironic_compute.harness.ironic import make_client
from ironic_compute.harness.ironic import power_off  # noqa: F401
from ironic_compute.harness.ironic import retry_locked  # noqa: F401

SESSION_GROUPS = ("", "group-a", "group-b")
SESSION_PAGE_SIZE = 20
INSTALL_HINT = ("run `python tools/ironic_standalone.py install` once (needs PyPI, ~40 s), "
                "or point IRONIC_URL at a running Ironic")


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
    try:
        _Session.database = databases.ProvisionedDatabase("mysql")
    except databases.DatabaseUnavailable as exc:
        if on_ci():
            pytest.fail(f"CI=true and {exc}", pytrace=False)
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
    class ConfiguredServer(standalone.IronicServer):
        def write_config(self) -> None:
            super().write_config()
            with open(self.etc_dir / "ironic.conf", "a") as f:
                f.write("\n" + standalone.render_config(extra_config))

    database = None
    if not os.environ.get("IRONIC_DATABASE_URL"):
        try:
            database = databases.ProvisionedDatabase("mysql")
        except databases.DatabaseUnavailable as exc:
            if on_ci():
                pytest.fail(f"CI=true and {exc}", pytrace=False)
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


def node_name_prefix(request) -> str:
    """A node-name prefix unique to the running test (node names must be unique)."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40] or "test"
    return f"{base}-{uuidlib.uuid4().hex[:6]}"
