#!/usr/bin/env python3
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

"""The quickstart demo: three ironic-compute services share the nodes of a real Ironic.

    python3 tools/demo.py            # the whole demo (what it shows: README, quickstart)
    python3 tools/demo.py --keep     # leave everything running afterwards, to look around
    python3 tools/demo.py --stop     # stop what a --keep run left running

Step 1 needs only the standard library (``tools/demo_console.py``): it installs the project
into ``<repo>/.demo/venv`` and runs this script again with that Python. The steps are written
here; how they are done is in ``tools/fleet.py`` (the services on one database) and the
project's ``ironic_compute.harness`` (Ironic, its nodes, the services' processes). Files: the
state directory (``<repo>/.demo/state``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

if sys.version_info < (3, 11):  # noqa: UP036 - a clear message on an older python3
    sys.exit(f"demo: error: needs Python 3.11 or later, this is {sys.version.split()[0]}: "
             "run it with python3.11 (or newer) tools/demo.py")

import demo_console as console  # noqa: E402 - beside this script: sys.path[0]
from demo_console import DemoError  # noqa: E402
from demo_console import busy  # noqa: E402
from demo_console import plural  # noqa: E402
from demo_console import rel  # noqa: E402
from demo_console import say  # noqa: E402

try:  # the project: after step 1, which runs this script again in its virtualenv
    import fleet

    from ironic_compute.harness import ironic as standalone
except ImportError:
    fleet = standalone = None

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV, DEFAULT_STATE_DIR = REPO_ROOT / ".demo" / "venv", REPO_ROOT / ".demo" / "state"
HOSTS, GROUPS = ("compute-1", "compute-2", "compute-3"), ("group-a", "group-b")
# Short intervals, so that a failover takes seconds (the defaults are 10, 60 and 60 s). A
# dead service's instances move once it has been silent for longer than service_down_time
# + TAKEOVER_GRACE, well after its free nodes.
REPORT_INTERVAL, SERVICE_DOWN_TIME, CYCLE, TAKEOVER_GRACE = 1, 6, 2, 8
FAILOVER_TIMEOUT = SERVICE_DOWN_TIME + 10 * CYCLE + 30.0
TAKEOVER_TIMEOUT = SERVICE_DOWN_TIME + TAKEOVER_GRACE + 10 * CYCLE + 30.0
RESOURCE_CLASS = "baremetal"
STEPS = 7


def step(number: int, title: str) -> None:
    say()
    say(f"[{number}/{STEPS}] {title}")


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.state_dir, self.total = args, args.state_dir, 2 * args.nodes
        self.fleet = fleet.Fleet(self.state_dir, HOSTS, {
            "DEFAULT": {"report_interval": REPORT_INTERVAL,
                        "service_down_time": SERVICE_DOWN_TIME,
                        "update_resources_interval": CYCLE,
                        "instance_takeover_grace": TAKEOVER_GRACE, "instance_poll_interval": 0.5,
                        "graceful_shutdown_timeout": 10, "state_path": self.state_dir,
                        "debug": args.debug},
            "ironic": {"auth_type": "none"}}, keep=args.keep)  # no partition_key: all nodes
        self.ironic = self.client = None
        self.group: dict[str, str] = {}  # node uuid -> conductor group
        self.names: dict[str, str] = {}  # node and instance uuids -> names
        self.summary: list[str] = []

    def owners(self) -> dict[str, str | None]:
        """{node uuid: host} of every node in Ironic (None: no row yet)."""
        return dict(dict.fromkeys(self.group), **self.fleet.sampler.fresh_snapshot())

    # ---------------------------------------------------------------- steps
    def start_ironic(self) -> None:
        self.ironic = standalone.IronicServer(
            venv=self.args.ironic_venv, state_dir=self.state_dir / "ironic", port=0,
            groups=",".join(GROUPS), max_limit=1000, debug=self.args.debug,  # one page: all
            die_with_parent=not self.args.keep, log=console.progress_log("ironic"))
        with busy("starting Ironic" if self.ironic.is_installed() else "installing Ironic"):
            try:
                self.ironic.start()
            except standalone.IronicError as exc:
                if "crashed during start" not in str(exc):
                    raise DemoError(f"Ironic did not start: {exc}") from None
                say(f"  {str(exc).splitlines()[0]}: trying once more")
                self.ironic.start()
        self.client = standalone.make_client(self.ironic.url)

    def create_nodes(self) -> None:
        started = time.monotonic()
        with busy("creating nodes"):
            for group in GROUPS:
                uuids = standalone.create_nodes(
                    self.client, self.args.nodes, group, name_prefix=f"{group}-node",
                    resource_class=RESOURCE_CLASS)
                for i, uuid in enumerate(uuids):
                    self.group[uuid], self.names[uuid] = group, f"{group}-node-{i:04d}"
        say(f"  created {len(self.group)} nodes in {time.monotonic() - started:.1f} s: "
            + ", ".join(f"{self.args.nodes} in {g}" for g in GROUPS)
            + " (state enroll: no capacity to offer, but every node gets an owner)")

    def start_services(self) -> dict:
        self.fleet.write_configs(ironic={"endpoint_override": self.ironic.url})
        say(f"  config files {rel(self.state_dir)}/compute-{{1,2,3}}.conf (report_interval "
            f"{REPORT_INTERVAL} s, service_down_time {SERVICE_DOWN_TIME} s, "
            f"update_resources_interval {CYCLE} s)")
        say(f"  shared database {rel(self.fleet.db)}: {self.fleet.cli('db', 'sync')}")
        self.fleet.start_sampler()
        say(f"  starting them one after the other (logs in {rel(self.state_dir / 'logs')}/); "
            "each takes its share of the nodes at its first cycle:")
        started, last = time.monotonic(), {}
        self.fleet.start_services(started, lambda: self.fleet.settled(
            self.owners(), time.monotonic() - started, last, ()))
        owners, _ = self.fleet.poll(self.owners, lambda o, e: self.fleet.settled(o, e, last),
                                    None, 120, "the three services to share the nodes", started)
        say(f"  settled ({len(owners)} nodes, each service ran a cycle, no change for "
            f"{self.fleet.stable_for:.0f} s); the division, nodes per service and conductor "
            "group:")
        self.fleet.division_table(owners, self.group, GROUPS)
        say()
        say("  a node of each service (uuid, name, the service that holds it):")
        shown = [min((u for u, h in owners.items() if h == host), key=self.names.get)
                 for host in HOSTS if host in owners.values()]
        for uuid in shown:
            say(f"    {uuid}  {self.names[uuid]:<18}{owners[uuid]}")
        say("  every node, its service and why it is there (the CLI reads the shared database):")
        say(f"    {self.fleet.shown('node', 'list')}")
        say("  one node: why it is there, and which service takes it over if that one dies:")
        say(f"    {self.fleet.shown('node', 'show', shown[0])}")
        return owners

    def failover(self, before: dict, victim: str) -> dict:
        mine = {u for u, h in before.items() if h == victim}
        say(f"  {victim} holds {plural(len(mine))}. Its peers see it down once its last "
            f"heartbeat is older than service_down_time ({SERVICE_DOWN_TIME} s), and take its "
            f"nodes at their next cycle (every {CYCLE} s).")
        say(f"  kill -9 {victim} (pid {self.fleet.kill(victim)}); every second, the "
            "nodes each service holds:")
        after, elapsed = self.fleet.poll(
            self.owners, lambda o, _e: all(h in HOSTS and h != victim for h in o.values()),
            lambda o, e: self.fleet.count_line(
                e, o, f"{self.fleet.heartbeat_note(victim, True)}   moved "
                      f"{sum(1 for u in mine if o[u] != victim)}/{len(mine)}"),
            FAILOVER_TIMEOUT, f"the survivors to take {victim}'s nodes")
        others = sum(1 for u, h in before.items() if h != victim and after[u] != h)
        say(f"  failover done {elapsed:.1f} s after the kill: {victim}'s {plural(len(mine))} "
            f"went to {self.fleet.went_to([after[u] for u in mine])}; nodes of the survivors "
            f"that moved: {others}")
        self.fleet.division_table(after, self.group, GROUPS)
        self.summary.append(
            f"  failover   kill -9 {victim}: its {plural(len(mine))} were on the survivors "
            f"{elapsed:.1f} s later (service_down_time {SERVICE_DOWN_TIME} s + at most one "
            f"{CYCLE} s cycle); {others} other node(s) moved")
        return after

    def rebalance(self, initial: dict, after_failover: dict, victim: str) -> None:
        started, last = time.monotonic(), {}
        self.fleet.start_service(victim)
        say(f"  started {victim} again (pid {self.fleet.daemons[victim].process.pid}); at its "
            "first cycle it takes its share back from the others:")
        # the same peers give the same ring, so the very same division; another one that
        # holds still after its first cycle is reported as it is
        final, elapsed = self.fleet.poll(
            self.owners,
            lambda o, e: o == initial or self.fleet.settled(o, e, last, [victim], False),
            lambda o, e: self.fleet.count_line(
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
        InstanceSteps(self.fleet, self.client, self.names, self.summary).run(
            min(self.args.instances, self.total))

    # ---------------------------------------------------------------- run
    def run(self) -> None:
        step(2, f"A standalone Ironic (own virtualenv {rel(self.args.ironic_venv)}), "
             f"conductor groups {' and '.join(GROUPS)}")
        leftovers = fleet.stop_leftovers(self.state_dir)
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
            step(7, "Instances: build a few, kill -9 a service that has some, watch the takeover, "
                 "reboot one it had")
            self.instances()
        found = self.fleet.sampler.violations()  # what must never happen, whatever the timing
        self.summary.append(
            f"  checks     {self.fleet.sampler.samples} reads of the database, one every 0.2 s: "
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
        self.fleet.close_sampler()
        running = self.fleet.running()
        say()
        if self.args.keep:
            say("Left running (--keep):")
            if self.ironic is not None:
                say(f"  Ironic     {self.ironic.url}")
            if running:
                self.fleet.describe_running(running)
            stop = ["python3", "tools/demo.py", "--stop"] + (
                [] if self.state_dir == DEFAULT_STATE_DIR else ["--state-dir", rel(self.state_dir)])
            say(f"  stop all:  {shlex.join(stop)}")
            return
        say("Stopping what the demo started")
        stopped = self.fleet.stop()
        if stopped:
            say(f"  stopped {', '.join(stopped)}")
        if self.ironic is not None:
            self.ironic.stop(quiet=True)
            say("  stopped Ironic")


class InstanceSteps:
    """Step 7: instances built, taken over after a kill -9, and one rebooted by its
    successor. ``names`` and ``summary`` are the demo's, added to here."""

    def __init__(self, fleet_, client, names: dict[str, str], summary: list[str]) -> None:
        self.fleet, self.client, self.names, self.summary = fleet_, client, names, summary

    def run(self, count: int) -> None:
        """Build ``count`` instances at once, kill -9 the service that has the most, wait
        for the takeover, then reboot one it had; DemoError when one of them goes wrong."""
        chosen = self.fleet.spread(self.fleet.sampler.fresh_snapshot(), count)
        started = time.monotonic()
        with busy("making nodes buildable"):
            standalone.make_buildable(self.client, chosen)
            # The scheduler reads the nodes' rows: wait for a cycle that saw them free.
            self.fleet.wait_cycles(2, "the services to see the nodes available")
        say(f"  {plural(len(chosen))} made buildable in {time.monotonic() - started:.1f} s "
            "(manage, provide, power off) among those each service holds; the services list "
            "them as free at their next cycle")
        say(f"  {count} x `ironic-compute-manage instance create --name demo-N --resource-class "
            "baremetal`, all at once and without --host: each goes to the live service with the "
            "fewest instances, which reserves a node through Ironic's allocation API and "
            "deploys it:")
        self.names.update(self.fleet.create_instances(count, RESOURCE_CLASS))

        def states(sample: dict, elapsed: float) -> str:
            found = [state for _h, _n, state, _t in sample.values()]
            return f"  {elapsed:5.1f} s   " + "   ".join(
                f"{state} {found.count(state)}" for state in sorted(set(found)))

        built, elapsed = self.fleet.poll(
            self.fleet.sampler.instances, lambda sample, _e: len(sample) == count
            and all(i[2] in ("active", "error") for i in sample.values()),
            states, 120, "the instances to be built")
        active = sum(1 for i in built.values() if i[2] == "active")
        say(f"  {active} of {count} active {elapsed:.1f} s after the requests:")
        console.instance_table(built, self.names)
        if active < count:
            raise DemoError(f"{count - active} instance(s) in error; "
                            f"`{self.fleet.shown('instance', 'list')}` says why")

        on_host = {h: sum(1 for i in built.values() if i[0] == h) for h in HOSTS}
        victim = max(HOSTS, key=on_host.get)
        mine = {u for u, i in built.items() if i[0] == victim}
        say()
        say(f"  {victim} manages {plural(len(mine), 'instance')}. Once it is down (silent for "
            f"{SERVICE_DOWN_TIME} s) its free nodes move; its instances move, with their "
            "nodes, once it has been silent for longer than service_down_time + "
            f"instance_takeover_grace ({SERVICE_DOWN_TIME} + {TAKEOVER_GRACE} s), at a live "
            "service's next cycle.")
        say(f"  kill -9 {victim} (pid {self.fleet.kill(victim)}); every second, the "
            "instances each service manages:")
        after, elapsed = self.fleet.poll(
            self.fleet.sampler.instances, lambda sample, _e: all(
                u in sample and sample[u][0] not in (victim, None) and sample[u][2] == "active"
                for u in mine),
            lambda sample, e: f"  {e:5.1f} s   " + "   ".join(
                f"{h} {sum(1 for i in sample.values() if i[0] == h)}" for h in HOSTS)
            + f"   {self.fleet.heartbeat_note(victim)}   moved "
            f"{sum(1 for u in mine if sample[u][0] != victim)}/{len(mine)}",
            TAKEOVER_TIMEOUT, f"the live services to take {victim}'s instances")
        same_nodes = all(after[u][1] == built[u][1] for u in mine)
        say(f"  takeover done {elapsed:.1f} s after the kill: {victim}'s "
            f"{plural(len(mine), 'instance')} went to "
            + self.fleet.went_to([after[u][0] for u in mine])
            + ("; still active, on the same nodes" if same_nodes else "") + ":")
        console.instance_table(after, self.names, mine, victim)
        self.summary.append(
            f"  instances  {count} built at once, spread " + "/".join(map(str, on_host.values()))
            + f"; kill -9 {victim}: its {plural(len(mine), 'instance')} were on live services "
            f"{elapsed:.1f} s later (service_down_time + instance_takeover_grace "
            f"{SERVICE_DOWN_TIME} + {TAKEOVER_GRACE} s)")
        chosen = min(mine, key=self.names.get)
        self.reboot(chosen, after[chosen][1], victim)

    def reboot(self, uuid: str, node: str, victim: str) -> None:
        """Reboot an instance a live service took over from ``victim``: its successor
        carries the reboot out, as it would any action asked for the instance."""
        name = self.names[uuid]
        say()
        say(f"  {name} was {victim}'s. `ironic-compute-manage instance reboot {uuid}` records "
            "the reboot on the instance; the service that manages it now carries it out "
            "(soft, falling back to hard), once:")
        asked = json.loads(self.fleet.cli("instance", "reboot", uuid, "--format", "json"))
        host = asked["host"]
        say(f"  asked: {name} on {host}, task {asked['task_state']}; every second, its state:")
        sample, elapsed = self.fleet.poll(
            self.fleet.sampler.instances, lambda sample, _e: sample[uuid][3] is None,
            lambda sample, e: f"  {e:5.1f} s   {name} on {sample[uuid][0]}: "
                              f"{sample[uuid][2]}, task {sample[uuid][3] or '-'}",
            60, f"{host} to reboot {name}")
        shown = json.loads(self.fleet.cli("instance", "show", uuid, "--format", "json"))
        done_by = [h for h, service in self.fleet.daemons.items()
                   if service.count_in_log(f"Instance {uuid}: rebooting done")]
        if shown["fault"] or done_by != [host] or shown["node"] != node:
            raise DemoError(f"the reboot of {name} did not end as it should: fault "
                            f"{shown['fault']!r}, logged done by {done_by or 'no service'}, "
                            f"node {shown['node']}")
        say(f"  reboot done {elapsed:.1f} s after the request, by {host} (its log: \"Instance "
            f"{uuid}: rebooting done, active\"): {name} {shown['vm_state']}, power "
            f"{shown['power_state']}, on the same node")
        say(f"    {self.fleet.shown('instance', 'show', uuid)}")
        self.summary.append(
            f"  actions    instance reboot of {name} (taken over from {victim}): done by "
            f"{host}, its successor, {elapsed:.1f} s after the request")


