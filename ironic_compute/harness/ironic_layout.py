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

"""What one standalone Ironic is made of, and where it keeps its files.

The defaults (its virtualenv and state directory under the checkout's
``.ironic/``, its port, conductor groups and page size) and the environment
variables that change them; the names of its processes, one per conductor
group; and :class:`StateDir`, the files of one state directory: the
configuration, pid files, process logs, the SQLite file and ``state.json``
(the ports and addresses chosen at start, which a restart reuses).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from ironic_compute.harness.processes import IronicError

# The checkout this package runs from: the harness is not installed with the
# service (doc/architecture.md), so this is always a checkout.
REPO_ROOT = Path(__file__).resolve().parents[2]
CLI = "tools/ironic_standalone.py"
DEFAULT_VENV = REPO_ROOT / ".ironic" / "venv"
DEFAULT_STATE_DIR = REPO_ROOT / ".ironic" / "state"
DEFAULT_PORT = 6385
DEFAULT_GROUPS = ("", "group-a")
DEFAULT_MAX_LIMIT = 1000
DEFAULT_PIP_SPEC = "ironic"
DEFAULT_START_TIMEOUT = 120.0

MAIN_PROCESS = "ironic"
_GROUP_RE = re.compile(r"^[a-z0-9_.-]*$")

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


def parse_groups(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Return ``("", "group-a", "group-b")`` for ``",group-a,group-b"``: the default group
    always first, no duplicates; DEFAULT_GROUPS for None.

    Raises IronicError for a name Ironic would refuse on node creation.
    """
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
    """Return the name of the process that serves conductor group ``group``."""
    return MAIN_PROCESS if group == "" else f"conductor-{group}"


class StateDir:
    """The files of one standalone Ironic's state directory, and its ``state.json``.

    ``state`` is what the last start chose (URL, port, groups, and per process its
    group, loopback address, JSON-RPC port, log and pid file), or {} before any start.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).absolute()
        self.etc_dir, self.run_dir, self.log_dir, self.db_path, self.state_file = (
            self.path / name for name in ("etc", "run", "log", "ironic.sqlite", "state.json"))
        self.state: dict = self.read() or {}

    def config_files(self, name: str) -> list[Path]:
        """Return the config files of process ``name``: the shared one, then its own."""
        files = [self.etc_dir / "ironic.conf"]
        if name != MAIN_PROCESS:
            files.append(self.etc_dir / f"{name}.conf")
        return files

    def pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def read_pid(self, name: str) -> int | None:
        """Return the pid recorded for ``name``, or None without a readable pid file."""
        try:
            return int(self.pid_file(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def known_names(self, process_names: Iterable[str]) -> list[str]:
        """Return ``process_names``, then the other processes an earlier start recorded
        (in state.json or as a pid file): a stop must find those too."""
        names = list(process_names)
        for name in self.state.get("processes", {}):
            if name not in names:
                names.append(name)
        if self.run_dir.is_dir():
            for pid_file in sorted(self.run_dir.glob("*.pid")):
                if pid_file.stem not in names:
                    names.append(pid_file.stem)
        return names

    def read(self) -> dict | None:
        """Return the recorded state, or None when there is none or it is unreadable."""
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def write(self) -> None:
        """Record ``state`` (written to a temporary file, then renamed over the old one)."""
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_file)
