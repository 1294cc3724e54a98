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
``tools/ironic_standalone.py``::

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

The nodes, one way for the tests, the demo and the benchmarks, through ironicclient
(imported when first needed): :func:`make_client`, :func:`create_nodes` (``fake-hardware``,
state ``enroll``, optional ``instance_uuid``/shard/owner), :func:`make_available` (manage +
provide), :func:`power_off` and :func:`make_buildable` (available with a power state, as an
allocation needs), :func:`list_allocations`, :func:`list_nodes` (a filtered listing that
stays filtered across pages), :func:`delete_nodes`, :func:`delete_all_nodes` and
:class:`NodeFactory`.

Process helpers the demo reuses: :func:`spawn` and :func:`terminate` (detached processes
with a log and a pid file), :func:`pip_install`, :func:`venv_lock` and :func:`run_streamed`
(virtualenvs).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import datetime
import errno
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid as uuidlib
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

# The checkout this package is installed from (editable, as tox and the demo do).
REPO_ROOT = Path(__file__).resolve().parents[2]
CLI = "tools/ironic_standalone.py"
DEFAULT_VENV = REPO_ROOT / ".ironic" / "venv"
DEFAULT_STATE_DIR = REPO_ROOT / ".ironic" / "state"
DEFAULT_PORT = 6385
DEFAULT_GROUPS = ("", "group-a")
DEFAULT_MAX_LIMIT = 1000
DEFAULT_PIP_SPEC = "ironic"
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_STOP_TIMEOUT = 20.0

# GET /v1/conductors needs 1.49; ``detail`` (for updated_at) needs it too.
CONDUCTORS_API_VERSION = "1.49"
MAIN_PROCESS = "ironic"
API_HOST = "127.0.0.1"
# Ironic appends ":<port>" to a conductor's hostname only when the JSON-RPC port is not
# the default 8089, and the readiness check relies on that suffix: never pick 8089.
_JSON_RPC_DEFAULT_PORT = 8089
_GROUP_RE = re.compile(r"^[a-z0-9_.-]*$")
_MARKER = ".ironic-standalone.json"

ENV_VARS = {
    "venv": "IRONIC_VENV",
    "state_dir": "IRONIC_STATE_DIR",
    "port": "IRONIC_PORT",
    "groups": "IRONIC_GROUPS",
    "max_limit": "IRONIC_MAX_LIMIT",
    "pip_spec": "IRONIC_PIP_SPEC",
    "python": "IRONIC_PYTHON",
    "timeout": "IRONIC_START_TIMEOUT",
    "database_url": "IRONIC_DATABASE_URL",
}


class IronicError(RuntimeError):
    """Installing, starting or stopping the standalone Ironic failed."""


def _print(msg: str) -> None:
    print(f"[ironic-standalone] {msg}", flush=True)


