#!/usr/bin/env python3
"""The quickstart demo: three ironic-compute services share the nodes of a real Ironic.

    python3 tools/demo.py            # the whole demo (what it shows: README, quickstart)
    python3 tools/demo.py --keep     # leave everything running afterwards, to look around
    python3 tools/demo.py --stop     # stop what a --keep run left running

Step 1 needs only the standard library: it installs the project into ``<repo>/.demo/venv``
and runs this script again with that Python. The rest uses ``tools/ironic_standalone.py``
(Ironic, its nodes, processes) and ``tests/functional/daemons.py`` (the services, a sampler
of their database). Files: the state directory (``<repo>/.demo/state``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if sys.version_info < (3, 11):  # noqa: UP036 - a clear message on an older python3
    sys.exit(f"demo: error: needs Python 3.11 or later, this is {sys.version.split()[0]}: "
             "run it with python3.11 (or newer) tools/demo.py")

import ironic_standalone as standalone  # noqa: E402 - beside this script: sys.path[0]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV, DEFAULT_STATE_DIR = REPO_ROOT / ".demo" / "venv", REPO_ROOT / ".demo" / "state"
HOSTS, GROUPS = ("compute-1", "compute-2", "compute-3"), ("group-a", "group-b")
# Short intervals, so that a failover takes seconds (the defaults are 10, 60 and 60 s). A
# dead service's instances move once it has been silent for longer than TAKEOVER_GRACE:
# longer than service_down_time, so that its free nodes visibly move first.
REPORT_INTERVAL, SERVICE_DOWN_TIME, CYCLE, TAKEOVER_GRACE = 1, 6, 2, 8
FAILOVER_TIMEOUT = SERVICE_DOWN_TIME + 10 * CYCLE + 30.0
TAKEOVER_TIMEOUT = TAKEOVER_GRACE + 10 * CYCLE + 30.0
STABLE_FOR = 2 * CYCLE + 1.0  # a division is final when it has not changed for this long
NODE = {"resource_class": "baremetal",
        "properties": {"cpus": 16, "memory_mb": 65536, "local_gb": 480, "cpu_arch": "x86_64"}}
STEPS, VENV_MARKER, LAST_OUTPUT = 7, ".ironic-compute-demo.json", [time.monotonic()]
MIN_TIME = datetime.datetime.min
daemons = None  # tests.functional.daemons, imported once the project's virtualenv runs us


class DemoError(Exception):
    """A step failed: reported as one line (plus a log tail when there is one)."""


def say(text: str = "") -> None:
    print(text, flush=True)
    LAST_OUTPUT[0] = time.monotonic()


def step(number: int, title: str) -> None:
    say()
    say(f"[{number}/{STEPS}] {title}")


@contextlib.contextmanager
def busy(label: str):
    """A line every 10 s while a step prints nothing."""
    started, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(1.0):
            if time.monotonic() - LAST_OUTPUT[0] >= 10:
                say(f"  ... {label} ({time.monotonic() - started:.0f} s)")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def log_to(what: str):
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


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


def importable(python: Path) -> bool:
    script = python.parent / "ironic-compute-manage"
    try:
        return script.exists() and subprocess.run(
            [str(python), "-c", "import ironic_compute.cmd.manage, sqlalchemy"],
            capture_output=True, timeout=120, cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def ensure_project_venv(venv: Path) -> Path:
    """``venv`` with the project installed (editable); created or updated when needed."""
    python, marker = venv / "bin" / "python", venv / VENV_MARKER
    digest = hashlib.sha256(str(REPO_ROOT).encode())
    for name in ("requirements.txt", "setup.cfg", "pyproject.toml", "setup.py"):
        with contextlib.suppress(OSError):
            digest.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes())
    with standalone.venv_lock(venv):
        with contextlib.suppress(OSError, ValueError, KeyError):
            if (json.loads(marker.read_text())["fingerprint"] == digest.hexdigest()
                    and importable(python)):
                say(f"  reusing {rel(venv)} (delete it to start afresh)")
                return python
        started, env = time.monotonic(), dict(os.environ)
        env.pop("PYTHONPATH", None)
        if not (REPO_ROOT / ".git").exists():
            env.setdefault("PBR_VERSION", "0.0.0")  # pbr takes the version from git otherwise
        with busy("pip install"):
            standalone.pip_install(venv, ["-e", "."], log_to("ironic-compute"), sys.executable,
                                   " (1-2 minutes and ~300 MB the first time)",
                                   env=env, cwd=str(REPO_ROOT))
        if not importable(python):
            raise DemoError(f"pip install finished but {python} cannot import ironic_compute")
        marker.write_text(json.dumps({"fingerprint": digest.hexdigest(), "repo": str(REPO_ROOT),
                                      "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
        say(f"  project virtualenv ready in {time.monotonic() - started:.0f} s")
        return python


def stop_leftovers(state_dir: Path) -> list[str]:
    """Stop the services an earlier run (``--keep``, or a killed demo) left running."""
    stopped = []
    for pid_file in sorted((state_dir / "run").glob("compute-*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            config = str(state_dir / f"{pid_file.stem}.conf")  # not a reused pid
            if config in standalone.cmdline(pid) and standalone.terminate(pid):
                stopped.append(pid_file.stem)
        pid_file.unlink(missing_ok=True)
    return stopped


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.state_dir, self.total = args, args.state_dir, 2 * args.nodes
        self.db = self.state_dir / "ironic_compute.sqlite"
        self.services = {host: daemons.Daemon(host, str(self.state_dir), {
            "DEFAULT": {"host": host, "report_interval": REPORT_INTERVAL,
                        "service_down_time": SERVICE_DOWN_TIME,
                        "update_resources_interval": CYCLE,
                        "instance_takeover_grace": TAKEOVER_GRACE, "instance_poll_interval": 0.5,
                        "graceful_shutdown_timeout": 10, "state_path": self.state_dir,
                        "debug": args.debug},
            # The same file for all three (the default is one under each's state_path).
            "database": {"connection": f"sqlite:///{self.db}"},
            "ironic": {"auth_type": "none"}}) for host in HOSTS}  # no partition_key: all nodes
        for host, service in self.services.items():
            service.log_path = str(self.state_dir / "logs" / f"{host}.log")
        self.started: dict[str, float] = {}  # host -> when it was (last) started
        self.ironic = self.sampler = None
        self.group: dict[str, str] = {}  # node uuid -> conductor group
        self.names: dict[str, str] = {}  # node and instance uuids -> names
        self.summary: list[str] = []

    # ---------------------------------------------------------------- helpers
    def heartbeat(self, host: str) -> datetime.datetime:
        """``host``'s last heartbeat (naive UTC: its clock is ours, on the same machine)."""
        with self.sampler.engine.connect() as conn:
            seen = conn.execute(daemons.sa.text(
                "SELECT last_seen_up FROM services WHERE deleted = 0 AND host = :host"),
                {"host": host}).scalar()
        return datetime.datetime.fromisoformat(str(seen)) if seen else MIN_TIME

    def heartbeat_note(self, host: str, down: bool = False) -> str:
        age = (utcnow() - self.heartbeat(host)).total_seconds()
        return f"{host} last heartbeat {age:4.1f} s ago" + (
            " -> down" if down and age > SERVICE_DOWN_TIME else "")

    def cycled(self, *hosts: str, since: float | None = None, cycles: int = 1) -> bool:
        """Each of ``hosts`` ended ``cycles`` cycles since ``since`` (default: its start)."""
        return all(sum(1 for at, h, _s in self.sampler.cycles if h == host and at > (
            self.started[host] if since is None else since)) >= cycles for host in hosts)

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

    def start_service(self, host: str, tick=lambda: None) -> None:
        """Start one service and wait until it has registered in the database.

        Several services on one SQLite file: a service whose registration meets another
        one's write fails at once with "database is locked" and exits; start it again.
        """
        service, log = self.services[host], Path(self.services[host].log_path)
        for attempt in (1, 2, 3):
            since, self.started[host] = utcnow(), time.monotonic()
            deadline = time.monotonic() + 60
            service.process = standalone.spawn(
                [str(Path(sys.executable).parent / "ironic-compute"), "--config-file",
                 service.config_path], log, self.state_dir / "run" / f"{host}.pid",
                env=dict(os.environ, XDG_CACHE_HOME=str(self.state_dir / "cache")),
                die_with_parent=not self.args.keep)
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

    def manage(self, *args: str) -> str:
        for attempt in (1, 2, 3):  # SQLite refuses a writer that meets another one
            result = daemons.manage(self.services[HOSTS[0]].config_path, *args)
            if result.returncode == 0 or attempt == 3 or "locked" not in result.stderr:
                break
        if result.returncode != 0:
            raise DemoError(f"`ironic-compute-manage {' '.join(args)}` failed: "
                            + (result.stderr.strip() or result.stdout.strip()))
        return result.stdout.strip()

    def shown(self, *args: str) -> str:
        """An ``ironic-compute-manage`` command line, as a newcomer types it here."""
        return shlex.join([rel(Path(sys.executable).parent / "ironic-compute-manage"),
                           "--config-file", rel(self.services[HOSTS[0]].config_path), *args])

    def owners(self) -> dict[str, str | None]:
        """{node uuid: host} of every node in Ironic (None: no row yet)."""
        return dict(dict.fromkeys(self.group), **self.sampler.fresh_snapshot())

    def count_line(self, elapsed: float, owners: dict, note: str = "") -> str:
        held = [sum(1 for h in owners.values() if h == host) for host in HOSTS]
        parts = [f"{host} {n:>3}" for host, n in zip(HOSTS, held, strict=True)]
        if self.total - sum(held):
            parts.append(f"no owner {self.total - sum(held):>3}")
        return f"  {elapsed:5.1f} s   " + "   ".join(parts) + (f"   {note}" if note else "")

    def division_table(self, owners: dict) -> None:
        """Nodes per service (rows) and conductor group (columns)."""
        rows = [(h, [sum(1 for u, o in owners.items() if o == h and self.group[u] == g)
                     for g in GROUPS]) for h in (*HOSTS, *({None} & set(owners.values())))]
        rows.append(("total", [sum(r[1][i] for r in rows) for i in range(len(GROUPS))]))
        width = max(len(host or "(no owner)") for host, _cells in rows)
        say()
        say(f"    {'service':<{width}}" + "".join(f"{g:>10}" for g in GROUPS) + f"{'total':>8}")
        for host, cells in rows:
            say(f"    {host or '(no owner)':<{width}}" + "".join(f"{n:>10}" for n in cells)
                + f"{sum(cells):>8}")

    def instance_table(self, instances: dict, moved=(), victim: str = "") -> None:
        say()
        say(f"    {'instance':<10}{'host':<12}{'node':<20}state")
        for uuid, (host, node, state, _task) in sorted(
                instances.items(), key=lambda item: self.names.get(item[0], item[0])):
            say(f"    {self.names.get(uuid, uuid):<10}{host or '-':<12}"
                f"{self.names.get(node, node or '-'):<20}{state}"
                + (f"   (taken over from {victim})" if uuid in moved else ""))

    # ---------------------------------------------------------------- steps
    def start_ironic(self) -> None:
        self.ironic = standalone.IronicServer(
            venv=self.args.ironic_venv, state_dir=self.state_dir / "ironic", port=0,
            groups=",".join(GROUPS), max_limit=1000, debug=self.args.debug,  # one page: all
            die_with_parent=not self.args.keep, log=log_to("ironic"))
        with busy("starting Ironic" if self.ironic.is_installed() else "installing Ironic"):
            try:
                self.ironic.start()
            except standalone.IronicError as exc:
                if "crashed during start" not in str(exc):
                    raise DemoError(f"Ironic did not start: {exc}") from None
                say(f"  {str(exc).splitlines()[0]}: trying once more")
                self.ironic.start()

    def create_nodes(self) -> None:
        started = time.monotonic()
        bodies = [dict(NODE, conductor_group=group, name=f"{group}-node-{i:03d}")
                  for group in GROUPS for i in range(self.args.nodes)]
        with busy("creating nodes"):
            uuids = standalone.create_nodes(self.ironic.url, bodies)
        for uuid, body in zip(uuids, bodies, strict=True):
            self.group[uuid], self.names[uuid] = body["conductor_group"], body["name"]
        say(f"  created {len(uuids)} nodes in {time.monotonic() - started:.1f} s: "
            + ", ".join(f"{self.args.nodes} in {g}" for g in GROUPS)
            + " (state enroll: no capacity to offer, but every node gets an owner)")

    def settled(self, owners: dict, elapsed: float, last: dict, hosts=HOSTS, show=True) -> bool:
        """Every node held by one of the services, no change for STABLE_FOR seconds since
        each of ``hosts`` ended a cycle (``last``: the previous division and its time)."""
        if owners != last.get("owners"):
            last.update(owners=owners, since=elapsed)
            if show and any(owners.values()):
                say(self.count_line(elapsed, owners))
            return False
        return (all(h in HOSTS for h in owners.values()) and self.cycled(*hosts)
                and elapsed - last["since"] >= STABLE_FOR)

    def start_services(self) -> dict:
        for service in self.services.values():
            service.options["ironic"]["endpoint_override"] = self.ironic.url
            service.write_config()
        say(f"  config files {rel(self.state_dir)}/compute-{{1,2,3}}.conf (report_interval "
            f"{REPORT_INTERVAL} s, service_down_time {SERVICE_DOWN_TIME} s, "
            f"update_resources_interval {CYCLE} s)")
        say(f"  shared database {rel(self.db)}: {self.manage('db', 'sync')}")
        self.sampler = daemons.InstanceSampler(f"sqlite:///{self.db}", interval=0.2)
        self.sampler.start()
        say(f"  starting them one after the other (logs in {rel(self.state_dir / 'logs')}/); "
            "each takes its share of the nodes at its first cycle:")
        started, last = time.monotonic(), {}
        for host in HOSTS:
            self.start_service(host, lambda: self.settled(
                self.owners(), time.monotonic() - started, last, ()))
            say(f"  {time.monotonic() - started:5.1f} s   {host} started "
                f"(pid {self.services[host].process.pid})")
        owners, _ = self.poll(self.owners, lambda o, e: self.settled(o, e, last), None, 120,
                              "the three services to share the nodes", started)
        say(f"  settled ({len(owners)} nodes, each service ran a cycle, no change for "
            f"{STABLE_FOR:.0f} s); the division, nodes per service and conductor group:")
        self.division_table(owners)
        say()
        say("  a node of each service (uuid, name, the service that holds it):")
        shown = [min((u for u, h in owners.items() if h == host), key=self.names.get)
                 for host in HOSTS if host in owners.values()]
        for uuid in shown:
            say(f"    {uuid}  {self.names[uuid]:<18}{owners[uuid]}")
        say("  every node, its service and why it is there (the CLI reads the shared database):")
        say(f"    {self.shown('node', 'list')}")
        say("  one node: why it is there, and which service takes it over if that one dies:")
        say(f"    {self.shown('node', 'show', shown[0])}")
        return owners

    def failover(self, before: dict, victim: str) -> dict:
        mine = {u for u, h in before.items() if h == victim}
        say(f"  {victim} holds {plural(len(mine))}. Its peers see it down once its last "
            f"heartbeat is older than service_down_time ({SERVICE_DOWN_TIME} s), and take its "
            f"nodes at their next cycle (every {CYCLE} s).")
        self.services[victim].kill()
        say(f"  kill -9 {victim} (pid {self.services[victim].process.pid}); every second, the "
            "nodes each service holds:")
        after, elapsed = self.poll(
            self.owners, lambda o, _e: all(h in HOSTS and h != victim for h in o.values()),
            lambda o, e: self.count_line(e, o, f"{self.heartbeat_note(victim, True)}   moved "
                                               f"{sum(1 for u in mine if o[u] != victim)}"
                                               f"/{len(mine)}"),
            FAILOVER_TIMEOUT, f"the survivors to take {victim}'s nodes")
        gained = {h: n for h in HOSTS if (n := sum(1 for u in mine if after[u] == h))}
        others = sum(1 for u, h in before.items() if h != victim and after[u] != h)
        say(f"  failover done {elapsed:.1f} s after the kill: {victim}'s {plural(len(mine))} "
            "went to " + " and ".join(f"{h} ({n})" for h, n in gained.items())
            + f"; nodes of the survivors that moved: {others}")
        self.division_table(after)
        self.summary.append(
            f"  failover   kill -9 {victim}: its {plural(len(mine))} were on the survivors "
            f"{elapsed:.1f} s later (service_down_time {SERVICE_DOWN_TIME} s + at most one "
            f"{CYCLE} s cycle); {others} other node(s) moved")
        return after

    def rebalance(self, initial: dict, after_failover: dict, victim: str) -> None:
        started, last = time.monotonic(), {}
        self.start_service(victim)
        say(f"  started {victim} again (pid {self.services[victim].process.pid}); at its first "
            "cycle it takes its share back from the others:")
        # the same peers give the same ring, so the very same division; another one that
        # holds still after its first cycle is reported as it is
        final, elapsed = self.poll(
            self.owners, lambda o, e: o == initial or self.settled(o, e, last, [victim], False),
            lambda o, e: self.count_line(
                e, o, f"{victim} back with {sum(1 for h in o.values() if h == victim)}"),
            60, f"{victim} to take its share back", started)
        taken = sum(1 for u, h in final.items() if h == victim and after_failover[u] != victim)
        same = final == initial
        say(f"  rebalance done {elapsed:.1f} s after the restart: {victim} took {plural(taken)} "
            "back; " + ("the division is exactly the one before the kill (the same services "
                        "give the same ring)" if same else
                        "the division differs from the one before the kill"))
        self.summary.append(
            f"  rebalance  restart {victim}: it held {plural(taken)} again {elapsed:.1f} s later; "
            + ("same division as at the start" if same else
               "a different division than at the start"))

    def instances(self) -> None:
        count, owners = min(self.args.instances, self.total), self.sampler.fresh_snapshot()
        # a node of each service in turn, so that the builds can spread, then any
        held = {h: sorted(u for u, o in owners.items() if o == h) for h in HOSTS}
        chosen = [u for rank in range(count) for h in HOSTS for u in held[h][rank:rank + 1]]
        chosen = (chosen + [u for u in sorted(owners) if u not in chosen])[:count]
        started = time.monotonic()
        with busy("making nodes buildable"):
            standalone.make_buildable(self.ironic.url, chosen)
            # The scheduler reads the nodes' rows: wait for a cycle that saw them free.
            moment = time.monotonic()
            daemons.wait_until(lambda: self.cycled(*HOSTS, since=moment, cycles=2), 60, 0.2,
                               "the services to see the nodes available")
        say(f"  {plural(len(chosen))} made buildable in {time.monotonic() - started:.1f} s "
            "(manage, provide, power off) among those each service holds; the services list "
            "them as free at their next cycle")
        say(f"  {count} x `ironic-compute-manage instance create --name demo-N --resource-class "
            "baremetal`, all at once and without --host: each goes to the live service with the "
            "fewest instances, which reserves a node through Ironic's allocation API and "
            "deploys it:")
        with ThreadPoolExecutor(count) as pool:
            for made in pool.map(lambda i: json.loads(self.manage(
                    "instance", "create", "--name", f"demo-{i}", "--resource-class",
                    "baremetal", "--format", "json")), range(1, count + 1)):
                self.names[made["uuid"]] = made["name"]

        def states(sample: dict, elapsed: float) -> str:
            found = [state for _h, _n, state, _t in sample.values()]
            return f"  {elapsed:5.1f} s   " + "   ".join(
                f"{state} {found.count(state)}" for state in sorted(set(found)))

        built, elapsed = self.poll(self.sampler.instances, lambda sample, _e: len(sample) == count
                                   and all(i[2] in ("active", "error") for i in sample.values()),
                                   states, 120, "the instances to be built")
        active = sum(1 for i in built.values() if i[2] == "active")
        say(f"  {active} of {count} active {elapsed:.1f} s after the requests:")
        self.instance_table(built)
        if active < count:
            raise DemoError(f"{count - active} instance(s) in error; "
                            f"`{self.shown('instance', 'list')}` says why")

        on_host = {h: sum(1 for i in built.values() if i[0] == h) for h in HOSTS}
        victim = max(HOSTS, key=on_host.get)
        mine = {u for u, i in built.items() if i[0] == victim}
        say()
        say(f"  {victim} manages {plural(len(mine), 'instance')}. Once it is down (silent for "
            f"{SERVICE_DOWN_TIME} s) its free nodes move; its instances move, with their "
            "nodes, once it has been silent for longer than instance_takeover_grace "
            f"({TAKEOVER_GRACE} s), at a live service's next cycle.")
        self.services[victim].kill()
        say(f"  kill -9 {victim} (pid {self.services[victim].process.pid}); every second, the "
            "instances each service manages:")
        after, elapsed = self.poll(
            self.sampler.instances, lambda sample, _e: all(
                u in sample and sample[u][0] not in (victim, None) and sample[u][2] == "active"
                for u in mine),
            lambda sample, e: f"  {e:5.1f} s   " + "   ".join(
                f"{h} {sum(1 for i in sample.values() if i[0] == h)}" for h in HOSTS)
            + f"   {self.heartbeat_note(victim)}   moved "
            f"{sum(1 for u in mine if sample[u][0] != victim)}/{len(mine)}",
            TAKEOVER_TIMEOUT, f"the live services to take {victim}'s instances")
        gained = {h: n for h in HOSTS if (n := sum(1 for u in mine if after[u][0] == h))}
        same_nodes = all(after[u][1] == built[u][1] for u in mine)
        say(f"  takeover done {elapsed:.1f} s after the kill: {victim}'s "
            f"{plural(len(mine), 'instance')} went to "
            + " and ".join(f"{h} ({n})" for h, n in gained.items())
            + ("; still active, on the same nodes" if same_nodes else "") + ":")
        self.instance_table(after, mine, victim)
        self.summary.append(
            f"  instances  {count} built at once, spread " + "/".join(map(str, on_host.values()))
            + f"; kill -9 {victim}: its {plural(len(mine), 'instance')} were on live services "
            f"{elapsed:.1f} s later (instance_takeover_grace {TAKEOVER_GRACE} s)")

    # ---------------------------------------------------------------- run
    def run(self) -> None:
        step(2, f"A standalone Ironic (own virtualenv {rel(self.args.ironic_venv)}), "
             f"conductor groups {' and '.join(GROUPS)}")
        leftovers = stop_leftovers(self.state_dir)
        if leftovers:
            say(f"  stopped {', '.join(leftovers)} left running by an earlier run")
        for old in [*self.state_dir.glob("ironic_compute.sqlite*"),
                    *self.state_dir.glob("logs/*.log")]:
            old.unlink()
        self.start_ironic()
        step(3, f"{self.total} fake nodes: {self.args.nodes} in each group")
        self.create_nodes()
        step(4, "Three ironic-compute services on one SQLite database, sharing every node")
        initial = self.start_services()
        held = {h: sum(1 for o in initial.values() if o == h) for h in HOSTS}
        victim = max(HOSTS, key=lambda h: (held[h], h == "compute-2"))
        step(5, f"Failover: kill -9 {victim}")
        after = self.failover(initial, victim)
        step(6, f"Rebalance: restart {victim}")
        self.rebalance(initial, after, victim)
        if self.args.instances:
            step(7, "Instances: build a few, kill -9 a service that has some, watch the takeover")
            self.instances()
        found = self.sampler.violations()  # what must never happen, whatever the timing
        self.summary.append(
            f"  checks     {self.sampler.samples} reads of the database, one every 0.2 s: "
            + (f"FAILED: {found}" if found else "no node lost its row or had two, no instance "
               "was lost, doubled, homeless or sharing a node"))
        say()
        say(f"Summary: {len(HOSTS)} services, {self.total} nodes in {len(GROUPS)} conductor "
            "groups, one SQLite database")
        for text in self.summary:
            say(text)
        if found:
            raise DemoError(f"the database broke a rule: {found}")

    def cleanup(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        running = [h for h, s in self.services.items() if s.alive]
        say()
        if self.args.keep:
            say("Left running (--keep):")
            if self.ironic is not None:
                say(f"  Ironic     {self.ironic.url}")
            if running:
                say("  services   " + ", ".join(f"{h} (pid {self.services[h].process.pid})"
                                                for h in running)
                    + f", logs in {rel(self.state_dir / 'logs')}/")
                for i, what in enumerate(("node list", "service list", "ring show",
                                          "instance list")):
                    say(f"  {'look:' if i == 0 else '':<10} {self.shown(*what.split())}")
            stop = ["python3", "tools/demo.py", "--stop"] + (
                [] if self.state_dir == DEFAULT_STATE_DIR else ["--state-dir", rel(self.state_dir)])
            say(f"  stop all:  {shlex.join(stop)}")
            return
        say("Stopping what the demo started")
        for host in running:
            self.services[host].stop(15)  # SIGTERM: it tells its peers it left
        for pid_file in (self.state_dir / "run").glob("compute-*.pid"):
            pid_file.unlink()
        if running:
            say(f"  stopped {', '.join(running)}")
        if self.ironic is not None:
            self.ironic.stop(quiet=True)
            say("  stopped Ironic")


def build_parser() -> argparse.ArgumentParser:
    def bounded(low: int, high: int):
        def parse(value: str) -> int:
            if not low <= int(value) <= high:
                raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
            return int(value)
        return parse

    def path(value: str) -> Path:
        return Path(value).absolute()

    parser = argparse.ArgumentParser(
        prog="tools/demo.py",
        description="Quickstart demo: a real standalone Ironic, three ironic-compute services "
                    "sharing its nodes on one SQLite database, a failover, a rebalance, "
                    "instances and their takeover. Stops everything it started when it ends.")
    parser.add_argument("--nodes", type=bounded(1, 500), default=20,
                        help="fake nodes per conductor group (two groups) [default %(default)s]")
    parser.add_argument("--instances", type=bounded(0, 30), default=6, help="instances to "
                        "build in the last step (0: skip it) [default %(default)s]")
    parser.add_argument("--keep", action="store_true", help="leave Ironic and the services "
                        "running at the end (stop them with --stop)")
    parser.add_argument("--stop", action="store_true",
                        help="stop what an earlier --keep run left running, and exit")
    parser.add_argument("--state-dir", type=path, default=DEFAULT_STATE_DIR, help="configs, "
                        f"SQLite database, logs, Ironic's state [default {rel(DEFAULT_STATE_DIR)}]")
    parser.add_argument("--ironic-venv", type=path, default=path(
        os.environ.get("IRONIC_VENV") or REPO_ROOT / ".ironic" / "venv"),
        help="Ironic's own virtualenv, created when missing [$IRONIC_VENV, default .ironic/venv]")
    parser.add_argument("--python", help="an interpreter that already has ironic-compute "
                        "installed (e.g. a dev virtualenv's python): skips creating .demo/venv")
    parser.add_argument("--debug", action="store_true",
                        help="tracebacks on errors; debug logging in the services and Ironic")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    return parser


def outer(args: argparse.Namespace, argv: list[str]) -> int:
    """Step 1 with any Python: the project's virtualenv; then run again with its Python."""
    say("ironic-compute demo: three services share the nodes of a real Ironic")
    step(1, "The project's own virtualenv")
    if args.python:
        python = Path(args.python)
        if not importable(python):
            raise DemoError(f"{args.python} cannot import ironic_compute: install the project "
                            f"into it (pip install -e {rel(REPO_ROOT)}) or drop --python")
        say(f"  using {args.python} (--python)")
    else:
        python = ensure_project_venv(DEFAULT_VENV)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), "--inside", *argv])