def build_parser() -> argparse.ArgumentParser:
    def path(value: str) -> Path:
        return Path(value).absolute()

    parser = argparse.ArgumentParser(
        prog="tools/demo.py",
        description="Quickstart demo: a real standalone Ironic, three ironic-compute services "
                    "sharing its nodes on one SQLite database, a failover, a rebalance, "
                    "instances, their takeover and a reboot by the successor. Stops everything "
                    "it started when it ends.")
    parser.add_argument("--nodes", type=console.bounded(1, 500), default=20,
                        help="fake nodes per conductor group (two groups) [default %(default)s]")
    parser.add_argument("--instances", type=console.bounded(0, 30), default=6, help="instances to "
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
    if not args.stop:
        say("ironic-compute demo: three services share the nodes of a real Ironic")
        step(1, "The project's own virtualenv")
    if args.python:
        python = Path(args.python)
        if not console.importable(python):
            raise DemoError(f"{args.python} cannot import ironic_compute: install the project "
                            f"into it (pip install -e {rel(REPO_ROOT)}) or drop --python")
        say(f"  using {args.python} (--python)")
    else:
        python = console.project_venv(DEFAULT_VENV, REPO_ROOT)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), "--inside", *argv])


def _raise_interrupt(signo, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signo).name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    for signo in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signo, _raise_interrupt)
    try:
        if args.stop and not console.leftovers(args.state_dir):
            say("nothing was running")
            return 0
        if not args.inside:
            return outer(args, argv)
        if args.stop:
            stopped = fleet.stop_all(args.state_dir)
            say(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
            return 0
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
        expected = () if standalone is None else (standalone.IronicError,)
        print(f"demo: error: {console.error_line(exc, expected)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