def parse_groups(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``",group-a,group-b"`` -> ``("", "group-a", "group-b")``; the default group always first."""
    if value is None:
        return DEFAULT_GROUPS
    items = value.split(",") if isinstance(value, str) else list(value)
    groups: list[str] = [""]
    for item in items:
        group = item.strip()
        if not _GROUP_RE.match(group):
            raise IronicError(
                f"invalid conductor group {group!r}: use lower-case letters, digits, '-', '_', '.' "
                "(Ironic refuses upper-case group names on node creation)")
        if group not in groups:
            groups.append(group)
    return tuple(groups)


def process_name(group: str) -> str:
    return MAIN_PROCESS if group == "" else f"conductor-{group}"


def free_port(host: str = API_HOST, avoid: Iterable[int] = ()) -> int:
    """A TCP port free on ``host`` right now (small race until the service binds it)."""
    avoid = set(avoid) | {_JSON_RPC_DEFAULT_PORT}
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port
    raise IronicError(f"could not find a free port on {host}")


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def http_get_json(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0):
    req = urllib.request.Request(url, headers={"Accept": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback only)
        return json.loads(resp.read().decode() or "null")


def list_conductors(url: str, timeout: float = 5.0) -> list[dict]:
    """``GET /v1/conductors?detail=True`` (hostname, conductor_group, alive, updated_at...)."""
    data = http_get_json(f"{url}/v1/conductors?detail=True",
                         {"X-OpenStack-Ironic-API-Version": CONDUCTORS_API_VERSION}, timeout)
    return data.get("conductors", [])


def _parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    parsed = datetime.datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed


# --------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group id) of a process, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # "pid (comm) S ppid pgrp ..." where comm may contain spaces and parentheses.
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0], int(fields[2])


def cmdline(pid: int) -> str:
    """The command line of a process ("" when it does not exist)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def pid_alive(pid: int | None) -> bool:
    """True for a running (not zombie) process."""
    if not pid:
        return False
    stat = _proc_stat(pid)
    if stat is None:
        if not Path("/proc/self/stat").exists():  # no procfs: fall back to kill(0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False
    return stat[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
        if stat and stat[1] == pgid and stat[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort only
        pass


def spawn(cmd: list[str], log_path: Path, pid_file: Path | None = None,
          env: dict[str, str] | None = None, cwd: str | None = None,
          die_with_parent: bool = False) -> subprocess.Popen:
    """Start ``cmd`` detached from the terminal (own session, stdin ``/dev/null``, so Ctrl-C
    reaches only its parent), its output appended to ``log_path`` after a ``=== <time>
    starting <cmd>`` line, its pid written to ``pid_file``.

    ``die_with_parent``: it gets SIGTERM when this process dies (Linux PR_SET_PDEATHSIG).
    Honoured from the main thread only: the kernel sends the signal when the *thread* that
    started the child exits.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tie = die_with_parent and threading.current_thread() is threading.main_thread()
    with open(log_path, "ab") as out:
        out.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {' '.join(cmd)}\n".encode())
        out.flush()
        popen = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
            env=env, start_new_session=True, preexec_fn=_set_pdeathsig if tie else None)
    if pid_file is not None:
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(f"{popen.pid}\n")
    return popen


def terminate(pid: int | None, timeout: float = DEFAULT_STOP_TIMEOUT) -> bool:
    """SIGTERM one process, SIGKILL when it still runs ``timeout`` s later; wait until it is
    gone (a zombie child counts as gone: reap it with ``Popen.wait``). False when it was not
    running."""
    if not pid_alive(pid):
        return False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pid_alive(pid):
            break
    return True


@contextlib.contextmanager
def venv_lock(venv: Path) -> Iterator[None]:
    """Serialise the installers of one virtualenv (a lock file beside it)."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def pip_install(venv: Path, args: list[str], log: Callable[[str], None],
                python: str = sys.executable, note: str = "", **popen_args) -> None:
    """``pip install args`` into ``venv``, created first when it has no Python; pip's progress
    lines (one a package, the summary, errors) go to ``log`` as ``"  pip: <line>"``."""
    if not (venv / "bin" / "python").exists():
        log(f"creating virtualenv {venv} (python: {python})")
        run_streamed([python, "-m", "venv", str(venv)], log)
    log(f"pip install {' '.join(args)} into {venv}{note}")
    run_streamed([str(venv / "bin" / "python"), "-m", "pip", "install",
                  "--disable-pip-version-check", "--progress-bar", "off", *args],
                 log, "  pip: ", _pip_progress_line, **popen_args)


def run_streamed(cmd: list[str], log: Callable[[str], None], prefix: str = "  ",
                 filter_fn: Callable[[str], bool] | None = None, **popen_args) -> None:
    """Run ``cmd``, passing the lines it prints that ``filter_fn`` keeps to ``log`` (after
    ``prefix``); :class:`IronicError` with its last 40 lines when it fails."""
    tail: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, **popen_args)
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-40:]
        if filter_fn is None or filter_fn(line):
            log(prefix + (line if len(line) <= 150 else line[:147] + "..."))
    if proc.wait() != 0:
        raise IronicError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
                          + "\n".join(tail))


# --------------------------------------------------------------------------- config


