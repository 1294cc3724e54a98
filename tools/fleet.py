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

"""ironic-compute services on one database, run for a person to watch (``tools/demo.py``).

Importing this module needs only the standard library: the console helpers (:func:`say`,
:func:`busy`, :func:`table`...) and :func:`project_venv` run with any python3. A
:class:`Fleet` runs in the project's virtualenv: it builds on ``tests/functional/daemons.py``
(a service's config and process, a sampler of the database) and ``ironic_standalone.spawn``
(a detached process with a log and a pid file, so that ``--stop`` finds it later).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ironic_standalone as standalone  # beside this module: tools/ is on sys.path

VENV_MARKER = ".ironic-compute-demo.json"
_LAST_OUTPUT = [time.monotonic()]  # when say() last printed, for busy()
daemons = None  # tests.functional.daemons, imported by the first Fleet


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
    """A ``log`` for ironic_standalone: its lines, pip's output cut to a few of them."""
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


def error_line(exc: Exception) -> str:
    """One line for an error: the message of an expected failure, else its type and where."""
    if isinstance(exc, (DemoError, standalone.IronicError, AssertionError)):
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
    with standalone.venv_lock(venv):
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
            standalone.pip_install(venv, ["-e", "."], progress_log("ironic-compute"),
                                   sys.executable, " (1-2 minutes and ~300 MB the first time)",
                                   env=env, cwd=str(repo))
        if not importable(python):
            raise DemoError(f"pip install finished but {python} cannot import ironic_compute")
        marker.write_text(json.dumps({"fingerprint": digest.hexdigest(), "repo": str(repo),
                                      "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
        say(f"  project virtualenv ready in {time.monotonic() - started:.0f} s")
        return python


# ------------------------------------------------------------------------- services


def stop_leftovers(state_dir: Path) -> list[str]:
    """Stop the services an earlier run (``--keep``, or a killed one) left running."""
    stopped = []
    for pid_file in sorted((state_dir / "run").glob("compute-*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            config = str(state_dir / f"{pid_file.stem}.conf")  # not a reused pid
            if config in standalone.cmdline(pid) and standalone.terminate(pid):
                stopped.append(pid_file.stem)
        pid_file.unlink(missing_ok=True)
    return stopped


def stop_all(state_dir: Path) -> list[str]:
    """What a ``--keep`` run left running in ``state_dir``: its services, then its Ironic."""
    return stop_leftovers(state_dir) + [f"Ironic {name}" for name in standalone.IronicServer(
        state_dir=state_dir / "ironic", log=None).stop(quiet=True)]


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


class Fleet:
    """The services ``hosts``, sharing the SQLite file ``db`` in ``state_dir``, where each
    has its config (``<host>.conf``), log (``logs/``) and pid file (``run/``).

    ``options``: the config sections all of them share; ``keep``: they outlive this process.
    """

    def __init__(self, state_dir: Path, hosts: tuple[str, ...], options: dict,
                 keep: bool) -> None:
        global daemons
        from tests.functional import daemons  # needs the project's virtualenv

        self.state_dir, self.hosts, self.keep = state_dir, hosts, keep
        self.db = state_dir / "ironic_compute.sqlite"
        self.down_after = options["DEFAULT"]["service_down_time"]
        # a division that held still for two cycles (and a margin) is final
        self.stable_for = 2 * options["DEFAULT"]["update_resources_interval"] + 1.0
        self.services = {host: daemons.Daemon(host, str(state_dir), {
            "DEFAULT": {"host": host, **options["DEFAULT"]},
            # the same file for all (the default is one under each's state_path)
            "database": {"connection": f"sqlite:///{self.db}"},
            **{name: dict(values) for name, values in options.items() if name != "DEFAULT"},
        }) for host in hosts}
        for host, service in self.services.items():
            service.log_path = str(state_dir / "logs" / f"{host}.log")
        self.started: dict[str, float] = {}  # host -> when it was (last) started
        self.sampler = None

    def write_configs(self, **sections: dict) -> None:
        for service in self.services.values():
            for name, values in sections.items():
                service.options.setdefault(name, {}).update(values)
            service.write_config()

    def start_sampler(self) -> None:
        """Read the database every 0.2 s, checking what must never happen, until ``close``."""
        self.sampler = daemons.InstanceSampler(f"sqlite:///{self.db}", interval=0.2)
        self.sampler.start()

    def heartbeat(self, host: str) -> datetime.datetime:
        """``host``'s last heartbeat (naive UTC: its clock is ours, on the same machine)."""
        with self.sampler.engine.connect() as conn:
            seen = conn.execute(daemons.sa.text(
                "SELECT last_seen_up FROM services WHERE deleted = 0 AND host = :host"),
                {"host": host}).scalar()
        return datetime.datetime.fromisoformat(str(seen)) if seen else datetime.datetime.min

    def heartbeat_note(self, host: str, down: bool = False) -> str:
        age = (utcnow() - self.heartbeat(host)).total_seconds()
        return f"{host} last heartbeat {age:4.1f} s ago" + (
            " -> down" if down and age > self.down_after else "")

    def cycled(self, *hosts: str, since: float | None = None, cycles: int = 1) -> bool:
        """Each of ``hosts`` ended ``cycles`` cycles since ``since`` (default: its start)."""
        return all(sum(1 for at, h, _s in self.sampler.cycles if h == host and at > (
            self.started[host] if since is None else since)) >= cycles for host in hosts)

    def wait_cycles(self, cycles: int, what: str) -> None:
        moment = time.monotonic()
        daemons.wait_until(lambda: self.cycled(*self.hosts, since=moment, cycles=cycles),
                           60, 0.2, what)

    def count_line(self, elapsed: float, owners: dict, note: str = "") -> str:
        """The nodes each service holds in ``owners`` ({node: host}), after ``elapsed``."""
        held = [sum(1 for h in owners.values() if h == host) for host in self.hosts]
        parts = [f"{host} {n:>3}" for host, n in zip(self.hosts, held, strict=True)]
        if len(owners) - sum(held):
            parts.append(f"no owner {len(owners) - sum(held):>3}")
        return f"  {elapsed:5.1f} s   " + "   ".join(parts) + (f"   {note}" if note else "")

    def division_table(self, owners: dict, group_of: dict, groups: tuple[str, ...]) -> None:
        """Nodes per service (rows) and conductor group (columns)."""
        counts = {host or "(no owner)": [sum(1 for u, o in owners.items()
                                             if o == host and group_of[u] == g) for g in groups]
                  for host in (*self.hosts, *({None} & set(owners.values())))}
        counts["total"] = [sum(column) for column in zip(*counts.values(), strict=True)]
        table([["service", *groups, "total"],
               *([host, *cells, sum(cells)] for host, cells in counts.items())],
              [f"<{max(map(len, counts))}", *[">10"] * len(groups), ">8"])

    def went_to(self, new_hosts: list) -> str:
        """Where moved things went: "compute-1 (6) and compute-3 (8)"."""
        return " and ".join(f"{h} ({n})" for h in self.hosts if (n := new_hosts.count(h)))

    def settled(self, owners: dict, elapsed: float, last: dict, hosts=None, show=True) -> bool:
        """Every node held by one of the services, no change for ``stable_for`` seconds since
        each of ``hosts`` (default: all) ended a cycle (``last``: the previous division and its
        time). A change is printed (unless not ``show``)."""
        if owners != last.get("owners"):
            last.update(owners=owners, since=elapsed)
            if show and any(owners.values()):
                say(self.count_line(elapsed, owners))
            return False
        return (all(h in self.hosts for h in owners.values())
                and self.cycled(*(self.hosts if hosts is None else hosts))
                and elapsed - last["since"] >= self.stable_for)

    def poll(self, read, until, line, timeout: float, what: str, started: float | None = None):
        """``read()`` a sample at every sampler pass until ``until(sample, elapsed)``; print
        ``line(sample, elapsed)`` every second and at the end. Returns the last sample and the
        seconds since ``started`` (default: now)."""
        started, next_print = time.monotonic() if started is None else started, 0.0
        while True:
            for service in self.services.values():
                service.check()  # AssertionError with the end of its log when it died
            sample, elapsed = read(), time.monotonic() - started
            done = until(sample, elapsed)
            if line and (done or elapsed >= next_print):
                say(line(sample, elapsed))
                next_print = int(elapsed) + 1.0
            if done:
                return sample, elapsed
            if elapsed > timeout:
                raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}; see the logs "
                                + ", ".join(rel(s.log_path) for s in self.services.values()))

    def start(self, host: str, tick=lambda: None) -> None:
        """Start one service and wait until it has registered in the database.

        Several services on one SQLite file: a service whose registration meets another
        one's write fails at once with "database is locked" and exits; start it again.
        """
        service, log = self.services[host], Path(self.services[host].log_path)
        for attempt in (1, 2, 3):
            since, self.started[host] = utcnow(), time.monotonic()
            deadline = time.monotonic() + 60
            service.process = standalone.spawn(
                [os.path.join(daemons.BIN_DIR, "ironic-compute"), "--config-file",
                 service.config_path], log, self.state_dir / "run" / f"{host}.pid",
                env=dict(os.environ, XDG_CACHE_HOME=str(self.state_dir / "cache")),
                die_with_parent=not self.keep)
            while service.alive and self.heartbeat(host) < since:
                if time.monotonic() > deadline:
                    raise DemoError(f"{host} did not register within 60 s; last lines of "
                                    f"{rel(log)}:\n{standalone.tail_file(log, 20)}")
                tick()
                time.sleep(0.1)
            if service.alive:
                service.expected_down = False
                return
            if attempt == 3 or "database is locked" not in standalone.tail_file(log, 3):
                raise DemoError(f"{host} exited with code {service.process.returncode}; last "
                                f"lines of {rel(log)}:\n{standalone.tail_file(log, 20)}")
            say(f"  {host} exited at start: SQLite said \"database is locked\" (another "
                "service was writing); starting it again")

    def start_all(self, started: float, tick=lambda: None) -> None:
        """Start the services one after the other, each line saying when since ``started``."""
        for host in self.hosts:
            self.start(host, tick)
            say(f"  {time.monotonic() - started:5.1f} s   {host} started "
                f"(pid {self.services[host].process.pid})")

    def kill(self, host: str) -> int:
        """``kill -9`` one service; its pid."""
        self.services[host].kill()
        return self.services[host].process.pid

    def manage(self, *args: str) -> str:
        """``ironic-compute-manage args`` with the first service's config; its output."""
        for attempt in (1, 2, 3):  # SQLite refuses a writer that meets another one
            result = daemons.manage(self.services[self.hosts[0]].config_path, *args)
            if result.returncode == 0 or attempt == 3 or "locked" not in result.stderr:
                break
        if result.returncode != 0:
            raise DemoError(f"`ironic-compute-manage {' '.join(args)}` failed: "
                            + (result.stderr.strip() or result.stdout.strip()))
        return result.stdout.strip()

    def shown(self, *args: str) -> str:
        """An ``ironic-compute-manage`` command line, as a newcomer types it here."""
        return shlex.join([rel(Path(sys.executable).parent / "ironic-compute-manage"),
                           "--config-file", rel(self.services[self.hosts[0]].config_path),
                           *args])

    def spread(self, owners: dict, count: int) -> list[str]:
        """``count`` nodes of ``owners``: one of each service in turn, so that builds on them
        can spread over the services, then any."""
        held = {h: sorted(u for u, o in owners.items() if o == h) for h in self.hosts}
        chosen = [u for rank in range(count) for h in self.hosts for u in held[h][rank:rank + 1]]
        return (chosen + [u for u in sorted(owners) if u not in chosen])[:count]

    def create_instances(self, count: int, resource_class: str) -> dict[str, str]:
        """``count`` x ``instance create --name demo-N``, all at once; {uuid: name}."""
        with ThreadPoolExecutor(count) as pool:
            return {made["uuid"]: made["name"] for made in pool.map(
                lambda i: json.loads(self.manage(
                    "instance", "create", "--name", f"demo-{i}", "--resource-class",
                    resource_class, "--format", "json")), range(1, count + 1))}

    def describe_running(self, running: list[str]) -> None:
        """The pids and logs of ``running`` services, and the commands to look at them."""
        say("  services   " + ", ".join(f"{h} (pid {self.services[h].process.pid})"
                                        for h in running)
            + f", logs in {rel(self.state_dir / 'logs')}/")
        for i, what in enumerate(("node list", "service list", "ring show", "instance list")):
            say(f"  {'look:' if i == 0 else '':<10} {self.shown(*what.split())}")

    def running(self) -> list[str]:
        return [host for host, service in self.services.items() if service.alive]

    def close_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.close()

    def stop(self) -> list[str]:
        """SIGTERM every running service (so it tells its peers it left); those stopped."""
        running = self.running()
        for host in running:
            self.services[host].stop(15)
        for pid_file in (self.state_dir / "run").glob("compute-*.pid"):
            pid_file.unlink()
        return running
