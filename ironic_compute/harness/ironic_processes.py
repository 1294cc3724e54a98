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

"""The processes of a standalone Ironic: started, recognised, stopped, waited for.

One ``ironic`` process (API and the conductor of the default group) and one
``ironic-conductor`` per extra conductor group, each detached in its own session with
a pid file and a log in the state directory. A pid is taken for one of ours only while
its command line names our configuration (pids are reused). A process is ready when
the API answers and its conductor has registered, alive, after it was spawned.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from collections.abc import Iterable
from pathlib import Path

from ironic_compute.harness.ironic_layout import ENV_VARS
from ironic_compute.harness.ironic_layout import MAIN_PROCESS
from ironic_compute.harness.ironic_layout import StateDir
from ironic_compute.harness.processes import DEFAULT_STOP_TIMEOUT
from ironic_compute.harness.processes import IronicError
from ironic_compute.harness.processes import cmdline
from ironic_compute.harness.processes import group_members
from ironic_compute.harness.processes import pid_alive
from ironic_compute.harness.processes import spawn
from ironic_compute.harness.processes import tail_file

# GET /v1/conductors needs 1.49; ``detail`` (for updated_at) needs it too.
CONDUCTORS_API_VERSION = "1.49"


def http_get_json(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0):
    """Return the decoded JSON body of ``GET url``; raises OSError, ValueError, URLError."""
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


class IronicProcesses:
    """The processes of the state directory ``files``, run from ``bin_dir``.

    ``die_with_parent``: they get SIGTERM when this process dies, and are stopped at
    interpreter exit (best effort; a stop by pid file always works).
    """

    _CRASH_RE = re.compile(rb"Child \d+ exited with status [1-9]| CRITICAL ")

    def __init__(self, files: StateDir, bin_dir: Path, die_with_parent: bool,
                 log: Callable[[str], None], at_exit: Callable[[], object]) -> None:
        self.files = files
        self.bin_dir = bin_dir
        self.die_with_parent = die_with_parent
        self._log = log
        self._at_exit = at_exit  # what the interpreter's exit runs (die_with_parent)
        self._popen: dict[str, subprocess.Popen] = {}
        self._spawned_at: dict[str, datetime.datetime] = {}
        self._log_offset: dict[str, int] = {}
        self._atexit_registered = False

    def is_ours(self, name: str, pid: int) -> bool:
        """The pid runs one of our Ironic processes (guards against pid reuse)."""
        popen = self._popen.get(name)
        if popen is not None and popen.pid == pid:
            return popen.poll() is None
        if not pid_alive(pid):
            return False
        if not Path(f"/proc/{pid}").exists():
            return True  # no procfs to check against
        return str(self.files.etc_dir / "ironic.conf") in cmdline(pid)

    def running(self, name: str) -> int | None:
        """Return the pid of process ``name`` when it runs and is ours, else None."""
        pid = self.files.read_pid(name)
        return pid if pid and self.is_ours(name, pid) else None

    def spawn(self, name: str) -> int:
        """Start process ``name`` as the state's plan says; return its pid (not waited for)."""
        proc = self.files.state["processes"][name]
        exe = "ironic" if name == MAIN_PROCESS else "ironic-conductor"
        cmd = [str(self.bin_dir / exe)]
        for conf in self.files.config_files(name):
            cmd += ["--config-file", str(conf)]
        log_path = Path(proc["log"])
        self._log_offset[name] = log_path.stat().st_size if log_path.exists() else 0
        env = dict(os.environ)
        for var in ("PYTHONPATH", "VIRTUAL_ENV"):  # keep the project's venv out of Ironic's
            env.pop(var, None)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._spawned_at[name] = datetime.datetime.now(datetime.timezone.utc)
        popen = spawn(cmd, log_path, self.files.pid_file(name), env=env,
                      cwd=str(self.files.path), die_with_parent=self.die_with_parent)
        self._popen[name] = popen
        if self.die_with_parent and not self._atexit_registered:
            atexit.register(self._atexit_stop)
            self._atexit_registered = True
        self._log(f"started {name} (group {proc['group']!r}, pid {popen.pid}, "
                  f"json-rpc {proc['hostname']}); log {log_path}")
        return popen.pid

    def _atexit_stop(self) -> None:
        with contextlib.suppress(Exception):
            self._at_exit()

    def wait_ready(self, url: str, names: Iterable[str], timeout: float = 60.0) -> None:
        """Wait until the API answers at /v1 and each named process' conductor is registered,
        alive, and registered after that process was spawned (a stale row does not count).

        Raises IronicError, with the end of the log to blame, when a process exits or
        crashes meanwhile or ``timeout`` passes.
        """
        names = list(names)
        started = time.monotonic()
        deadline = started + max(timeout, 5.0)
        pending = set(names)
        last_error = "no answer yet"
        while True:
            for name in names:
                if not self.is_ours(name, self.files.read_pid(name) or 0):
                    raise IronicError(self._failure(
                        name, f"process {name} exited{self._exit_code(name)} during start"))
                if name in pending and self._crashed(name):
                    raise IronicError(self._failure(
                        name, f"{name}'s service crashed during start (its launcher would "
                              "re-fork it forever)"))
            try:
                http_get_json(f"{url}/v1", timeout=3)
                conductors = {c["hostname"]: c for c in list_conductors(url, timeout=3)}
                for name in list(pending):
                    if self._registered(name, conductors):
                        pending.discard(name)
                if not pending:
                    return
                last_error = f"waiting for conductors: {', '.join(sorted(pending))}"
            except (OSError, ValueError, urllib.error.URLError) as exc:
                last_error = f"API {url}/v1 not answering: {exc}"
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

    def _registered(self, name: str, conductors: dict[str, dict]) -> bool:
        """Return True when process ``name``'s conductor is in ``conductors`` (by
        hostname), alive, in its group, and registered after the process was spawned."""
        proc = self.files.state["processes"][name]
        row = conductors.get(proc["hostname"])
        if not row or not row.get("alive"):
            return False
        if row.get("conductor_group", "") != proc["group"]:
            return False
        registered = _parse_time(row.get("updated_at")) or _parse_time(row.get("created_at"))
        spawned = self._spawned_at.get(name)
        # A row left by an earlier (killed) process does not count: same clock.
        return not (spawned and registered and registered <= spawned)

    def _crashed(self, name: str) -> bool:
        """The service worker died (the master process survives and re-forks it)."""
        try:
            with open(self.files.log_path(name), "rb") as f:
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
        log = self.files.log_path(name)
        return (f"{message}\n--- last lines of {log} ---\n"
                f"{tail_file(log, offset=self._log_offset.get(name, 0))}")

    def stop(self, name: str, timeout: float = DEFAULT_STOP_TIMEOUT,
             sig: int = signal.SIGTERM) -> bool:
        """Send ``sig`` to process ``name``'s process group, SIGKILL after ``timeout``; wait
        until the group is gone and remove the pid file. Returns False when it was not
        running."""
        pid = self.files.read_pid(name)
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
            self.files.pid_file(name).unlink()
        return stopped

    def _group_alive(self, name: str, pgid: int) -> bool:
        popen = self._popen.get(name)
        if popen is not None and popen.pid == pgid:
            popen.poll()  # reap the leader if it is our child
        if Path("/proc/self/stat").exists():
            return bool(group_members(pgid))
        return pid_alive(pgid)

    def _signal_group(self, name: str, pgid: int, sig: int) -> bool:
        leader_ours = self.is_ours(name, pgid)
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

    def stop_all(self, names: Iterable[str], timeout: float = DEFAULT_STOP_TIMEOUT) -> list[str]:
        """Stop the processes ``names`` in parallel (each takes ~2 s to shut down
        gracefully); return the names of those that were running."""
        stopped: list[str] = []
        lock = threading.Lock()

        def _stop(name: str) -> None:
            if self.stop(name, timeout=timeout):
                with lock:
                    stopped.append(name)

        threads = [threading.Thread(target=_stop, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return stopped
