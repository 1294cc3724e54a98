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

"""The quickstart demo, ``python3 tools/demo.py``, end to end as a user runs it.

It runs as a subprocess, as the README says, with a small node count and its own state
directory. Without ``--python`` the demo installs the project into ``<repo>/.demo/venv``
itself: on a fresh clone (CI) that is the path a new user takes; a checkout that ran the
demo before reuses it. Its Ironic listens on a free port, next to the one of the session
fixture.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = REPO_ROOT / "tools" / "demo.py"
NODES = 5  # per conductor group
HOSTS = ("compute-1", "compute-2", "compute-3")
INSTANCES = 6  # the demo's default
SERVICE_DOWN_TIME = 6  # service_down_time in the demo's service config
TAKEOVER_GRACE = 8  # instance_takeover_grace in the demo's service config
REPORT_INTERVAL = 1


def processes_under(marker):
    """Pids of live processes whose command line mentions ``marker`` (a state dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, UnicodeDecodeError):
            continue
        if marker in cmdline and state not in ("Z", "X"):
            found.append((int(entry.name), cmdline))
    return found


def kill_all(found):
    for pid, _cmd in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_demo(*args, timeout=240):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(DEMO), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def test_demo_divides_fails_over_rebalances_builds_takes_over_reboots_and_cleans_up(tmp_path):
    state_dir = tmp_path / "demo-state"
    started = time.monotonic()
    try:
        result = run_demo("--nodes", str(NODES), "--state-dir", str(state_dir),
                          timeout=600)
    finally:
        time.sleep(0.5)  # a process reaped at the very end of the demo leaves /proc
        leftovers = processes_under(str(state_dir))
        kill_all(leftovers)
    elapsed = time.monotonic() - started
    out = result.stdout
    report = (f"exit {result.returncode} after {elapsed:.0f} s\n{out}\n"
              f"--- stderr ---\n{result.stderr}")
    assert result.returncode == 0, report
    assert not leftovers, f"left running: {leftovers}\n{report}"
    assert "Traceback" not in out + result.stderr, report

    # The division: a table of service x group, every node owned.
    table = re.search(r"service\s+group-a\s+group-b\s+total\n((?:.*\n){4})", out)
    assert table, report
    rows = {line.split()[0]: [int(n) for n in line.split()[1:]]
            for line in table.group(1).splitlines()}
    assert set(rows) == {*HOSTS, "total"}, report
    assert rows["total"] == [NODES, NODES, 2 * NODES], report
    assert sum(rows[h][2] for h in HOSTS) == 2 * NODES, report

    # A node of each service that holds some, and the CLI commands that show them, with the
    # config file the demo wrote: they work as printed (the database stays in the state dir).
    cli = re.search(r"a node of each service \(uuid, name, the service that holds it\):\n"
                    r"((?:    [0-9a-f-]{36}  \S+ +compute-\d\n)+).*\n"
                    r"    (\S+ --config-file (\S+) node list)\n.*\n"
                    r"    \S+ --config-file \S+ node show ([0-9a-f-]{36})\n", out)
    assert cli, report
    shown = {uuid: (name, host) for uuid, name, host in (
        line.split() for line in cli.group(1).splitlines())}
    holders = [h for h in HOSTS if rows[h][2]]
    assert sorted(host for _n, host in shown.values()) == holders, report
    assert Path(cli.group(3)).resolve() == (state_dir / "compute-1.conf").resolve(), report
    assert cli.group(4) in shown, report
    listed = subprocess.run([*shlex.split(cli.group(2)), "--format", "json"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, f"{listed.stderr}\n{report}"
    nodes = {n["uuid"]: n for n in json.loads(listed.stdout)}
    assert len(nodes) == 2 * NODES, listed.stdout
    for uuid, (name, _host) in shown.items():
        assert nodes[uuid]["name"] == name, listed.stdout

    # The failover: a line per second while the victim is down, then all its nodes moved.
    failover = re.search(r"failover done ([\d.]+) s after the kill: (compute-\d)'s (\d+) "
                         r"nodes? went to .*nodes of the survivors that moved: (\d+)", out)
    assert failover, report
    # Bounded loads ([hash_ring]load_factor) place the survivors' overflow
    # anew when the bound changes: none in half of 2000 simulated 10-node
    # clusters, never more than 3 (doc/ring-benchmark.md).
    assert int(failover.group(4)) <= 3, report
    victim, moved = failover.group(2), int(failover.group(3))
    assert moved == rows[victim][2] == max(rows[h][2] for h in HOSTS) > 0, report
    assert float(failover.group(1)) >= 5, report  # not before service_down_time (6 s)
    assert len(re.findall(rf"{victim} last heartbeat", out)) >= 5, report

    # The rebalance: the restarted service takes its own nodes back.
    assert re.search(rf"rebalance done [\d.]+ s after the restart: {victim} took {moved} nodes? "
                     r"back; the division is exactly the one before the kill", out), report

    # The instances: all active, spread over the three services, then those of a killed
    # service taken over by the live ones, on the same nodes.
    built = re.search(rf"{INSTANCES} of {INSTANCES} active [\d.]+ s after the requests:\n\n"
                      r"    instance +host +node +state\n((?:    demo-.*\n)+)", out)
    assert built, report
    before = instance_rows(built.group(1))
    assert len(before) == INSTANCES, report
    assert all(state == "active" for _h, _n, state, _m in before.values()), report
    per_host = [sum(1 for h, *_ in before.values() if h == host) for host in HOSTS]
    assert max(per_host) - min(per_host) <= 1, report
    assert len({node for _h, node, _s, _m in before.values()}) == INSTANCES, report
    takeover = re.search(r"takeover done ([\d.]+) s after the kill: (compute-\d)'s (\d+) "
                         r"instances? went to .*; still active, on the same nodes:\n\n"
                         r"    instance +host +node +state\n((?:    demo-.*\n)+)", out)
    assert takeover, report
    dead, moved = takeover.group(2), int(takeover.group(3))
    theirs = {name for name, (host, *_rest) in before.items() if host == dead}
    assert moved == len(theirs) == max(per_host) > 0, report
    # not before service_down_time + the grace: the kill came at most one
    # heartbeat after the last one
    assert float(takeover.group(1)) >= (SERVICE_DOWN_TIME + TAKEOVER_GRACE
                                        - REPORT_INTERVAL - 0.5), report
    after = instance_rows(takeover.group(4))
    assert set(after) == set(before), report
    for name, (host, node, state, mark) in after.items():
        assert host in HOSTS and host != dead and state == "active", report
        assert node == before[name][1], report  # the instance stays on its node
        assert mark == (f"(taken over from {dead})" if name in theirs else ""), report
        if name not in theirs:
            assert host == before[name][0], report  # the others stay where they were
    step7 = out.partition("[7/7]")[2]
    assert len(re.findall(rf"{dead} last heartbeat", step7)) >= 5, report  # every second
    # Then a reboot of one it had: carried out by the service that took it over, once.
    reboot = re.search(r"(demo-\d+) was (compute-\d)'s\. `ironic-compute-manage instance reboot "
                       r"[0-9a-f-]{36}` .*\n  asked: \1 on (compute-\d), task rebooting; .*\n"
                       r"(?:    .*\n)*  reboot done [\d.]+ s after the request, by \3 \(its log: "
                       r"\"Instance [0-9a-f-]{36}: rebooting done, active\"\): \1 active, "
                       r"power on, on the same node\n", step7)
    assert reboot, report
    name, was, by = reboot.groups()
    assert was == dead and name in theirs and by == after[name][0], report
    assert re.search(rf"actions +instance reboot of {name} \(taken over from {dead}\): done by "
                     rf"{by}, its successor", out), report
    # The database sampled all along: no row lost or doubled, no instance lost or homeless.
    assert re.search(r"checks +\d+ reads of the database, one every 0.2 s: no node lost", out), \
        report
    assert "Stopping what the demo started" in out, report
    assert out.rstrip().endswith("Done."), report
    for host in HOSTS:
        assert (state_dir / "logs" / f"{host}.log").exists(), report


def instance_rows(text):
    """{instance: (host, node, state, mark)} of the demo's instance table rows."""
    rows = {}
    for line in text.splitlines():
        name, host, node, state, *mark = line.split(maxsplit=4)
        rows[name] = (host, node, state, " ".join(mark))
    return rows


def test_stop_with_nothing_running(tmp_path):
    result = run_demo("--stop", "--state-dir", str(tmp_path / "nothing"), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "nothing was running"


def test_bad_option_is_one_usage_error():
    result = run_demo("--nodes", "0", timeout=60)
    assert result.returncode == 2
    assert "--nodes: must be between 1 and" in result.stderr
    assert "Traceback" not in result.stderr
