#!/usr/bin/env python3
"""The quickstart demo: three ironic-compute services share the nodes of a real Ironic.

    python3 tools/demo.py            # the whole demo: ~35 s (~2 min more the first time)
    python3 tools/demo.py --keep     # leave everything running afterwards, to look around
    python3 tools/demo.py --stop     # stop what a --keep run left running

Only Python 3.11+ (with its ``venv`` module) and access to PyPI are needed; the script is
stdlib only. What it does:

1. a virtualenv for the project, ``<repo>/.demo/venv`` (``pip install -e <repo>``; reused
   on the next run), then it runs itself again with that virtualenv's Python;
2. a real standalone Ironic (``tools/ironic_standalone.py``: its own virtualenv
   ``<repo>/.ironic/venv``, SQLite, no Keystone, fake hardware) with conductor groups
   ``group-a`` and ``group-b``;
3. ``--nodes`` fake nodes in each of the two groups, created through Ironic's API;
4. three ``ironic-compute`` services (``compute-1..3``) on one SQLite database, without a
   partition key, so they share every node; prints how the nodes are divided (services are
   started one at a time: several on one SQLite file can collide when they register);
5. ``kill -9`` of one service: prints every second who owns how many nodes, until the
   survivors have taken all of its nodes;
6. restarts it: prints the rebalance until it owns its share again;
7. makes a few nodes buildable, asks for ``--instances`` instances at once without a host
   (``ironic-compute-manage instance create``: the scheduler spreads them), waits until
   they are active, then ``kill -9`` of a service that has some: prints every second until
   the live services have taken its instances over (``instance_takeover_grace`` 8 s);

then a summary, and it stops everything it started (also on Ctrl-C or an error).

Configuration files, the services' SQLite database, logs and pid files live in the state
directory (``<repo>/.demo/state``): ``compute-N.conf``, ``logs/compute-N.log``,
``ironic/log/*.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if sys.version_info < (3, 11):  # noqa: UP036 - a clear message on an older python3
    sys.exit(f"demo: error: needs Python 3.11 or later, this is {sys.version.split()[0]}: "
             "run it with python3.11 (or newer) tools/demo.py")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = REPO_ROOT / ".demo"
DEFAULT_VENV = DEMO_DIR / "venv"
DEFAULT_STATE_DIR = DEMO_DIR / "state"

HOSTS = ("compute-1", "compute-2", "compute-3")
GROUPS = ("group-a", "group-b")
DEFAULT_NODES = 20
# Short intervals, so that a failover takes seconds (the defaults are 10, 60 and 60 s).
REPORT_INTERVAL = 1
SERVICE_DOWN_TIME = 6
CYCLE = 2
# One page holds every node (Ironic's listing paginates at [api]max_limit).
PAGE_SIZE = 1000
MAX_NODES = 500
IRONIC_API_VERSION = "1.82"
NODE_PROPERTIES = {"cpus": 16, "memory_mb": 65536, "local_gb": 480, "cpu_arch": "x86_64"}

SETTLE_TIMEOUT = 90.0
FAILOVER_TIMEOUT = SERVICE_DOWN_TIME + 10 * CYCLE + 30.0
# A dead service's instances move once it is silent for longer than this (and than
# service_down_time): longer than service_down_time, so its free nodes visibly move first.
TAKEOVER_GRACE = 8
DEFAULT_INSTANCES = 6
MAX_INSTANCES = 30
BUILD_TIMEOUT = 120.0
TAKEOVER_TIMEOUT = TAKEOVER_GRACE + 10 * CYCLE + 30.0
REBALANCE_TIMEOUT = 60.0
# The division is final when it did not change for this long (two cycles and a bit).
STABLE_FOR = 2 * CYCLE + 1.0
SERVICE_STOP_TIMEOUT = 15.0
VENV_MARKER = ".ironic-compute-demo.json"
PROG = "demo"


class DemoError(Exception):
    """A step failed: reported as one line (plus a log tail when there is one)."""


# --------------------------------------------------------------------------- output


class Console:
    """Lines for the newcomer; one status line that rewrites itself on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.lock = threading.RLock()
        self.last_output = time.monotonic()
        self._status_shown = False
        self._last_status_print = 0.0

    def _clear_status(self) -> None:
        if self._status_shown:
            sys.stdout.write("\r\x1b[K")
            self._status_shown = False

    def line(self, text: str = "") -> None:
        with self.lock:
            self._clear_status()
            print(text, flush=True)
            self.last_output = time.monotonic()

    def step(self, number: int, total: int, title: str) -> None:
        self.line()
        self.line(f"[{number}/{total}] {title}")

    def status(self, text: str, every: float = 10.0) -> None:
        """A progress line: rewritten in place on a terminal, else printed every ``every`` s."""
        with self.lock:
            if self.tty:
                width = 120
                with contextlib.suppress(OSError):
                    width = os.get_terminal_size().columns - 1
                sys.stdout.write("\r\x1b[K" + text[:width])
                sys.stdout.flush()
                self._status_shown = True
                self.last_output = time.monotonic()
            elif time.monotonic() - max(self._last_status_print, self.last_output) >= every:
                self._last_status_print = time.monotonic()
                self.line(text)

    def end_status(self) -> None:
        with self.lock:
            self._clear_status()
            sys.stdout.flush()

    @contextlib.contextmanager
    def busy(self, label: str) -> Iterator[None]:
        """Show that something is happening while a step prints nothing."""
        started = time.monotonic()
        done = threading.Event()

        def tick() -> None:
            while not done.wait(1.0):
                elapsed = time.monotonic() - started
                if self.tty:
                    if time.monotonic() - self.last_output >= 1.5 or self._status_shown:
                        self.status(f"  ... {label} ({elapsed:.0f} s)")
                elif time.monotonic() - self.last_output >= 10.0:
                    self.line(f"  ... {label} ({elapsed:.0f} s)")

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.end_status()


OUT = Console()