def stop_everything(state_dir: Path) -> int:
    """``--stop``: what a ``--keep`` run left running in ``state_dir``."""
    stopped = stop_leftovers(state_dir) + [f"Ironic {name}" for name in standalone.IronicServer(
        state_dir=state_dir / "ironic", log=None).stop(quiet=True)]
    say(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def _raise_interrupt(signo, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signo).name)


def main(argv: list[str] | None = None) -> int:
    global daemons
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    for signo in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signo, _raise_interrupt)
    try:
        if args.stop:
            return stop_everything(args.state_dir)
        if not args.inside:
            return outer(args, argv)
        sys.path.insert(0, str(REPO_ROOT))
        from tests.functional import daemons
        demo = Demo(args)
        try:
            demo.run()
        finally:  # stopping must not be cut short by a second Ctrl-C (it takes a few seconds)
            for signo in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signo, signal.SIG_IGN)
            try:
                demo.cleanup()
            except Exception as exc:  # noqa: BLE001 - keep the first error
                print(f"demo: warning: stopping failed: {exc}", file=sys.stderr)
        say("Done.")
        return 0
    except KeyboardInterrupt:
        left = "left running (--keep)" if args.keep else "stopped"
        print(f"demo: interrupted; what the demo started is {left}", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line unless --debug
        if args.debug:
            traceback.print_exc()
        where = traceback.extract_tb(exc.__traceback__)[-1]
        known = isinstance(exc, (DemoError, standalone.IronicError, AssertionError))
        print(f"demo: error: {exc}" if known else
              f"demo: error: {type(exc).__name__}: {exc} (at {Path(where.filename).name}:"
              f"{where.lineno}; --debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
