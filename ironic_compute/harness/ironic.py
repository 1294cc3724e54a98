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

"""A real, standalone OpenStack Ironic on this machine, and its fake nodes.

The server (:class:`IronicServer`) needs only the standard library; its CLI is
``tools/ironic_standalone.py`` (:mod:`.ironic_cli`)::

    python tools/ironic_standalone.py install          # venv + ``pip install ironic`` (~40 s, once)
    python tools/ironic_standalone.py start            # config, DB, processes; waits until ready
    python tools/ironic_standalone.py status [--json]
    python tools/ironic_standalone.py stop             # SIGTERM, then SIGKILL; idempotent

What ``start`` runs (Ironic with SQLite, no Keystone, JSON-RPC between its services):

* one ``ironic`` process: API + conductor for the default conductor group ``""``,
  listening on ``http://127.0.0.1:<port>``;
* one ``ironic-conductor`` process per extra conductor group (``--groups ,group-a,group-b``).
  Ironic refuses to create a node whose conductor group no conductor serves (HTTP 400).

Nodes use the ``fake-hardware`` driver with the ``fake`` interfaces (network and storage
``noop``), so provisioning actions succeed instantly without any real machine.

Ironic has pins that clash with the project's, so it lives in its own virtualenv
(default ``<repo>/.ironic/venv``). Its configuration, SQLite database, logs (stdout and
stderr of every process), pid files and ``state.json`` live in the state directory
(default ``<repo>/.ironic/state``).

The processes run detached from the terminal (own session); they are stopped with
``stop``, which uses the pid files.  A fresh ``start`` first stops whatever an earlier
run in the same state directory left behind.  When the Python API is used with
``die_with_parent=True`` (as the test fixture does), the processes also get SIGTERM when
the Python process that started them dies (Linux PR_SET_PDEATHSIG) and at interpreter
exit; this is best effort, and ``stop`` remains the cleanup that always works.

Every option has an environment fallback; see ``--help``.

The server is split by concern: :mod:`.ironic_layout` (defaults, process names, the
state directory), :mod:`.ironic_venv` (its virtualenv), :mod:`.ironic_config` (ports and
configuration files), :mod:`.ironic_processes` (start, readiness, stop) and
:class:`IronicServer` here, which puts them in order. The nodes are in
:mod:`.ironic_nodes`; the process helpers the demo and the Placement harness reuse
(:func:`spawn`, :func:`terminate`, :func:`pip_install`, :func:`venv_lock`,
:func:`run_streamed`, :func:`tail_file`) in :mod:`.processes`. This module re-exports
their public names, so that a caller imports the standalone Ironic from one place.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
from collections.abc import Callable
from collections.abc import Iterable
from pathlib import Path

from ironic_compute.harness import ironic_config
from ironic_compute.harness.ironic_config import FAKE_INTERFACES
from ironic_compute.harness.ironic_config import render_config
from ironic_compute.harness.ironic_layout import CLI
from ironic_compute.harness.ironic_layout import DEFAULT_GROUPS
from ironic_compute.harness.ironic_layout import DEFAULT_MAX_LIMIT
from ironic_compute.harness.ironic_layout import DEFAULT_PIP_SPEC
from ironic_compute.harness.ironic_layout import DEFAULT_PORT
from ironic_compute.harness.ironic_layout import DEFAULT_START_TIMEOUT
from ironic_compute.harness.ironic_layout import DEFAULT_STATE_DIR
from ironic_compute.harness.ironic_layout import DEFAULT_VENV
from ironic_compute.harness.ironic_layout import ENV_VARS
from ironic_compute.harness.ironic_layout import MAIN_PROCESS
from ironic_compute.harness.ironic_layout import REPO_ROOT
from ironic_compute.harness.ironic_layout import StateDir
from ironic_compute.harness.ironic_layout import parse_groups
from ironic_compute.harness.ironic_layout import process_name
from ironic_compute.harness.ironic_nodes import API_VERSION
from ironic_compute.harness.ironic_nodes import DEFAULT_PROPERTIES
from ironic_compute.harness.ironic_nodes import DEFAULT_RESOURCE_CLASS
from ironic_compute.harness.ironic_nodes import FAKE_DRIVER
from ironic_compute.harness.ironic_nodes import NodeFactory
from ironic_compute.harness.ironic_nodes import create_nodes
from ironic_compute.harness.ironic_nodes import delete_all_nodes
from ironic_compute.harness.ironic_nodes import delete_nodes
from ironic_compute.harness.ironic_nodes import isolate_version_cache
from ironic_compute.harness.ironic_nodes import list_allocations
from ironic_compute.harness.ironic_nodes import list_nodes
from ironic_compute.harness.ironic_nodes import make_available
from ironic_compute.harness.ironic_nodes import make_buildable
from ironic_compute.harness.ironic_nodes import make_client
from ironic_compute.harness.ironic_nodes import power_off
from ironic_compute.harness.ironic_nodes import retry_locked
from ironic_compute.harness.ironic_nodes import tear_down
from ironic_compute.harness.ironic_processes import CONDUCTORS_API_VERSION
from ironic_compute.harness.ironic_processes import IronicProcesses
from ironic_compute.harness.ironic_processes import http_get_json
from ironic_compute.harness.ironic_processes import list_conductors
from ironic_compute.harness.ironic_venv import IronicVenv
from ironic_compute.harness.processes import API_HOST
from ironic_compute.harness.processes import DEFAULT_STOP_TIMEOUT
from ironic_compute.harness.processes import IronicError
from ironic_compute.harness.processes import cmdline
from ironic_compute.harness.processes import free_port
from ironic_compute.harness.processes import group_members
from ironic_compute.harness.processes import pid_alive
from ironic_compute.harness.processes import pip_install
from ironic_compute.harness.processes import port_in_use
from ironic_compute.harness.processes import run_streamed
from ironic_compute.harness.processes import spawn
from ironic_compute.harness.processes import tail_file
from ironic_compute.harness.processes import terminate
from ironic_compute.harness.processes import venv_lock

__all__ = [
    'API_HOST', 'API_VERSION', 'CLI', 'CONDUCTORS_API_VERSION', 'DEFAULT_GROUPS',
    'DEFAULT_MAX_LIMIT', 'DEFAULT_PIP_SPEC', 'DEFAULT_PORT', 'DEFAULT_PROPERTIES',
    'DEFAULT_RESOURCE_CLASS', 'DEFAULT_START_TIMEOUT', 'DEFAULT_STATE_DIR',
    'DEFAULT_STOP_TIMEOUT', 'DEFAULT_VENV', 'ENV_VARS', 'FAKE_DRIVER', 'FAKE_INTERFACES',
    'MAIN_PROCESS', 'REPO_ROOT', 'IronicError', 'IronicServer', 'NodeFactory', 'cmdline',
    'create_nodes', 'delete_all_nodes', 'delete_nodes', 'free_port', 'group_members',
    'http_get_json', 'isolate_version_cache', 'list_allocations', 'list_conductors',
    'list_nodes', 'make_available', 'make_buildable', 'make_client', 'parse_groups',
    'pid_alive', 'pip_install', 'port_in_use', 'power_off', 'process_name', 'render_config',
    'retry_locked', 'run_streamed', 'spawn', 'tail_file', 'tear_down', 'terminate',
    'venv_lock',
]


def _print(msg: str) -> None:
    print(f"[ironic-standalone] {msg}", flush=True)


class IronicServer:
    """A standalone Ironic (SQLite, noauth, JSON-RPC, fake-hardware) managed by pid files.

    ``groups`` is the list of conductor groups to serve; ``""`` (the default group, served by
    the combined API + conductor process ``ironic``) is always included.  Every other group
    gets an ``ironic-conductor`` process named ``conductor-<group>``.
    """

    def __init__(
        self,
        venv: str | os.PathLike | None = None,
        state_dir: str | os.PathLike | None = None,
        port: int | None = None,
        groups: str | Iterable[str] | None = None,
        max_limit: int | None = None,
        pip_spec: str | None = None,
        python: str | None = None,
        debug: bool = False,
        die_with_parent: bool = False,
        log: Callable[[str], None] | None = _print,
        database_url: str | None = None,
    ) -> None:
        env = os.environ
        self._log = log or (lambda msg: None)
        self.venv = Path(venv or env.get(ENV_VARS["venv"]) or DEFAULT_VENV).absolute()
        self.files = StateDir(state_dir or env.get(ENV_VARS["state_dir"]) or DEFAULT_STATE_DIR)
        self.state_dir = self.files.path
        # under state_dir: configs, pid files, process logs, the SQLite file, state.json
        self.etc_dir, self.run_dir, self.log_dir = (
            self.files.etc_dir, self.files.run_dir, self.files.log_dir)
        self.db_path, self.state_file = self.files.db_path, self.files.state_file
        if port is None:
            port = int(env.get(ENV_VARS["port"]) or DEFAULT_PORT)
        self.requested_port = int(port)
        self.groups = parse_groups(groups if groups is not None else env.get(ENV_VARS["groups"]))
        self.max_limit = int(max_limit or env.get(ENV_VARS["max_limit"]) or DEFAULT_MAX_LIMIT)
        self.pip_spec = pip_spec or env.get(ENV_VARS["pip_spec"]) or DEFAULT_PIP_SPEC
        self.python = python or env.get(ENV_VARS["python"]) or sys.executable
        self.debug = debug
        self.die_with_parent = die_with_parent
        # An empty MariaDB/MySQL database instead of the SQLite file: SQLite
        # makes concurrent conductor work fail with "database is locked",
        # at times silently (a tear down left in "deleting").
        self.database_url = database_url or env.get(ENV_VARS["database_url"]) or None
        if self.database_url and not self.database_url.startswith("mysql"):
            raise IronicError(f"the database URL must be a MySQL/MariaDB one (mysql+pymysql://"
                              f"...), not {self.database_url.split(':', 1)[0]}")
        self.ironic_venv = IronicVenv(self.venv, self.pip_spec, self.python, self._log)
        self.bin_dir = self.ironic_venv.bin_dir
        self.processes = IronicProcesses(self.files, self.bin_dir, die_with_parent, self._log,
                                         lambda: self.stop(quiet=True))
        self.config_files = self.files.config_files
        self.pid_file = self.files.pid_file
        self.log_path = self.files.log_path

    # ----------------------------------------------------------------- what runs where
    @property
    def process_names(self) -> list[str]:
        return [process_name(g) for g in self.groups]

    @property
    def port(self) -> int | None:
        return self.files.state.get("port")

    @property
    def url(self) -> str:
        port = self.port or self.requested_port
        return f"http://{API_HOST}:{port}"

    @property
    def pids(self) -> dict[str, int | None]:
        """Process name -> pid of the live process (None when it is not running)."""
        return {name: self.processes.running(name)
                for name in self.files.known_names(self.process_names)}

    # ----------------------------------------------------------------- install
    def installed_version(self) -> str | None:
        """Ironic's version when the venv has working entry points, else None."""
        return self.ironic_venv.installed_version()

    def is_installed(self) -> bool:
        return self.ironic_venv.is_installed()

    def install(self, force: bool = False) -> bool:
        """Create the venv and ``pip install`` Ironic into it; False when it was there."""
        return self.ironic_venv.install(force)

    # ----------------------------------------------------------------- start
    def write_config(self) -> None:
        """Write ``etc/ironic.conf`` (shared) and one override file per extra conductor.

        A subclass may add to the files (the functional tests' fixture does).
        """
        ironic_config.write(self.files, self.max_limit, self.debug, self.database_url)

    def start(self, keep_db: bool = False, timeout: float | None = None,
              install: bool = True) -> IronicServer:
        """Start all processes and wait until every conductor group is served.

        A fresh start wipes the SQLite database unless ``keep_db``; it first stops whatever an
        earlier run left behind in the same state directory. Raises IronicError when Ironic
        cannot be installed, configured or started in ``timeout`` seconds.
        """
        timeout = self._timeout(timeout)
        if install:
            self.install()
        elif self.installed_version() is None:
            raise IronicError(f"Ironic is not installed in {self.venv}: run "
                              f"`python {CLI} install` first")
        started = time.monotonic()  # the timeout does not include installing
        self.stop(quiet=True)
        for d in (self.state_dir, self.etc_dir, self.run_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        if not keep_db:
            for f in self.log_dir.glob("*.log"):
                f.unlink()
        self.files.state = ironic_config.plan(self.files, self.requested_port, self.groups,
                                              self.max_limit, self.venv, keep_ports=keep_db)
        self.write_config()
        self.files.write()
        self.ironic_venv.sync_database(self.files, self.database_url, keep_db)
        try:
            # One process at a time: each writes its conductor registration
            # to the shared SQLite file at start, and three at once were
            # seen to crash on "database is locked".
            for name in self.process_names:
                self.processes.spawn(name)
                self.wait_ready([name], timeout - (time.monotonic() - started))
        except Exception:
            self.stop(quiet=True)
            raise
        self._log(f"Ironic ready at {self.url} in {time.monotonic() - started:.1f} s "
                  f"(groups: {', '.join(repr(g) for g in self.groups)}; "
                  f"page size {self.max_limit}; logs in {self.log_dir})")
        return self

    def _timeout(self, timeout: float | None) -> float:
        if timeout is not None:
            return float(timeout)
        return float(os.environ.get(ENV_VARS["timeout"]) or DEFAULT_START_TIMEOUT)

    def wait_ready(self, names: Iterable[str] | None = None, timeout: float = 60.0) -> None:
        """Wait until the API answers and the named processes' conductors (all by default)
        registered after they were spawned; raises IronicError (see IronicProcesses)."""
        self.processes.wait_ready(self.url, list(names or self.process_names), timeout)

    # ----------------------------------------------------------------- stop
    def stop_process(self, name: str, timeout: float = DEFAULT_STOP_TIMEOUT,
                     sig: int = signal.SIGTERM) -> bool:
        """Stop one process (``"ironic"``/``"api"``/``""`` or a group name or
        ``conductor-<group>``): ``sig`` to its process group, SIGKILL after ``timeout``.

        Use ``sig=signal.SIGKILL`` to simulate a crash. Returns False when it was not running.
        """
        return self.processes.stop(self.resolve(name), timeout, sig)

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT, quiet: bool = False) -> list[str]:
        """Stop every process recorded in the state dir, in parallel. Idempotent; returns
        the names stopped."""
        stopped = self.processes.stop_all(self.files.known_names(self.process_names), timeout)
        if stopped and not quiet:
            self._log(f"stopped {', '.join(stopped)}")
        elif not quiet:
            self._log("nothing running")
        return stopped

    # ----------------------------------------------------------------- restart
    def resolve(self, name: str) -> str:
        """Accept a process name, a conductor group, ``"api"`` or ``"main"``; return the
        process name. Raises IronicError for a name that is none of these."""
        if name in ("api", "main", "", MAIN_PROCESS):
            return MAIN_PROCESS
        if name in self.files.state.get("processes", {}) or name in self.process_names:
            return name
        if name in self.groups:
            return process_name(name)
        if self.pid_file(name).exists():
            return name
        raise IronicError(f"unknown Ironic process {name!r}; known: {self.process_names}")

    def start_process(self, name: str, timeout: float | None = None) -> int:
        """(Re)start one stopped process with the same config, ports and database; wait ready."""
        name = self.resolve(name)
        if not self.files.state.get("processes"):
            raise IronicError("the server was never started in this state dir")
        pid = self.processes.running(name)
        if pid:
            return pid
        pid = self.processes.spawn(name)
        self.wait_ready([name], self._timeout(timeout))
        return pid

    def restart(self, names: Iterable[str] | None = None, timeout: float | None = None,
                down_for: float = 0.0, sig: int = signal.SIGTERM) -> None:
        """Stop the given processes (default: all), stay down ``down_for`` seconds, start them
        again with the same database, ports and URL, and wait until they are ready."""
        names = [self.resolve(n) for n in (names if names is not None else self.process_names)]
        for name in names:
            self.stop_process(name, sig=sig)
        if down_for:
            time.sleep(down_for)
        for name in names:
            if not self.processes.running(name):
                self.processes.spawn(name)
        self.wait_ready(names, self._timeout(timeout))

    # ----------------------------------------------------------------- status
    def status(self) -> dict:
        """What runs, and whether the API answers (with the conductors it knows)."""
        state = dict(self.files.state) if self.files.state else {"url": self.url}
        processes = {}
        for name, pid in self.pids.items():
            info = dict(self.files.state.get("processes", {}).get(name, {}))
            info["pid"] = pid
            info["running"] = pid is not None
            processes[name] = info
        state["processes"] = processes
        try:
            http_get_json(f"{self.url}/v1", timeout=3)
            state["api"] = "up"
            state["conductors"] = [
                {k: c.get(k) for k in ("hostname", "conductor_group", "alive")}
                for c in list_conductors(self.url, timeout=3)]
        except (OSError, ValueError, urllib.error.URLError) as exc:
            state["api"] = f"down ({exc})"
        state["installed_version"] = self.installed_version()
        return state

    def log_tail(self, name: str, lines: int = 40) -> str:
        return tail_file(self.log_path(self.resolve(name)), lines)

    def __enter__(self) -> IronicServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop(quiet=True)

    def __repr__(self) -> str:
        return f"IronicServer(url={self.url!r}, groups={self.groups!r}, state_dir={self.state_dir})"