def rel(path: os.PathLike | str) -> str:
    """A path as short as it can be shown: relative to the current directory when inside."""
    path = Path(path)
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd())) or "."
    return str(path)


class PipProgress:
    """Turns pip's output into a few progress lines (the last lines are kept for errors)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.started = time.monotonic()
        self.collected = 0
        self.tail: list[str] = []

    def feed(self, line: str) -> None:
        line = line.rstrip()
        self.tail = (self.tail + [line])[-40:]
        elapsed = time.monotonic() - self.started
        if line.startswith("Collecting "):
            self.collected += 1
            name = line.split()[1]
            OUT.status(f"  pip: {self.what}: {self.collected} packages collected, "
                       f"now {name} ({elapsed:.0f} s)")
        elif line.startswith("Installing collected packages"):
            OUT.line(f"  pip: {self.what}: {self.collected} packages downloaded in "
                     f"{elapsed:.0f} s; installing them")
        elif line.startswith("Successfully installed"):
            count = "" if line.endswith("...") else f"{len(line.split()) - 2} packages "
            OUT.line(f"  pip: {self.what}: installed {count}in {elapsed:.0f} s")
        elif line.startswith(("ERROR", "error:")):
            OUT.line(f"  pip: {line}")


# --------------------------------------------------------------------------- helpers


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def pid_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2:][:1] not in ("Z", "X")


def set_pdeathsig() -> None:  # between fork and exec: SIGTERM when the demo dies
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


# --------------------------------------------------------------------------- project venv


def _install_fingerprint() -> str:
    digest = hashlib.sha256(str(REPO_ROOT).encode())
    for name in ("requirements.txt", "setup.cfg", "pyproject.toml", "setup.py"):
        with contextlib.suppress(OSError):
            digest.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes())
    return digest.hexdigest()


def _project_importable(python: Path) -> bool:
    try:
        result = subprocess.run(
            [str(python), "-c", "import ironic_compute.cmd.compute, ironicclient, sqlalchemy"],
            capture_output=True, timeout=120, cwd="/")
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def ensure_project_venv(venv: Path) -> Path:
    """``venv`` with the project installed (editable); created or updated when needed."""
    python = venv / "bin" / "python"
    marker = venv / VENV_MARKER
    fingerprint = _install_fingerprint()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            recorded = json.loads(marker.read_text()).get("fingerprint")
        except (OSError, ValueError):
            recorded = None
        if recorded == fingerprint and _project_importable(python):
            OUT.line(f"  reusing {rel(venv)} (delete it to start afresh)")
            return python
        started = time.monotonic()
        if not _pip_works(python):
            OUT.line(f"  creating virtualenv {rel(venv)} with {sys.executable} "
                     f"(Python {sys.version.split()[0]})")
            result = subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)],
                                    capture_output=True, text=True)
            if result.returncode != 0 or not _pip_works(python):
                detail = (result.stderr or result.stdout).strip().splitlines()
                raise DemoError(
                    f"`{sys.executable} -m venv` failed ({detail[-1] if detail else 'no pip'}); "
                    "on Debian/Ubuntu install the python3-venv package first "
                    "(apt-get install python3-venv)")
        OUT.line(f"  pip install -e {rel(REPO_ROOT)} into {rel(venv)} "
                 "(1-2 minutes and ~300 MB the first time)")
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.pop("PYTHONPATH", None)
        if not (REPO_ROOT / ".git").exists() and "PBR_VERSION" not in env:
            env["PBR_VERSION"] = "0.0.0"  # pbr takes the version from git otherwise
        progress = PipProgress("ironic-compute")
        cmd = [str(python), "-m", "pip", "install", "--progress-bar", "off", "-e", str(REPO_ROOT)]
        with OUT.busy("pip install"):
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1, env=env, cwd=str(REPO_ROOT))
            assert proc.stdout is not None
            for line in proc.stdout:
                progress.feed(line)
            rc = proc.wait()
        if rc != 0:
            raise DemoError(f"pip install failed (exit {rc}); its last lines:\n"
                            + "\n".join(progress.tail))
        if not _project_importable(python):
            raise DemoError(f"pip install finished but {python} cannot import ironic_compute")
        marker.write_text(json.dumps({"fingerprint": fingerprint, "repo": str(REPO_ROOT),
                                      "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
        OUT.line(f"  project virtualenv ready in {time.monotonic() - started:.0f} s")
        return python


def _pip_works(python: Path) -> bool:
    try:
        return subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


# --------------------------------------------------------------------------- the services


def _render(options: dict[str, dict[str, object]]) -> str:
    return "".join(f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items()) + "\n"
                   for section, values in options.items())


def _tool(name: str) -> list[str]:
    """The console script next to this interpreter, or ``python -m`` its module."""
    script = Path(sys.executable).parent / name
    if os.access(script, os.X_OK):
        return [str(script)]
    module = {"ironic-compute": "ironic_compute.cmd.compute",
              "ironic-compute-manage": "ironic_compute.cmd.manage"}[name]
    return [sys.executable, "-m", module]


class Service:
    """One ironic-compute process: its config file, log file and pid file."""

    def __init__(self, host: str, state_dir: Path) -> None:
        self.host = host
        self.config = state_dir / f"{host}.conf"
        self.log = state_dir / "logs" / f"{host}.log"
        self.pid_file = state_dir / "run" / f"{host}.pid"
        self.process: subprocess.Popen | None = None
        self.expected_up = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, tie_to_parent: bool) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = _tool("ironic-compute") + ["--config-file", str(self.config)]
        with open(self.log, "ab") as log:
            log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n".encode())
            log.flush()
            env = dict(os.environ, XDG_CACHE_HOME=str(self.config.parent / "cache"))
            self.process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # Ctrl-C reaches the demo only; it stops the services
                preexec_fn=set_pdeathsig if tie_to_parent else None)
        self.pid_file.write_text(f"{self.process.pid}\n")
        self.expected_up = True

    def check(self) -> None:
        """Fail with the end of the log when the service exited on its own."""
        if self.expected_up and self.process is not None and self.process.poll() is not None:
            self.expected_up = False
            raise DemoError(f"{self.host} exited with code {self.process.returncode}; "
                            f"last lines of {rel(self.log)}:\n{tail(self.log)}")

    def kill(self) -> None:
        self.expected_up = False
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> bool:
        """SIGTERM (the service finishes its cycle and marks itself stopped), then SIGKILL."""
        self.expected_up = False
        stopped = False
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(SERVICE_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            stopped = True
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        return stopped


def stop_leftover_services(state_dir: Path) -> list[str]:
    """Stop the services an earlier run (``--keep``, or a killed demo) left running."""
    stopped = []
    run_dir = state_dir / "run"
    for pid_file in sorted(run_dir.glob("compute-*.pid")) if run_dir.is_dir() else []:
        config = str(state_dir / f"{pid_file.stem}.conf")
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = 0
        if pid and pid_running(pid) and config in cmdline(pid):  # not a reused pid
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + SERVICE_STOP_TIMEOUT
            while pid_running(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_running(pid):
                os.kill(pid, signal.SIGKILL)
            stopped.append(pid_file.stem)
        pid_file.unlink(missing_ok=True)
    return stopped


def service_options(host: str, state_dir: Path, db: Path, ironic_url: str,
                    debug: bool) -> dict[str, dict[str, object]]:
    return {
        "DEFAULT": {
            "host": host,
            "state_path": state_dir,
            "report_interval": REPORT_INTERVAL,
            "service_down_time": SERVICE_DOWN_TIME,
            "update_resources_interval": CYCLE,
            "instance_takeover_grace": TAKEOVER_GRACE,
            "instance_poll_interval": 0.5,
            "graceful_shutdown_timeout": 10,
            "debug": "true" if debug else "false",
        },
        # The embedded default is sqlite:///$state_path/ironic_compute.sqlite; spelled out
        # here because all three services must use the same file.
        "database": {"connection": f"sqlite:///{db}"},
        # A standalone Ironic: no Keystone. No partition_key: the services share every node.
        "ironic": {"auth_type": "none", "endpoint_override": ironic_url},
    }


# --------------------------------------------------------------------------- the database


Ownership = dict[str, tuple[str | None, str]]  # node uuid -> (host, conductor group)


def read_ownership(db: Path) -> Ownership | None:
    """The live compute_nodes rows; None when the database is busy (try again)."""
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=2)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute("SELECT uuid, host, conductor_group FROM compute_nodes "
                            "WHERE deleted = 0").fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return {uuid: (host, group or "") for uuid, host, group in rows}


def heartbeat_ages(db: Path) -> dict[str, float]:
    """Seconds since each service's last heartbeat (its clock is ours: same machine)."""
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=2)
        try:
            rows = conn.execute("SELECT host, last_seen_up FROM services "
                                "WHERE deleted = 0").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return {}
    now = utcnow()
    ages = {}
    for host, seen in rows:
        if seen:
            with contextlib.suppress(ValueError):
                ages[host] = (now - datetime.datetime.fromisoformat(str(seen))).total_seconds()
    return ages


