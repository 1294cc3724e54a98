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

"""Processes and virtualenvs that the harness starts, on Linux.

Detached processes with a log and a pid file (:func:`spawn`), stopped by
pid (:func:`terminate`) or by process group (:func:`group_members`, which
reads /proc); virtualenvs filled by pip with a readable progress
(:func:`pip_install`, :func:`venv_lock`, :func:`run_streamed`); the tail
of a log (:func:`tail_file`); free ports. The standalone Ironic, the
Placement harness, the demo and tools/fleet.py use them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from pathlib import Path

API_HOST = "127.0.0.1"
DEFAULT_STOP_TIMEOUT = 20.0
# Ironic appends ":<port>" to a conductor's hostname only when the JSON-RPC port is not
# the default 8089, and the readiness check relies on that suffix: never pick 8089.
_JSON_RPC_DEFAULT_PORT = 8089


class IronicError(RuntimeError):
    """Installing, starting or stopping the standalone Ironic (or a process or
    virtualenv of the harness) failed."""


def free_port(host: str = API_HOST, avoid: Iterable[int] = ()) -> int:
    """Return a TCP port free on ``host`` right now (small race until the service binds it).

    Raises IronicError when 50 tries found none outside ``avoid``.
    """
    avoid = set(avoid) | {_JSON_RPC_DEFAULT_PORT}
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port
    raise IronicError(f"could not find a free port on {host}")


def port_in_use(host: str, port: int) -> bool:
    """Return True when ``port`` on ``host`` cannot be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


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

def tail_file(path: Path, lines: int = 40, offset: int = 0) -> str:
    """Return the last ``lines`` lines of ``path`` written after byte ``offset`` (at most
    its last 64 KiB), "(empty)" for none, or a "(cannot read ...)" line: a failure's
    message quotes it, so it never raises."""
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
