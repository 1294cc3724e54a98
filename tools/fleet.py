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

"""The ironic-compute services of the demo (``tools/demo.py``), run for a person to watch.

Runs in the project's virtualenv (after the demo's step 1): :class:`Fleet` extends
``ironic_compute.harness.fleet.Fleet`` (the services' configs and processes, a sampler of
their database) with detached processes and pid files (so that ``--stop`` finds them
later) and what the demo prints of them.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import sqlalchemy as sa
from demo_console import DemoError
from demo_console import rel
from demo_console import say
from demo_console import table

from ironic_compute.harness import fleet
from ironic_compute.harness import ironic as standalone


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


class Fleet(fleet.Fleet):
    """The services ``hosts``, sharing the SQLite file ``db`` in ``state_dir``, where each
    has its config (``<host>.conf``), log (``logs/``) and pid file (``run/``); the CLI
    runs with the first one's config.

    ``options``: the config sections all of them share; ``keep``: they outlive this process.
    """

    def __init__(self, state_dir: Path, hosts: tuple[str, ...], options: dict,
                 keep: bool) -> None:
        self.state_dir, self.hosts, self.keep = state_dir, hosts, keep
        self.db = state_dir / "ironic_compute.sqlite"
        super().__init__(state_dir, f"sqlite:///{self.db}",
                         manage_config=str(state_dir / f"{hosts[0]}.conf"))
        self.down_after = options["DEFAULT"]["service_down_time"]
        # a division that held still for two cycles (and a margin) is final
        self.stable_for = 2 * options["DEFAULT"]["update_resources_interval"] + 1.0
        for host in hosts:
            self.add(host, {
                "DEFAULT": {"host": host, **options["DEFAULT"]},
                # the same file for all (the default is one under each's state_path)
                "database": {"connection": self.db_url},
                **{name: dict(values) for name, values in options.items() if name != "DEFAULT"},
            }).log_path = str(state_dir / "logs" / f"{host}.log")
        self.started: dict[str, float] = {}  # host -> when it was (last) started

    def write_configs(self, **sections: dict) -> None:
        for service in self.daemons.values():
            for name, values in sections.items():
                service.options.setdefault(name, {}).update(values)
            service.write_config()

    def start_sampler(self) -> None:
        """Read the database every 0.2 s, checking what must never happen, until ``close``."""
        self.sampler = fleet.InstanceSampler(self.db_url, interval=0.2)
        self.sampler.start()

    def heartbeat(self, host: str) -> datetime.datetime:
        """``host``'s last heartbeat (naive UTC: its clock is ours, on the same machine)."""
        with self.engine.connect() as conn:
            seen = conn.execute(sa.text(
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
        fleet.wait_until(lambda: self.cycled(*self.hosts, since=moment, cycles=cycles),
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
            self.check_daemons()  # AssertionError with the end of its log when one died
            sample, elapsed = read(), time.monotonic() - started
            done = until(sample, elapsed)
            if line and (done or elapsed >= next_print):
                say(line(sample, elapsed))
                next_print = int(elapsed) + 1.0
            if done:
                return sample, elapsed
            if elapsed > timeout:
                raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}; see the logs "
                                + ", ".join(rel(s.log_path) for s in self.daemons.values()))

    def start_service(self, host: str, tick=lambda: None) -> None:
        """Start one service and wait until it has registered in the database.

        Several services on one SQLite file: a service whose registration meets another
        one's write fails at once with "database is locked" and exits; start it again.
        """
        service, log = self.daemons[host], Path(self.daemons[host].log_path)
        for attempt in (1, 2, 3):
            since, self.started[host] = utcnow(), time.monotonic()
            deadline = time.monotonic() + 60
            service.process = standalone.spawn(
                [os.path.join(fleet.BIN_DIR, "ironic-compute"), "--config-file",
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

    def start_services(self, started: float, tick=lambda: None) -> None:
        """Start the services one after the other, each line saying when since ``started``."""
        for host in self.hosts:
            self.start_service(host, tick)
            say(f"  {time.monotonic() - started:5.1f} s   {host} started "
                f"(pid {self.daemons[host].process.pid})")

    def kill(self, host: str) -> int:
        """``kill -9`` one service; its pid."""
        self.daemons[host].kill()
        return self.daemons[host].process.pid

    def cli(self, *args: str) -> str:
        """``ironic-compute-manage args`` with the first service's config; its output."""
        for attempt in (1, 2, 3):  # SQLite refuses a writer that meets another one
            result = self.manage(*args)
            if result.returncode == 0 or attempt == 3 or "locked" not in result.stderr:
                break
        if result.returncode != 0:
            raise DemoError(f"`ironic-compute-manage {' '.join(args)}` failed: "
                            + (result.stderr.strip() or result.stdout.strip()))
        return result.stdout.strip()

    def shown(self, *args: str) -> str:
        """An ``ironic-compute-manage`` command line, as a newcomer types it here."""
        return shlex.join([rel(Path(sys.executable).parent / "ironic-compute-manage"),
                           "--config-file", rel(self.manage_config),
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
                lambda i: json.loads(self.cli(
                    "instance", "create", "--name", f"demo-{i}", "--resource-class",
                    resource_class, "--format", "json")), range(1, count + 1))}

    def describe_running(self, running: list[str]) -> None:
        """The pids and logs of ``running`` services, and the commands to look at them."""
        say("  services   " + ", ".join(f"{h} (pid {self.daemons[h].process.pid})"
                                        for h in running)
            + f", logs in {rel(self.state_dir / 'logs')}/")
        for i, what in enumerate(("node list", "service list", "ring show", "instance list")):
            say(f"  {'look:' if i == 0 else '':<10} {self.shown(*what.split())}")

    def running(self) -> list[str]:
        return [host for host, service in self.daemons.items() if service.alive]

    def close_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.close()

    def stop(self) -> list[str]:
        """SIGTERM every running service (so it tells its peers it left); those stopped."""
        running = self.running()
        for host in running:
            self.daemons[host].stop(15)
        for pid_file in (self.state_dir / "run").glob("compute-*.pid"):
            pid_file.unlink()
        return running