def registered_since(db: Path, host: str, since: datetime.datetime) -> bool:
    """The service has (re)registered at or after ``since`` (UTC): it heartbeats."""
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=2)
        try:
            row = conn.execute("SELECT last_seen_up FROM services WHERE host = ? AND "
                               "deleted = 0", (host,)).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    if not row or not row[0]:
        return False
    try:
        return datetime.datetime.fromisoformat(str(row[0])) >= since
    except ValueError:
        return False


def node_free(db: Path, uuid: str) -> bool:
    """The node's row says it is available (the scheduler's view)."""
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=2)
        try:
            row = conn.execute("SELECT stats FROM compute_nodes WHERE uuid = ? AND "
                               "deleted = 0", (uuid,)).fetchone()
        finally:
            conn.close()
        return bool(row and json.loads(row[0] or "{}").get("available"))
    except (sqlite3.Error, ValueError):
        return False


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


def plural(count: int, word: str = "node") -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def counts(ownership: Ownership) -> dict[str | None, int]:
    result: dict[str | None, int] = {host: 0 for host in HOSTS}
    for host, _group in ownership.values():
        result[host] = result.get(host, 0) + 1
    return result


def count_line(elapsed: float, ownership: Ownership, total: int, note: str = "") -> str:
    per_host = counts(ownership)
    parts = [f"{host} {per_host.get(host, 0):>3}" for host in HOSTS]
    unowned = total - sum(per_host.get(h, 0) for h in HOSTS)
    if unowned:
        parts.append(f"no owner {unowned:>3}")
    return f"  {elapsed:5.1f} s   " + "   ".join(parts) + (f"   {note}" if note else "")


def division_table(ownership: Ownership) -> list[str]:
    """Nodes per service (rows) and conductor group (columns)."""
    table: dict[str, dict[str, int]] = {host: {g: 0 for g in GROUPS} for host in HOSTS}
    for host, group in ownership.values():
        table.setdefault(host or "(no owner)", {g: 0 for g in GROUPS})
        table[host or "(no owner)"][group] = table[host or "(no owner)"].get(group, 0) + 1
    columns = list(GROUPS) + sorted({g for row in table.values() for g in row} - set(GROUPS))
    width = max(len(h) for h in [*table, "service", "total"])
    lines = ["    " + "service".ljust(width) + "".join(f"{c or '(none)':>10}" for c in columns)
             + f"{'total':>8}"]
    for host, row in table.items():
        lines.append("    " + host.ljust(width) + "".join(f"{row.get(c, 0):>10}" for c in columns)
                     + f"{sum(row.values()):>8}")
    totals = [sum(row.get(c, 0) for row in table.values()) for c in columns]
    lines.append("    " + "total".ljust(width) + "".join(f"{t:>10}" for t in totals)
                 + f"{sum(totals):>8}")
    return lines


