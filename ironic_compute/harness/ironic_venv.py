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

"""The virtualenv a standalone Ironic runs from.

Ironic has pins that clash with the project's, so it lives in its own virtualenv
(by default ``<checkout>/.ironic/venv``). A marker file beside its packages records what
was installed, so that a changed pip spec installs again.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ironic_compute.harness.ironic_layout import DEFAULT_PIP_SPEC
from ironic_compute.harness.ironic_layout import StateDir
from ironic_compute.harness.processes import IronicError
from ironic_compute.harness.processes import pip_install
from ironic_compute.harness.processes import tail_file
from ironic_compute.harness.processes import venv_lock

_MARKER = ".ironic-standalone.json"


class IronicVenv:
    """Ironic's virtualenv at ``path``: installed with ``pip_spec`` by ``python``."""

    def __init__(self, path: Path, pip_spec: str, python: str,
                 log: Callable[[str], None]) -> None:
        self.path = path
        self.bin_dir = path / "bin"
        self.pip_spec = pip_spec
        self.python = python
        self._log = log
        self._version: str | None = None

    def installed_version(self) -> str | None:
        """Return Ironic's version when the venv has working entry points, else None."""
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
            return json.loads((self.path / _MARKER).read_text())
        except (OSError, ValueError):
            return {}

    def is_installed(self) -> bool:
        """Return True when Ironic works here and was installed with this pip spec."""
        if self.installed_version() is None:
            return False
        spec = self._marker().get("pip_spec")
        return spec == self.pip_spec or (spec is None and self.pip_spec == DEFAULT_PIP_SPEC)

    def install(self, force: bool = False) -> bool:
        """Create the venv and ``pip install`` Ironic into it. Returns False when it was there.

        Safe to call concurrently (a file lock next to the venv serialises installers).
        Raises IronicError when pip fails, or when Ironic does not run after it.
        """
        with venv_lock(self.path):
            if not force and self.is_installed():
                self._log(f"Ironic {self.installed_version()} already installed in {self.path}")
                return False
            started = time.monotonic()
            self._version = None
            pip_install(self.path, [self.pip_spec], self._log, self.python,
                        " (about 40 s and 350 MB on first install)")
            self._version = None
            version = self.installed_version()
            if version is None:
                raise IronicError(
                    f"pip finished but {self.bin_dir}/ironic-dbsync --version does not work")
            (self.path / _MARKER).write_text(json.dumps(
                {"pip_spec": self.pip_spec, "version": version,
                 "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
            self._log(f"installed Ironic {version} in {time.monotonic() - started:.1f} s")
            return True

    def install_mysql_driver(self) -> None:
        """Install PyMySQL into the venv unless Ironic's Python imports it already.

        Raises IronicError when pip fails.
        """
        python = str(self.bin_dir / "python")
        with venv_lock(self.path):
            if subprocess.run([python, "-c", "import pymysql"],
                              capture_output=True).returncode:
                pip_install(self.path, ["pymysql"], self._log, self.python)

    def sync_database(self, files: StateDir, database_url: str | None, keep_db: bool) -> None:
        """Give Ironic its schema with ``ironic-dbsync``: ``database_url`` (a MariaDB
        database, empty on a fresh start) or the SQLite file of ``files``, new unless
        ``keep_db``; a kept database is upgraded.

        Raises IronicError, with the end of dbsync's log, when it fails.
        """
        if database_url:
            # The caller's database: empty on a fresh start, else upgraded.
            self.install_mysql_driver()
            action = "upgrade" if keep_db else "create_schema"
        elif keep_db and files.db_path.exists():
            self._log(f"keeping database {files.db_path}; running ironic-dbsync upgrade")
            action = "upgrade"
        else:
            for suffix in ("", "-journal", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{files.db_path}{suffix}").unlink()
            action = "create_schema"
        cmd = [str(self.bin_dir / "ironic-dbsync"), "--config-file",
               str(files.etc_dir / "ironic.conf"), action]
        log = files.log_dir / "dbsync.log"
        with open(log, "a") as out:
            out.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
            out.flush()
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
        if rc != 0:
            raise IronicError(f"ironic-dbsync {action} failed ({rc}); last lines of {log}:\n"
                              + tail_file(log))