def render_config(values: dict[str, dict[str, object]]) -> str:
    lines: list[str] = []
    for section, options in values.items():
        lines.append(f"[{section}]")
        for key, value in options.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            lines.append(f"{key} = {value}")
        lines.append("")
    return "\n".join(lines)


# The interfaces enabled for fake-hardware (which then uses them by default): every action
# (power, manage, provide, deploy...) succeeds at once without a machine.
FAKE_INTERFACES = {
    "bios": "fake",
    "boot": "fake",
    "console": "fake",
    "deploy": "fake",
    "firmware": "fake",
    "inspect": "fake",
    "management": "fake",
    "network": "noop",
    "power": "fake",
    "raid": "fake",
    "rescue": "fake",
    "storage": "noop",
    "vendor": "fake",
}


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
        self.venv = Path(venv or env.get(ENV_VARS["venv"]) or DEFAULT_VENV).absolute()
        self.state_dir = Path(
            state_dir or env.get(ENV_VARS["state_dir"]) or DEFAULT_STATE_DIR).absolute()
        self.bin_dir = self.venv / "bin"
        # under state_dir: configs, pid files, process logs, the SQLite file, state.json
        self.etc_dir, self.run_dir, self.log_dir, self.db_path, self.state_file = (
            self.state_dir / name for name in ("etc", "run", "log", "ironic.sqlite", "state.json"))
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
        self._log = log or (lambda msg: None)
        self._popen: dict[str, subprocess.Popen] = {}
        self._spawned_at: dict[str, datetime.datetime] = {}
        self._log_offset: dict[str, int] = {}
        self._atexit_registered = False
        self._version: str | None = None
        self._state: dict = self._read_state() or {}

    # ----------------------------------------------------------------- paths and state
    def config_files(self, name: str) -> list[Path]:
        files = [self.etc_dir / "ironic.conf"]
        if name != MAIN_PROCESS:
            files.append(self.etc_dir / f"{name}.conf")
        return files

    def pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    @property
    def process_names(self) -> list[str]:
        return [process_name(g) for g in self.groups]

    @property
    def port(self) -> int | None:
        return self._state.get("port")

    @property
    def url(self) -> str:
        port = self.port or self.requested_port
        return f"http://{API_HOST}:{port}"

    @property
    def pids(self) -> dict[str, int | None]:
        """Process name -> pid of the live process (None when it is not running)."""
        result: dict[str, int | None] = {}
        for name in self._known_names():
            pid = self._read_pid(name)
            result[name] = pid if pid and self._is_ours(name, pid) else None
        return result

    def _known_names(self) -> list[str]:
        names = list(self.process_names)
        for name in self._state.get("processes", {}):
            if name not in names:
                names.append(name)
        if self.run_dir.is_dir():
            for pid_file in sorted(self.run_dir.glob("*.pid")):
                if pid_file.stem not in names:
                    names.append(pid_file.stem)
        return names

    def _read_state(self) -> dict | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def _write_state(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_file)

    def _read_pid(self, name: str) -> int | None:
        try:
            return int(self.pid_file(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _is_ours(self, name: str, pid: int) -> bool:
        """The pid runs one of our Ironic processes (guards against pid reuse)."""
        popen = self._popen.get(name)
        if popen is not None and popen.pid == pid:
            return popen.poll() is None
        if not pid_alive(pid):
            return False
        if not Path(f"/proc/{pid}").exists():
            return True  # no procfs to check against
        return str(self.etc_dir / "ironic.conf") in cmdline(pid)

    # ----------------------------------------------------------------- install
    def installed_version(self) -> str | None:
        """Ironic's version when the venv has working entry points, else None."""
        if self._version is not None:
            return self._version
        for script in ("ironic", "ironic-conductor", "ironic-dbsync"):
            if not os.access(self.bin_dir / script, os.X_OK):
                return None
        try:
            out = subprocess.run(
                [str(self.bin_dir / "ironic-dbsync"), "--version"], capture_output=True,
                text=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
        self._version = lines[0] if lines else "unknown"
        return self._version

    def _marker(self) -> dict:
        try:
            return json.loads((self.venv / _MARKER).read_text())
        except (OSError, ValueError):
            return {}

    def is_installed(self) -> bool:
        if self.installed_version() is None:
            return False
        spec = self._marker().get("pip_spec")
        return spec == self.pip_spec or (spec is None and self.pip_spec == DEFAULT_PIP_SPEC)

    def install(self, force: bool = False) -> bool:
        """Create the venv and ``pip install`` Ironic into it. Returns False when it was there.

        Safe to call concurrently (a file lock next to the venv serialises installers).
        """
        with venv_lock(self.venv):
            if not force and self.is_installed():
                self._log(f"Ironic {self.installed_version()} already installed in {self.venv}")
                return False
            started = time.monotonic()
            self._version = None
            pip_install(self.venv, [self.pip_spec], self._log, self.python,
                        " (about 40 s and 350 MB on first install)")
            self._version = None
            version = self.installed_version()
            if version is None:
                raise IronicError(
                    f"pip finished but {self.bin_dir}/ironic-dbsync --version does not work")
            (self.venv / _MARKER).write_text(json.dumps(
                {"pip_spec": self.pip_spec, "version": version,
                 "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
            self._log(f"installed Ironic {version} in {time.monotonic() - started:.1f} s")
            return True

    # ----------------------------------------------------------------- start
    def write_config(self) -> None:
        """Write ``etc/ironic.conf`` (shared) and one override file per extra conductor."""
        procs = self._state["processes"]
        main = procs[MAIN_PROCESS]
        enabled = {f"enabled_{iface}_interfaces": name for iface, name in FAKE_INTERFACES.items()}
        base = {
            "DEFAULT": {
                "host": main["host"],
                "auth_strategy": "noauth",
                "rpc_transport": "json-rpc",
                "enabled_hardware_types": "fake-hardware",
                **enabled,
                "debug": self.debug,
                "use_stderr": True,  # stderr goes to log/<name>.log
            },
            "api": {
                "host_ip": API_HOST,
                "port": self._state["port"],
                "max_limit": self.max_limit,
                # under noauth every request is a project-scoped admin: let nodes carry an
                # arbitrary owner
                "project_admin_can_manage_own_nodes": False,
            },
            "conductor": {"conductor_group": ""},
            # Several processes share one SQLite file: wait for its lock
            # (pysqlite's timeout, 5 s by default) instead of crashing.
            "database": {"connection": self.database_url
                         or f"sqlite:///{self.db_path}?timeout=60"},
            "json_rpc": {
                "auth_strategy": "noauth",
                "host_ip": main["host"],
                "port": main["rpc_port"],
            },
            # not needed by what the tests do, but keeps Ironic off Neutron and /var/lib
            "oslo_concurrency": {"lock_path": str(self.state_dir / "locks")},
            "dhcp": {"dhcp_provider": "none"},
        }
        self.etc_dir.mkdir(parents=True, exist_ok=True)
        (self.etc_dir / "ironic.conf").write_text(
            "# Generated by tools/ironic_standalone.py; rewritten on every start.\n"
            + render_config(base))
        for name, proc in procs.items():
            if name == MAIN_PROCESS:
                continue
            override = {
                "DEFAULT": {"host": proc["host"]},
                "conductor": {"conductor_group": proc["group"]},
                "json_rpc": {"host_ip": proc["host"], "port": proc["rpc_port"]},
            }
            (self.etc_dir / f"{name}.conf").write_text(
                f"# conductor group {proc['group']!r}; loaded after ironic.conf\n"
                + render_config(override))

    def _plan(self, keep_ports: bool) -> None:
        """Choose ports and loopback addresses, recorded in state.json."""
        old = self._state if keep_ports else {}
        old_procs = old.get("processes", {})
        port = self.requested_port
        if port == 0 and keep_ports and old.get("port"):
            port = old["port"]  # same URL as before when restarting with the same database
        if port == 0:
            port = free_port(API_HOST)
        elif port_in_use(API_HOST, port):
            raise IronicError(
                f"port {port} on {API_HOST} is already in use (another Ironic? "
                f"`{CLI} status`); choose another with --port, or --port 0")
        procs: dict[str, dict] = {}
        used = {port}
        for index, group in enumerate(self.groups):
            name = process_name(group)
            # every process gets its own loopback address, so [DEFAULT]host (node reservations,
            # logs) is distinct and resolvable for the JSON-RPC client
            host = f"127.0.0.{index + 1}"
            rpc_port = old_procs.get(name, {}).get("rpc_port")
            if not rpc_port or (rpc_port in used) or port_in_use(host, rpc_port):
                rpc_port = free_port(host, avoid=used)
            used.add(rpc_port)
            procs[name] = {"group": group, "host": host, "rpc_port": rpc_port,
                           "hostname": f"{host}:{rpc_port}",
                           "log": str(self.log_path(name)), "pid_file": str(self.pid_file(name))}
        self._state = {
            "url": f"http://{API_HOST}:{port}", "port": port, "groups": list(self.groups),
            "max_limit": self.max_limit, "venv": str(self.venv), "state_dir": str(self.state_dir),
            "processes": procs,
        }

    def _prepare_db(self, keep_db: bool) -> None:
        if self.database_url:
            # The caller's database: empty on a fresh start, else upgraded.
            self._install_mysql_driver()
            action = "upgrade" if keep_db else "create_schema"
        elif keep_db and self.db_path.exists():
            self._log(f"keeping database {self.db_path}; running ironic-dbsync upgrade")
            action = "upgrade"
        else:
            for suffix in ("", "-journal", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{self.db_path}{suffix}").unlink()
            action = "create_schema"
        cmd = [str(self.bin_dir / "ironic-dbsync"), "--config-file",
               str(self.etc_dir / "ironic.conf"), action]
        log = self.log_dir / "dbsync.log"
        with open(log, "a") as out:
            out.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
            out.flush()
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
        if rc != 0:
            raise IronicError(f"ironic-dbsync {action} failed ({rc}); last lines of {log}:\n"
                              + tail_file(log))

    def _install_mysql_driver(self) -> None:
        python = str(self.bin_dir / "python")
        with venv_lock(self.venv):
            if subprocess.run([python, "-c", "import pymysql"],
                              capture_output=True).returncode:
                pip_install(self.venv, ["pymysql"], self._log, self.python)

    def start(self, keep_db: bool = False, timeout: float | None = None,
              install: bool = True) -> IronicServer:
        """Start all processes and wait until every conductor group is served.

        A fresh start wipes the SQLite database unless ``keep_db``; it first stops whatever an
        earlier run left behind in the same state directory.
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
        self._plan(keep_ports=keep_db)
        self.write_config()
        self._write_state()
        self._prepare_db(keep_db)
        try:
            # One process at a time: each writes its conductor registration
            # to the shared SQLite file at start, and three at once were
            # seen to crash on "database is locked".
            for name in self.process_names:
                self._spawn(name)
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

    def _spawn(self, name: str) -> int:
        proc = self._state["processes"][name]
        exe = "ironic" if name == MAIN_PROCESS else "ironic-conductor"
        cmd = [str(self.bin_dir / exe)]
        for conf in self.config_files(name):
            cmd += ["--config-file", str(conf)]
        log_path = Path(proc["log"])
        self._log_offset[name] = log_path.stat().st_size if log_path.exists() else 0
        env = dict(os.environ)
        for var in ("PYTHONPATH", "VIRTUAL_ENV"):  # keep the project's venv out of Ironic's
            env.pop(var, None)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._spawned_at[name] = datetime.datetime.now(datetime.timezone.utc)
        popen = spawn(cmd, log_path, self.pid_file(name), env=env, cwd=str(self.state_dir),
                      die_with_parent=self.die_with_parent)
        self._popen[name] = popen
        if self.die_with_parent and not self._atexit_registered:
            atexit.register(self._atexit_stop)
            self._atexit_registered = True
        self._log(f"started {name} (group {proc['group']!r}, pid {popen.pid}, "
                  f"json-rpc {proc['hostname']}); log {log_path}")
        return popen.pid

    def _atexit_stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(quiet=True)

    def wait_ready(self, names: Iterable[str] | None = None, timeout: float = 60.0) -> None:
        """Wait until the API answers at /v1 and each named process' conductor is registered,
        alive, and registered after that process was spawned (a stale row does not count)."""
        names = list(names or self.process_names)
        started = time.monotonic()
        deadline = started + max(timeout, 5.0)
        pending = set(names)
        last_error = "no answer yet"
        while True:
            for name in names:
                if not self._is_ours(name, self._read_pid(name) or 0):
                    raise IronicError(self._failure(
                        name, f"process {name} exited{self._exit_code(name)} during start"))
                if name in pending and self._crashed(name):
                    raise IronicError(self._failure(
                        name, f"{name}'s service crashed during start (its launcher would "
                              "re-fork it forever)"))
            try:
                http_get_json(f"{self.url}/v1", timeout=3)
                conductors = {c["hostname"]: c for c in list_conductors(self.url, timeout=3)}
                for name in list(pending):
                    proc = self._state["processes"][name]
                    row = conductors.get(proc["hostname"])
                    if not row or not row.get("alive"):
                        continue
                    if row.get("conductor_group", "") != proc["group"]:
                        continue
                    registered = _parse_time(row.get("updated_at")) or _parse_time(
                        row.get("created_at"))
                    spawned = self._spawned_at.get(name)
                    if spawned and registered and registered <= spawned:
                        continue  # a row left by an earlier (killed) process: same clock
                    pending.discard(name)
                if not pending:
                    return
                last_error = f"waiting for conductors: {', '.join(sorted(pending))}"
            except (OSError, ValueError, urllib.error.URLError) as exc:
                last_error = f"API {self.url}/v1 not answering: {exc}"
            if time.monotonic() > deadline:
                if last_error.startswith("API") or not pending:
                    blame = MAIN_PROCESS
                else:
                    blame = sorted(pending)[0]
                raise IronicError(self._failure(
                    blame, f"Ironic not ready after waiting {time.monotonic() - started:.0f} s "
                           f"({last_error}); raise the limit with --timeout or "
                           f"${ENV_VARS['timeout']}"))
            time.sleep(0.25)

    _CRASH_RE = re.compile(rb"Child \d+ exited with status [1-9]| CRITICAL ")

    def _crashed(self, name: str) -> bool:
        """The service worker died (the master process survives and re-forks it)."""
        try:
            with open(self.log_path(name), "rb") as f:
                f.seek(self._log_offset.get(name, 0))
                return bool(self._CRASH_RE.search(f.read(4 * 1024 * 1024)))
        except OSError:
            return False

    def _exit_code(self, name: str) -> str:
        popen = self._popen.get(name)
        if popen is not None and popen.poll() is not None:
            return f" with code {popen.returncode}"
        return ""

    def _failure(self, name: str, message: str) -> str:
        log = self.log_path(name)
        return (f"{message}\n--- last lines of {log} ---\n"
                f"{tail_file(log, offset=self._log_offset.get(name, 0))}")

    # ----------------------------------------------------------------- stop
    def stop_process(self, name: str, timeout: float = DEFAULT_STOP_TIMEOUT,
                     sig: int = signal.SIGTERM) -> bool:
        """Stop one process (``"ironic"``/``"api"``/``""`` or a group name or
        ``conductor-<group>``): ``sig`` to its process group, SIGKILL after ``timeout``.

        Use ``sig=signal.SIGKILL`` to simulate a crash. Returns False when it was not running.
        """
        name = self.resolve(name)
        pid = self._read_pid(name)
        stopped = False
        if pid and self._signal_group(name, pid, sig):
            stopped = True
            deadline = time.monotonic() + timeout
            while self._group_alive(name, pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._group_alive(name, pid):
                self._log(f"{name} (pid {pid}) did not stop within {timeout:.0f} s: SIGKILL")
                self._signal_group(name, pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while self._group_alive(name, pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
        popen = self._popen.pop(name, None)
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file(name).unlink()
        return stopped

    def _group_alive(self, name: str, pgid: int) -> bool:
        popen = self._popen.get(name)
        if popen is not None and popen.pid == pgid:
            popen.poll()  # reap the leader if it is our child
        if Path("/proc/self/stat").exists():
            return bool(group_members(pgid))
        return pid_alive(pgid)

    def _signal_group(self, name: str, pgid: int, sig: int) -> bool:
        leader_ours = self._is_ours(name, pgid)
        if not leader_ours:
            # the leader is gone; orphaned workers keep the group id (and so it cannot be
            # reused); only signal them when they look like Ironic
            members = group_members(pgid) if Path("/proc/self/stat").exists() else []
            if not members or not all("ironic" in cmdline(p) for p in members):
                return False
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        return True

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT, quiet: bool = False) -> list[str]:
        """Stop every process recorded in the state dir. Idempotent; returns the names stopped.

        All processes are stopped in parallel (each takes ~2 s to shut down gracefully).
        """
        names = self._known_names()
        stopped: list[str] = []
        lock = threading.Lock()

        def _stop(name: str) -> None:
            if self.stop_process(name, timeout=timeout):
                with lock:
                    stopped.append(name)

        threads = [threading.Thread(target=_stop, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if stopped and not quiet:
            self._log(f"stopped {', '.join(stopped)}")
        elif not quiet:
            self._log("nothing running")
        return stopped

    # ----------------------------------------------------------------- restart
    def resolve(self, name: str) -> str:
        """Accept a process name, a conductor group, ``"api"`` or ``"main"``."""
        if name in ("api", "main", "", MAIN_PROCESS):
            return MAIN_PROCESS
        if name in self._state.get("processes", {}) or name in self.process_names:
            return name
        if name in self.groups:
            return process_name(name)
        if self.pid_file(name).exists():
            return name
        raise IronicError(f"unknown Ironic process {name!r}; known: {self.process_names}")

    def start_process(self, name: str, timeout: float | None = None) -> int:
        """(Re)start one stopped process with the same config, ports and database; wait ready."""
        name = self.resolve(name)
        if not self._state.get("processes"):
            raise IronicError("the server was never started in this state dir")
        pid = self._read_pid(name)
        if pid and self._is_ours(name, pid):
            return pid
        pid = self._spawn(name)
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
            pid = self._read_pid(name)
            if not (pid and self._is_ours(name, pid)):
                self._spawn(name)
        self.wait_ready(names, self._timeout(timeout))

    # ----------------------------------------------------------------- status
    def status(self) -> dict:
        """What runs, and whether the API answers (with the conductors it knows)."""
        state = dict(self._state) if self._state else {"url": self.url}
        processes = {}
        for name, pid in self.pids.items():
            info = dict(self._state.get("processes", {}).get(name, {}))
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


def tail_file(path: Path, lines: int = 40, offset: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(offset if offset <= size else 0, size - 64 * 1024)
            f.seek(start)
            data = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {os.strerror(exc.errno or errno.EIO)})"
    return "\n".join(data.splitlines()[-lines:]) or "(empty)"


def _pip_progress_line(line: str) -> bool:
    """Keep pip's output readable: one line per package plus the summary and any error."""
    return (line.startswith(("Collecting ", "Installing ", "Successfully ", "ERROR", "error"))
            or "Building wheel" in line)


# --------------------------------------------------------------------------- nodes


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
    """Every allocation (uuid, name, node_uuid, state, last_error) as plain dicts."""
    return [a.to_dict() for a in client.allocation.list(
        limit=0, fields=["uuid", "name", "node_uuid", "state", "last_error"])]


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


# --------------------------------------------------------------------------- CLI


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--venv", default=os.environ.get(ENV_VARS["venv"]) or str(DEFAULT_VENV),
                        help="Ironic's own virtualenv [$IRONIC_VENV, default %(default)s]")
    common.add_argument("--state-dir",
                        default=os.environ.get(ENV_VARS["state_dir"]) or str(DEFAULT_STATE_DIR),
                        help="config, SQLite DB, logs, pid files "
                             "[$IRONIC_STATE_DIR, default %(default)s]")
    common.add_argument("--pip-spec",
                        default=os.environ.get(ENV_VARS["pip_spec"]) or DEFAULT_PIP_SPEC,
                        help="what to pip install, e.g. 'ironic==39.0.0' "
                             "[$IRONIC_PIP_SPEC, default %(default)s]")
    common.add_argument("--python", default=os.environ.get(ENV_VARS["python"]) or sys.executable,
                        help="interpreter for the venv [$IRONIC_PYTHON, default %(default)s]")
    common.add_argument("--port", type=int, default=_env_int(ENV_VARS["port"], DEFAULT_PORT),
                        help="API port on 127.0.0.1, 0 = pick a free one "
                             "[$IRONIC_PORT, default %(default)s]")
    common.add_argument("--groups", default=os.environ.get(ENV_VARS["groups"]),
                        help="conductor groups, comma separated, '' = default group "
                             "[$IRONIC_GROUPS, default ',group-a']")
    common.add_argument("--max-limit", type=int,
                        default=_env_int(ENV_VARS["max_limit"], DEFAULT_MAX_LIMIT),
                        help="[api]max_limit, the page size "
                             "[$IRONIC_MAX_LIMIT, default %(default)s]")

    parser = argparse.ArgumentParser(
        description="Run a standalone Ironic (SQLite, noauth, fake-hardware) for tests/demos.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("install", parents=[common], help="create the venv and pip install ironic")
    p.add_argument("--force", action="store_true", help="pip install even when present")
    p = sub.add_parser("start", parents=[common],
                       help="(re)start Ironic, wait until every conductor group is served")
    p.add_argument("--keep-db", action="store_true",
                   help="keep the SQLite database (and ports) of the previous run")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for readiness [$IRONIC_START_TIMEOUT, default 120]")
    p.add_argument("--debug", action="store_true", help="[DEFAULT]debug = true")
    p.add_argument("--no-install", action="store_true", help="fail instead of installing")
    p = sub.add_parser("stop", parents=[common], help="stop the processes (idempotent)")
    p.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT,
                   help="seconds between SIGTERM and SIGKILL [default %(default)s]")
    p = sub.add_parser("status", parents=[common], help="show processes and API health")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    server = None
    try:
        server = IronicServer(
            venv=args.venv, state_dir=args.state_dir, port=args.port, groups=args.groups,
            max_limit=args.max_limit, pip_spec=args.pip_spec, python=args.python,
            debug=getattr(args, "debug", False))
        if args.command == "install":
            server.install(force=args.force)
        elif args.command == "start":
            server.start(keep_db=args.keep_db, timeout=args.timeout, install=not args.no_install)
            print(f"IRONIC_URL={server.url}")
        elif args.command == "stop":
            server.stop(timeout=args.timeout)
        elif args.command == "status":
            status = server.status()
            if args.json:
                print(json.dumps(status, indent=2, sort_keys=True))
            else:
                _print_status(status)
            running = any(p["running"] for p in status["processes"].values())
            return 0 if running and status["api"] == "up" else 3
    except IronicError as exc:
        print(f"ironic-standalone: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if server is not None and args.command == "start":
            server.stop(quiet=True)
        return 130
    return 0


def _print_status(status: dict) -> None:
    print(f"url:       {status.get('url')}")
    print(f"api:       {status.get('api')}")
    print(f"installed: {status.get('installed_version') or 'no'}")
    for name, proc in status["processes"].items():
        state = f"running, pid {proc['pid']}" if proc["running"] else "stopped"
        print(f"  {name:<24} group={proc.get('group', '?')!r:<12} "
              f"rpc={proc.get('hostname', '?'):<22} {state}")
    for cond in status.get("conductors", []):
        print(f"  conductor {cond['hostname']:<22} group={cond['conductor_group']!r:<12} "
              f"alive={cond['alive']}")


if __name__ == "__main__":
    sys.exit(main())