# --------------------------------------------------------------------------- Ironic nodes


def create_nodes(url: str, per_group: int) -> dict[str, list[str]]:
    """``per_group`` fake-hardware nodes in each group, through ``POST /v1/nodes``."""

    def post(group: str, index: int) -> str:
        body = {"driver": "fake-hardware", "conductor_group": group,
                "name": f"{group}-node-{index:03d}", "resource_class": "baremetal",
                "properties": NODE_PROPERTIES}
        request = urllib.request.Request(
            f"{url}/v1/nodes", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json",
                     "X-OpenStack-Ironic-API-Version": IRONIC_API_VERSION})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
                return json.loads(response.read())["uuid"]
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                detail = json.loads(json.loads(detail)["error_message"])["faultstring"]
            raise DemoError(f"Ironic refused to create node {body['name']}: "
                            f"HTTP {exc.code}: {detail}") from None
        except (OSError, urllib.error.URLError) as exc:
            raise DemoError(f"cannot create node {body['name']} at {url}: {exc}") from None

    jobs = [(g, i) for g in GROUPS for i in range(per_group)]
    done = 0
    uuids: dict[str, list[str]] = {g: [] for g in GROUPS}
    # Ironic on SQLite writes one node at a time (~30/s); two workers overlap the round trips.
    with ThreadPoolExecutor(max_workers=2) as pool:
        for (group, _i), uuid in zip(jobs, pool.map(lambda job: post(*job), jobs), strict=True):
            uuids[group].append(uuid)
            done += 1
            OUT.status(f"  created {done}/{len(jobs)} nodes", every=5.0)
    OUT.end_status()
    return uuids


# --------------------------------------------------------------------------- instances


def ironic_request(url: str, method: str, path: str, body: dict | None = None) -> dict:
    """One call to Ironic's API; DemoError with Ironic's message when it refuses."""
    request = urllib.request.Request(
        f"{url}{path}", data=None if body is None else json.dumps(body).encode(),
        method=method, headers={"Content-Type": "application/json",
                                "Accept": "application/json",
                                "X-OpenStack-Ironic-API-Version": IRONIC_API_VERSION})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            text = response.read()
    except urllib.error.HTTPError as exc:
        raise DemoError(f"Ironic refused {method} {path}: HTTP {exc.code}: "
                        f"{exc.read().decode(errors='replace')[:300]}") from None
    except (OSError, urllib.error.URLError) as exc:
        raise DemoError(f"cannot reach Ironic at {url}: {exc}") from None
    return json.loads(text) if text else {}


def make_buildable(url: str, uuids: list[str]) -> None:
    """enroll -> manageable -> available, then power off: Ironic allocates only nodes that
    are available and have a power state (a fresh fake node has none)."""
    steps = (("provision", "manage", "provision_state", "manageable"),
             ("provision", "provide", "provision_state", "available"),
             ("power", "power off", "power_state", "power off"))
    for kind, target, field, wanted in steps:
        for uuid in uuids:
            ironic_request(url, "PUT", f"/v1/nodes/{uuid}/states/{kind}", {"target": target})
        deadline = time.monotonic() + 60
        while True:
            nodes = ironic_request(url, "GET", f"/v1/nodes?fields=uuid,{field}")
            pending = [n for n in nodes["nodes"] if n["uuid"] in uuids and n[field] != wanted]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise DemoError(f"{len(pending)} node(s) not {wanted} after 60 s")
            time.sleep(0.2)


Instance = tuple[str, str | None, str | None, str, str | None]  # name host node state fault


def read_instances(db: Path) -> dict[str, Instance] | None:
    """The live instances, {uuid: (name, host, node uuid, vm_state, fault)}; None if busy."""
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=2)
        try:
            rows = conn.execute("SELECT uuid, name, host, node, vm_state, fault FROM instances "
                                "WHERE deleted = 0").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return {uuid: tuple(rest) for uuid, *rest in rows}


def instance_table(instances: dict[str, Instance], node_names: dict[str, str],
                   moved: Iterable[str] = (), victim: str = "") -> list[str]:
    """One line per instance; those in ``moved`` are marked as taken over from ``victim``."""
    lines = [f"    {'instance':<10}{'host':<12}{'node':<20}state"]
    marked = {instances[u][0] for u in moved if u in instances}
    for name, host, node, state, fault in sorted(instances.values()):
        note = f"   (taken over from {victim})" if name in marked else ""
        node = node_names.get(node, node) if node else "-"
        lines.append(f"    {name:<10}{host or '-':<12}{node:<20}{state}"
                     + (f": {fault}" if fault and state == "error" else "") + note)
    return lines


def instance_counts(instances: dict[str, Instance]) -> str:
    per_host = {host: 0 for host in HOSTS}
    for _name, host, _node, _state, _fault in instances.values():
        per_host[host] = per_host.get(host, 0) + 1
    return "   ".join(f"{host} {count}" for host, count in per_host.items())


