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

"""The demo's console and its first step, with nothing but the standard library.

``tools/demo.py`` imports this module before it has the project's virtualenv: the
console helpers (:func:`say`, :func:`busy`, :func:`table`...) and :func:`project_venv`
(step 1) run with any python3. What needs the project is in ``tools/fleet.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

VENV_MARKER = ".ironic-compute-demo.json"
_LAST_OUTPUT = [time.monotonic()]  # when say() last printed, for busy()


class DemoError(Exception):
    """A step failed: reported as one line (plus a log tail when there is one)."""


# ------------------------------------------------------------------------- console


def say(text: str = "") -> None:
    print(text, flush=True)
    _LAST_OUTPUT[0] = time.monotonic()


@contextlib.contextmanager
def busy(label: str):
    """A line every 10 s while a step prints nothing."""
    started, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(1.0):
            if time.monotonic() - _LAST_OUTPUT[0] >= 10:
                say(f"  ... {label} ({time.monotonic() - started:.0f} s)")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def progress_log(what: str):
    """A ``log`` for the Ironic launcher and pip: its lines, pip's output cut to a few of them."""
    started, collected = time.monotonic(), [0]

    def log(message: str) -> None:
        message, elapsed = message.replace(f"{Path.cwd()}/", ""), time.monotonic() - started
        line = message.removeprefix("  pip: ")
        if line == message:
            say(f"  {message}")
        elif line.startswith("Collecting "):
            collected[0] += 1
        elif line.startswith("Installing collected packages"):
            say(f"  pip: {what}: {collected[0]} packages downloaded in {elapsed:.0f} s; "
                "installing them")
        elif line.startswith("Successfully installed"):
            count = "" if line.endswith("...") else f"{len(line.split()) - 2} packages "
            say(f"  pip: {what}: installed {count}in {elapsed:.0f} s")
        elif line.startswith(("ERROR", "error:")):
            say(f"  pip: {line}")
    return log


def rel(path: os.PathLike | str) -> str:
    """A path as short as it can be shown: relative to the current directory when inside."""
    with contextlib.suppress(ValueError):
        return str(Path(path).relative_to(Path.cwd())) or "."
    return str(path)


def plural(count: int, word: str = "node") -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def table(rows: list, formats: list[str]) -> None:
    """A blank line, then ``rows`` (the header first) indented, each cell in its format spec."""
    say()
    for row in rows:
        say("    " + "".join(f"{cell:{spec}}" for cell, spec in zip(row, formats, strict=True)))


def instance_table(instances: dict, names: dict, moved=(), victim: str = "") -> None:
    """``instances`` ({uuid: (host, node, state, task)}) by name; ``moved``: taken over from
    ``victim``."""
    rows = sorted(instances.items(), key=lambda item: names.get(item[0], item[0]))
    table([["instance", "host", "node", "state", ""], *(
        [names.get(uuid, uuid), host or "-", names.get(node, node or "-"), state,
         f"   (taken over from {victim})" if uuid in moved else ""]
        for uuid, (host, node, state, _task) in rows)], ["<10", "<12", "<20", "", ""])


def bounded(low: int, high: int):
    """An argparse ``type``: an integer from ``low`` to ``high``."""
    def parse(value: str) -> int:
        if not low <= int(value) <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
        return int(value)
    return parse


def error_line(exc: Exception, expected: tuple = ()) -> str:
    """One line for an error: the message of an expected failure (a DemoError, an
    AssertionError or one of ``expected``), else its type and where."""
    if isinstance(exc, (DemoError, AssertionError, *expected)):
        return str(exc)
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return (f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno}; "
            "--debug shows the traceback)")


# ------------------------------------------------------------------------- virtualenv


def importable(python: Path) -> bool:
    """``python`` has ironic-compute installed (its scripts and its imports)."""
    try:
        return (python.parent / "ironic-compute-manage").exists() and subprocess.run(
            [str(python), "-c", "import ironic_compute.cmd.manage, sqlalchemy"],
            capture_output=True, timeout=120, cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def project_venv(venv: Path, repo: Path) -> Path:
    """The Python of ``venv`` with the project at ``repo`` installed (editable); the
    virtualenv is created, or installed again when the project's requirements changed."""
    python, marker = venv / "bin" / "python", venv / VENV_MARKER
    digest = hashlib.sha256(str(repo).encode())
    for name in ("requirements.txt", "setup.cfg", "pyproject.toml", "setup.py"):
        with contextlib.suppress(OSError):
            digest.update(name.encode() + b"\0" + (repo / name).read_bytes())
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer of the virtualenv at a time
        with contextlib.suppress(OSError, ValueError, KeyError):
            if (json.loads(marker.read_text())["fingerprint"] == digest.hexdigest()
                    and importable(python)):
                say(f"  reusing {rel(venv)} (delete it to start afresh)")
                return python
        started, env = time.monotonic(), dict(os.environ)
        env.pop("PYTHONPATH", None)
        if not (repo / ".git").exists():
            env.setdefault("PBR_VERSION", "0.0.0")  # pbr takes the version from git otherwise
        with busy("pip install"):
            install_editable(venv, repo, env, progress_log("ironic-compute"))
        if not importable(python):
            raise DemoError(f"pip install finished but {python} cannot import ironic_compute")
        marker.write_text(json.dumps({"fingerprint": digest.hexdigest(), "repo": str(repo),
                                      "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
        say(f"  project virtualenv ready in {time.monotonic() - started:.0f} s")
        return python


def install_editable(venv: Path, repo: Path, env: dict, log) -> None:
    """``pip install -e repo`` into ``venv`` (created when it has no Python), pip's
    output line by line to ``log`` (as ``"  pip: <line>"``); DemoError when it fails."""
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating virtualenv {venv} (python: {sys.executable})")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log(f"pip install -e . into {venv} (1-2 minutes and ~300 MB the first time)")
    last: list[str] = []
    with subprocess.Popen([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                           "--progress-bar", "off", "-e", "."], cwd=str(repo), env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as pip:
        for line in pip.stdout:
            log("  pip: " + line.rstrip())
            last = [*last[-19:], line.rstrip()]
    if pip.returncode:
        raise DemoError(f"pip install -e . failed ({pip.returncode}):\n" + "\n".join(last))


def leftovers(state_dir: Path) -> bool:
    """An earlier run may have left something running in ``state_dir`` (a pid file)."""
    return any(state_dir.glob("run/*.pid")) or any(state_dir.glob("ironic/**/*.pid"))