# --------------------------------------------------------------------------- the demo


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state_dir: Path = args.state_dir
        self.db = self.state_dir / "ironic_compute.sqlite"
        self.services = {host: Service(host, self.state_dir) for host in HOSTS}
        self.total = 2 * args.nodes
        self.ironic = None
        self.summary: list[str] = []

    # ---------------------------------------------------------------- helpers
    def check_services(self) -> None:
        for service in self.services.values():
            service.check()

    def poll(self, until: Callable[[Ownership, float], bool], timeout: float,
             line: Callable[[Ownership, float], str] | None, what: str,
             every: float = 1.0, started: float | None = None) -> tuple[Ownership, float]:
        """Sample the database every 0.2 s until ``until(ownership, elapsed)``; print
        ``line(...)`` every ``every`` seconds (and at the end). Returns the last sample and
        the seconds since ``started`` (default: now)."""
        started = time.monotonic() if started is None else started
        next_print = 0.0
        last: Ownership = {}
        while True:
            self.check_services()
            elapsed = time.monotonic() - started
            sample = read_ownership(self.db)
            if sample is not None:
                last = sample
                if until(last, elapsed):
                    if line:
                        OUT.line(line(last, elapsed))
                    return last, elapsed
            if line and elapsed >= next_print:
                OUT.line(line(last, elapsed))
                while next_print <= elapsed:
                    next_print += every
            if elapsed > timeout:
                logs = ", ".join(rel(s.log) for s in self.services.values())
                raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}; "
                                f"see the logs: {logs}")
            time.sleep(0.2)

    def start_service(self, service: Service, tick: Callable[[], None] = lambda: None) -> None:
        """Start one service and wait until it has registered in the database.

        Several services on one SQLite file: a service whose registration meets another
        one's write fails at once with "database is locked" and exits; start it again.
        """
        for attempt in range(1, 4):
            since = utcnow()
            service.start(tie_to_parent=not self.args.keep)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if registered_since(self.db, service.host, since):
                    return
                if service.process.poll() is not None:
                    break
                tick()
                time.sleep(0.1)
            else:
                raise DemoError(f"{service.host} did not register within 60 s; last lines of "
                                f"{rel(service.log)}:\n{tail(service.log)}")
            if attempt < 3 and "database is locked" in tail(service.log, 3):
                OUT.line(f"  {service.host} exited at start: SQLite said \"database is locked\" "
                         "(another service was writing); starting it again")
                continue
            service.check()  # raises with the end of its log

    def manage(self, *args: str) -> str:
        cmd = _tool("ironic-compute-manage") + [
            "--config-file", str(self.services[HOSTS[0]].config), *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                env=dict(os.environ, XDG_CACHE_HOME=str(self.state_dir / "cache")))
        if result.returncode != 0:
            raise DemoError(f"`ironic-compute-manage {' '.join(args)}` failed: "
                            + (result.stderr.strip() or result.stdout.strip()))
        return result.stdout.strip()

    # ---------------------------------------------------------------- steps
    def start_ironic(self) -> None:
        import ironic_standalone as standalone  # beside this script: sys.path[0]

        def log(message: str) -> None:
            message = message.replace(str(Path.cwd()) + "/", "")
            if message.startswith("  pip: "):
                progress.feed(message[len("  pip: "):])
            else:
                OUT.line(f"  {message}")

        progress = PipProgress("ironic")
        self.ironic = standalone.IronicServer(
            venv=self.args.ironic_venv, state_dir=self.state_dir / "ironic", port=0,
            groups=",".join(GROUPS), max_limit=PAGE_SIZE, debug=self.args.debug,
            die_with_parent=not self.args.keep, log=log)
        label = "starting Ironic" if self.ironic.is_installed() else "installing Ironic"
        with OUT.busy(label):
            for attempt in (1, 2):
                try:
                    self.ironic.start()
                    return
                except standalone.IronicError as exc:
                    if attempt == 1 and "crashed during start" in str(exc):
                        OUT.line(f"  {str(exc).splitlines()[0]}: trying once more")
                        continue
                    raise DemoError(f"Ironic did not start: {exc}") from None

    def create_nodes(self) -> None:
        started = time.monotonic()
        with OUT.busy("creating nodes"):
            created = create_nodes(self.ironic.url, self.args.nodes)
        OUT.line(f"  created {sum(len(v) for v in created.values())} nodes in "
                 f"{time.monotonic() - started:.1f} s: "
                 + ", ".join(f"{len(v)} in {g}" for g, v in created.items())
                 + " (state enroll: no capacity to offer, but every node gets an owner)")

    def start_services(self) -> Ownership:
        for service in self.services.values():
            options = service_options(service.host, self.state_dir, self.db, self.ironic.url,
                                      self.args.debug)
            service.config.write_text(
                "# Written by tools/demo.py for one of its three services.\n" + _render(options))
        OUT.line(f"  config files {rel(self.state_dir)}/compute-{{1,2,3}}.conf "
                 f"(report_interval {REPORT_INTERVAL} s, service_down_time "
                 f"{SERVICE_DOWN_TIME} s, update_resources_interval {CYCLE} s)")
        OUT.line(f"  shared database {rel(self.db)}: {self.manage('db', 'sync')}")
        OUT.line(f"  starting them one after the other (logs in {rel(self.state_dir / 'logs')}/); "
                 "each takes its share of the nodes at its first cycle:")
        started = time.monotonic()
        state = {"last": None, "since": 0.0}

        def settled(ownership: Ownership, elapsed: float) -> bool:
            snapshot = {u: h for u, (h, _g) in ownership.items()}
            if snapshot != state["last"]:
                state["last"], state["since"] = snapshot, elapsed
                if ownership:
                    OUT.line(count_line(elapsed, ownership, self.total))
                return False
            # every node owned by one of the three; with few nodes one may hold none
            return (len(ownership) == self.total
                    and all(h in HOSTS for h, _g in ownership.values())
                    and elapsed - state["since"] >= STABLE_FOR)

        def show_changes() -> None:
            sample = read_ownership(self.db)
            if sample is not None:
                settled(sample, time.monotonic() - started)

        for service in self.services.values():
            self.start_service(service, tick=show_changes)
            OUT.line(f"  {time.monotonic() - started:5.1f} s   {service.host} started "
                     f"(pid {service.pid})")
        ownership, elapsed = self.poll(settled, SETTLE_TIMEOUT, None,
                                       "the three services to share the nodes", started=started)
        OUT.line(f"  settled ({len(ownership)} nodes, no change for {STABLE_FOR:.0f} s); "
                 "the division, nodes per service and conductor group:")
        OUT.line()
        for text in division_table(ownership):
            OUT.line(text)
        return ownership

    def failover(self, before: Ownership, victim: str) -> Ownership:
        mine = {u for u, (h, _g) in before.items() if h == victim}
        OUT.line(f"  {victim} holds {plural(len(mine))}. Its peers see it down once its last "
                 f"heartbeat is older than service_down_time ({SERVICE_DOWN_TIME} s), and take "
                 f"its nodes at their next cycle (every {CYCLE} s).")
        self.services[victim].kill()
        OUT.line(f"  kill -9 {victim} (pid {self.services[victim].pid}); every second, "
                 "the nodes each service holds:")

        def note(ownership: Ownership, elapsed: float) -> str:
            moved = sum(1 for u in mine if ownership.get(u, (None,))[0] not in (victim, None))
            age = heartbeat_ages(self.db).get(victim)
            seen = "" if age is None else (
                f"{victim} last heartbeat {age:4.1f} s ago"
                + (" -> down" if age > SERVICE_DOWN_TIME else ""))
            return f"{seen}   moved {moved}/{len(mine)}"

        def done(ownership: Ownership, _elapsed: float) -> bool:
            per_host = counts(ownership)
            return per_host.get(victim, 0) == 0 and len(ownership) == self.total and all(
                h in HOSTS for h, _g in ownership.values())

        after, elapsed = self.poll(
            done, FAILOVER_TIMEOUT,
            lambda o, e: count_line(e, o, self.total, note(o, e)),
            f"the survivors to take {victim}'s nodes")
        gained = {h: sum(1 for u in mine if after[u][0] == h) for h in HOSTS if h != victim}
        others_moved = sum(1 for u, (h, _g) in before.items()
                           if h != victim and after.get(u, (None,))[0] != h)
        OUT.line(f"  failover done {elapsed:.1f} s after the kill: {victim}'s {plural(len(mine))} "
                 "went to " + " and ".join(f"{h} ({n})" for h, n in gained.items())
                 + f"; nodes of the survivors that moved: {others_moved}")
        OUT.line()
        for text in division_table(after):
            OUT.line(text)
        self.summary.append(
            f"  failover   kill -9 {victim}: its {plural(len(mine))} were on the survivors "
            f"{elapsed:.1f} s later (service_down_time {SERVICE_DOWN_TIME} s + at most one "
            f"{CYCLE} s cycle); {others_moved} other node(s) moved")
        return after

    def rebalance(self, initial: Ownership, after_failover: Ownership, victim: str) -> None:
        service = self.services[victim]
        started = time.monotonic()
        self.start_service(service)
        OUT.line(f"  started {victim} again (pid {service.pid}); at its first cycle it takes "
                 "its share back from the others:")
        target = {u: h for u, (h, _g) in initial.items()}
        state = {"last": None, "since": 0.0}

        def done(ownership: Ownership, elapsed: float) -> bool:
            snapshot = {u: h for u, (h, _g) in ownership.items()}
            if snapshot == target:
                return True  # the same peers give the same ring: the very same division
            if snapshot != state["last"]:
                state["last"], state["since"] = snapshot, elapsed
                return False
            # a division that differs from the first one but holds still is reported as is
            return (counts(ownership).get(victim, 0) > 0
                    and elapsed - state["since"] >= STABLE_FOR)

        final, elapsed = self.poll(
            done, REBALANCE_TIMEOUT,
            lambda o, e: count_line(e, o, self.total,
                                    f"{victim} back with {counts(o).get(victim, 0)}"),
            f"{victim} to take its share back", started=started)
        taken = sum(1 for u, (h, _g) in final.items()
                    if h == victim and after_failover.get(u, (None,))[0] != victim)
        same = {u: h for u, (h, _g) in final.items()} == target
        verdict = ("the division is exactly the one before the kill (the same services give "
                   "the same ring)" if same else
                   "the division differs from the one before the kill")
        OUT.line(f"  rebalance done {elapsed:.1f} s after the restart: {victim} took "
                 f"{plural(taken)} back; {verdict}")
        self.summary.append(
            f"  rebalance  restart {victim}: it held {plural(taken)} again {elapsed:.1f} s later; "
            + ("same division as at the start" if same else "a different division than at "
                                                             "the start"))

    def poll_instances(self, done: Callable[[dict[str, Instance]], bool],
                       line: Callable[[dict[str, Instance], float], str], timeout: float,
                       what: str) -> tuple[dict[str, Instance], float]:
        """Like :meth:`poll`, over the live instances: a line every second."""
        started, next_print = time.monotonic(), 0.0
        while True:
            self.check_services()
            elapsed = time.monotonic() - started
            sample = read_instances(self.db)
            if sample is not None and (done(sample) or elapsed >= next_print):
                OUT.line(line(sample, elapsed))
                if done(sample):
                    return sample, elapsed
                while next_print <= elapsed:
                    next_print += 1.0
            if elapsed > timeout:
                raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}; see the "
                                "logs: " + ", ".join(rel(s.log) for s in self.services.values()))
            time.sleep(0.2)

    def create_instance(self, name: str) -> None:
        for attempt in (1, 2, 3):  # SQLite refuses a writer that meets another one
            try:
                self.manage("instance", "create", "--name", name, "--resource-class",
                            "baremetal", "--format", "json")
                return
            except DemoError as exc:
                if attempt == 3 or "locked" not in str(exc):
                    raise
                time.sleep(0.5)

    def instances(self) -> None:
        count = min(self.args.instances, self.total)
        per_host = -(-count // len(HOSTS))  # room for an even spread
        ownership = sorted((read_ownership(self.db) or {}).items())
        held: dict[str, list[str]] = {host: [] for host in HOSTS}
        for uuid, (host, _group) in ownership:
            if host in held and len(held[host]) < per_host:
                held[host].append(uuid)
        chosen = [uuid for uuids in held.values() for uuid in uuids]
        # a service holding fewer nodes than its share: others take more
        chosen += [u for u, _ in ownership if u not in chosen][:max(0, count - len(chosen))]
        started = time.monotonic()
        with OUT.busy("making nodes buildable"):
            make_buildable(self.ironic.url, chosen)
            # The scheduler reads the nodes' rows: wait for the cycle that sees them free.
            self.poll(lambda o, _e: all(node_free(self.db, u) for u in chosen), 60, None,
                      "the services to see the nodes available")
        OUT.line(f"  {plural(len(chosen))} made buildable in {time.monotonic() - started:.1f} s "
                 "(manage, provide, power off) among those each service holds; the services "
                 "list them as free at their next cycle")
        OUT.line(f"  {count} x `ironic-compute-manage instance create --name demo-N "
                 "--resource-class baremetal`, all at once and without --host: each goes to "
                 "the live service with the fewest instances, which reserves a node through "
                 "Ironic's allocation API and deploys it:")
        names = [f"demo-{i}" for i in range(1, count + 1)]
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(self.create_instance, names))

        def states(sample: dict[str, Instance], elapsed: float) -> str:
            per_state: dict[str, int] = {}
            for _n, _h, _node, state, _f in sample.values():
                per_state[state] = per_state.get(state, 0) + 1
            return (f"  {elapsed:5.1f} s   "
                    + "   ".join(f"{state} {n}" for state, n in sorted(per_state.items())))

        built, elapsed = self.poll_instances(
            lambda sample: len(sample) == count and all(
                i[3] in ("active", "error") for i in sample.values()),
            states, BUILD_TIMEOUT, "the instances to be built")
        active = sum(1 for i in built.values() if i[3] == "active")
        OUT.line(f"  {active} of {count} active {elapsed:.1f} s after the requests:")
        OUT.line()
        names = {n["uuid"]: n["name"] for n in ironic_request(
            self.ironic.url, "GET", "/v1/nodes?fields=uuid,name")["nodes"]}
        for text in instance_table(built, names):
            OUT.line(text)
        if active < count:
            raise DemoError(f"{count - active} instance(s) in error (see the table)")

        on_host = {h: sum(1 for i in built.values() if i[1] == h) for h in HOSTS}
        victim = max(HOSTS, key=lambda h: on_host[h])
        mine = {u for u, i in built.items() if i[1] == victim}
        OUT.line()
        OUT.line(f"  {victim} manages {plural(len(mine), 'instance')}. Once it is down "
                 f"(silent for {SERVICE_DOWN_TIME} s) its free nodes move; its instances move, "
                 f"with their nodes, once it has been silent for longer than "
                 f"instance_takeover_grace ({TAKEOVER_GRACE} s), at a live service's next cycle.")
        self.services[victim].kill()
        OUT.line(f"  kill -9 {victim} (pid {self.services[victim].pid}); every second, the "
                 "instances each service manages:")

        def taken(sample: dict[str, Instance]) -> bool:
            return all(u in sample and sample[u][1] not in (victim, None)
                       and sample[u][3] == "active" for u in mine)

        def line(sample: dict[str, Instance], elapsed: float) -> str:
            age = heartbeat_ages(self.db).get(victim)
            seen = "" if age is None else f"   {victim} last heartbeat {age:4.1f} s ago"
            moved = sum(1 for u in mine if u in sample and sample[u][1] != victim)
            return (f"  {elapsed:5.1f} s   {instance_counts(sample)}{seen}   "
                    f"moved {moved}/{len(mine)}")

        after, elapsed = self.poll_instances(taken, line, TAKEOVER_TIMEOUT,
                                             f"the live services to take {victim}'s instances")
        same_nodes = all(after[u][2] == built[u][2] for u in mine)
        gained = {h: sum(1 for u in mine if after[u][1] == h) for h in HOSTS if h != victim}
        OUT.line(f"  takeover done {elapsed:.1f} s after the kill: {victim}'s "
                 f"{plural(len(mine), 'instance')} went to "
                 + " and ".join(f"{h} ({n})" for h, n in gained.items())
                 + ("; still active, on the same nodes" if same_nodes else "") + ":")
        OUT.line()
        for text in instance_table(after, names, mine, victim):
            OUT.line(text)
        self.summary.append(
            f"  instances  {count} built at once, spread "
            + "/".join(str(on_host[h]) for h in HOSTS)
            + f"; kill -9 {victim}: its {plural(len(mine), 'instance')} were on live services "
            f"{elapsed:.1f} s later (instance_takeover_grace {TAKEOVER_GRACE} s)")

    # ---------------------------------------------------------------- run
    def run(self) -> None:
        total_steps = 7
        ironic_venv = (self.args.ironic_venv or os.environ.get("IRONIC_VENV")
                       or REPO_ROOT / ".ironic" / "venv")
        OUT.step(2, total_steps, f"A standalone Ironic (own virtualenv {rel(ironic_venv)}), "
                 f"conductor groups {' and '.join(GROUPS)}")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        leftovers = stop_leftover_services(self.state_dir)
        if leftovers:
            OUT.line(f"  stopped {', '.join(leftovers)} left running by an earlier run")
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(f"{self.db}{suffix}").unlink(missing_ok=True)
        for old_log in (self.state_dir / "logs").glob("*.log"):
            old_log.unlink()
        self.start_ironic()

        OUT.step(3, total_steps, f"{self.total} fake nodes: {self.args.nodes} in each group")
        self.create_nodes()

        OUT.step(4, total_steps, "Three ironic-compute services on one SQLite database, "
                 "sharing every node")
        initial = self.start_services()
        per_host = counts(initial)
        victim = max(HOSTS, key=lambda h: (per_host[h], h == "compute-2"))

        OUT.step(5, total_steps, f"Failover: kill -9 {victim}")
        after = self.failover(initial, victim)

        OUT.step(6, total_steps, f"Rebalance: restart {victim}")
        self.rebalance(initial, after, victim)

        if self.args.instances:
            OUT.step(7, total_steps, "Instances: build a few, kill -9 a service that has some, "
                     "watch the takeover")
            self.instances()

        OUT.line()
        OUT.line(f"Summary: {len(HOSTS)} services, {self.total} nodes in {len(GROUPS)} "
                 "conductor groups, one SQLite database")
        for text in self.summary:
            OUT.line(text)

    def cleanup(self) -> None:
        if self.args.keep:
            self.print_keep_hints()
            return
        OUT.line()
        OUT.line("Stopping what the demo started")
        names = [s.host for s in self.services.values() if s.stop()]
        if names:
            OUT.line(f"  stopped {', '.join(names)}")
        if self.ironic is not None:
            self.ironic.stop(quiet=True)
            OUT.line("  stopped Ironic")

    def print_keep_hints(self) -> None:
        running = [s for s in self.services.values()
                   if s.process is not None and s.process.poll() is None]
        OUT.line()
        OUT.line("Left running (--keep):")
        if self.ironic is not None:
            OUT.line(f"  Ironic     {self.ironic.url}")
        if running:
            OUT.line("  services   " + ", ".join(f"{s.host} (pid {s.pid})" for s in running)
                     + f", logs in {rel(self.state_dir / 'logs')}/")
            manage = " ".join(shlex.quote(rel(p)) for p in _tool("ironic-compute-manage"))
            conf = shlex.quote(rel(self.services[HOSTS[0]].config))
            OUT.line(f"  look:      {manage} --config-file {conf} service list")
            OUT.line(f"             {manage} --config-file {conf} ring show")
            OUT.line(f"             {manage} --config-file {conf} instance list")
        stop = ["python3", "tools/demo.py", "--stop"]
        if self.state_dir != DEFAULT_STATE_DIR:
            stop += ["--state-dir", rel(self.state_dir)]
        OUT.line(f"  stop all:  {shlex.join(stop)}")


# --------------------------------------------------------------------------- entry points


def stop_everything(state_dir: Path) -> int:
    """``--stop``: what a ``--keep`` run left running in ``state_dir``."""
    stopped = stop_leftover_services(state_dir)
    import ironic_standalone as standalone  # beside this script: sys.path[0]
    server = standalone.IronicServer(state_dir=state_dir / "ironic", log=None)
    stopped += [f"Ironic {name}" for name in server.stop(quiet=True)]
    OUT.line(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def _raise_interrupt(signo, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signo).name)


def build_parser() -> argparse.ArgumentParser:
    def node_count(value: str) -> int:
        number = int(value)
        if not 1 <= number <= MAX_NODES:
            raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_NODES}")
        return number

    def instance_count(value: str) -> int:
        number = int(value)
        if not 0 <= number <= MAX_INSTANCES:
            raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_INSTANCES}")
        return number

    parser = argparse.ArgumentParser(
        prog="tools/demo.py",
        description="Quickstart demo: a real standalone Ironic, three ironic-compute "
                    "services sharing its nodes on one SQLite database, a failover, a "
                    "rebalance, instances and their takeover. Stops everything it started "
                    "when it ends.")
    parser.add_argument("--nodes", type=node_count, default=DEFAULT_NODES,
                        help="fake nodes per conductor group (two groups) "
                             "[default %(default)s]")
    parser.add_argument("--instances", type=instance_count, default=DEFAULT_INSTANCES,
                        help="instances to build in the last step (0: skip it) "
                             "[default %(default)s]")
    parser.add_argument("--keep", action="store_true",
                        help="leave Ironic and the services running at the end "
                             "(stop them with --stop)")
    parser.add_argument("--stop", action="store_true",
                        help="stop what an earlier --keep run left running, and exit")
    parser.add_argument("--state-dir", type=lambda p: Path(p).absolute(),
                        default=DEFAULT_STATE_DIR,
                        help="configs, SQLite database, logs, Ironic's state "
                             f"[default {rel(DEFAULT_STATE_DIR)}]")
    parser.add_argument("--ironic-venv", type=lambda p: Path(p).absolute(), default=None,
                        help="Ironic's own virtualenv, created when missing "
                             "[$IRONIC_VENV, default .ironic/venv]")
    parser.add_argument("--python", default=None,
                        help="an interpreter that already has ironic-compute installed "
                             "(e.g. a dev virtualenv's python): skips creating .demo/venv")
    parser.add_argument("--debug", action="store_true",
                        help="tracebacks on errors; debug logging in the services and Ironic")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    return parser


def outer(args: argparse.Namespace, argv: list[str]) -> int:
    """Step 1 with any Python: the project's virtualenv; then run again with its Python."""
    OUT.line("ironic-compute demo: three services share the nodes of a real Ironic")
    OUT.step(1, 7, "The project's own virtualenv")
    if args.python:
        python = Path(args.python)
        if not _project_importable(python):
            raise DemoError(f"{args.python} cannot import ironic_compute: install the project "
                            f"into it (pip install -e {rel(REPO_ROOT)}) or drop --python")
        OUT.line(f"  using {args.python} (--python)")
    else:
        python = ensure_project_venv(DEFAULT_VENV)
    sys.stdout.flush()
    argv = [a for a in argv if a != "--inside"]
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), "--inside", *argv])
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    for signo in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signo, _raise_interrupt)
    demo = None
    try:
        if args.stop:
            return stop_everything(args.state_dir)
        if not args.inside:
            return outer(args, argv)
        demo = Demo(args)
        try:
            demo.run()
        finally:
            # Stopping must not be cut short by a second Ctrl-C (it takes a few seconds).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for signo in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(signo, signal.SIG_IGN)
            try:
                demo.cleanup()
            except Exception as exc:  # noqa: BLE001 - keep the first error
                print(f"{PROG}: warning: stopping failed: {exc}", file=sys.stderr)
        OUT.line("Done.")
        return 0
    except KeyboardInterrupt:
        OUT.end_status()
        left = "left running (--keep)" if args.keep else "stopped"
        print(f"{PROG}: interrupted; what the demo started is {left}", file=sys.stderr)
        return 130
    except DemoError as exc:
        OUT.end_status()
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - one line unless --debug
        OUT.end_status()
        if args.debug:
            traceback.print_exc()
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"{PROG}: error: {type(exc).__name__}: {exc} (at {Path(where.filename).name}:"
              f"{where.lineno}; --debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
