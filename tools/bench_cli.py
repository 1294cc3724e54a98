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

"""Benchmark the start-up of ironic-compute-manage (issue 27 item 6).

Runs each of these as a new process, in several rounds (each runs every
command once), and prints side by side the median and the fastest wall
time, and the median CPU time (user + system, which another load on the
machine changes less than the wall time):

* ``python -c pass``: the interpreter alone;
* ``python -c "import ironic_compute.cmd.manage"``: the imports of every
  command;
* ``ironic-compute-manage instance list``, ``instance show UUID`` and
  ``instance create ...`` (refused: no service to build on, exit 1) against
  a throwaway database with 20 instance rows, whose schema ``db sync``
  made: PostgreSQL when it is reachable (or asked for), else a SQLite file.

The instance commands' target is 0.3 s; most of it is what oslo.config,
oslo.log and SQLAlchemy (Core: a command opens the database without the
ORM and oslo.db's facade) cost to import (doc/cli.md, "Start-up"). The
figures are printed, never checked: they depend on the machine and its
load. PYTHONPATH=DIR measures the
checkout DIR (another branch) with the same database.

    python tools/bench_cli.py [--runs 7] [--database auto|postgresql|sqlite]
"""

import argparse
import datetime
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import sqlalchemy as sa

from ironic_compute.db import models
from ironic_compute.harness import bench

TARGET = 0.3  # seconds, for the instance commands
INSTANCES = 20
# The commands may write their bytecode cache (in the warm-up round), as an
# installed package has it: compiling every module again would be measured.
ENV = {k: v for k, v in os.environ.items() if k != 'PYTHONDONTWRITEBYTECODE'}


def manage_command():
    """The console script next to this interpreter (as an operator runs it),
    else the module."""
    script = shutil.which('ironic-compute-manage',
                          path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, '-m', 'ironic_compute.cmd.manage']


def run_once(argv, expect):
    """(wall seconds, CPU seconds) of one run of ``argv``; BenchError unless
    it exits with ``expect``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=ENV)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expect:
        raise bench.BenchError(f'{" ".join(argv[-3:])} exited {done.returncode}, '
                               f'not {expect}: {done.stderr.strip()[-300:]}')
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(cases, runs):
    """[(median wall, fastest wall, median CPU)] of each of ``cases`` ((argv,
    exit code expected)) over ``runs`` rounds, after one that warms the file
    cache. A round runs every case once: a load that comes and goes on the
    machine weighs on all of them alike."""
    results = [[] for _ in cases]
    for round_ in range(runs + 1):
        for (argv, expect), found in zip(cases, results, strict=True):
            measured = run_once(argv, expect)
            if round_:
                found.append(measured)
    return [(statistics.median(w for w, _ in found), min(w for w, _ in found),
             statistics.median(c for _, c in found)) for found in results]


def add_instances(url, count):
    """``count`` active instance rows; the uuid of the first."""
    now = models._utcnow()
    rows = [{'uuid': str(uuid.uuid4()), 'name': f'bench-{i:02d}',
             'host': 'compute-000', 'node': str(uuid.uuid4()),
             'vm_state': 'active', 'resource_class': 'baremetal',
             'created_at': now, 'updated_at': now, 'deleted': 0}
            for i in range(count)]
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(models.instances.insert(), rows)
    finally:
        engine.dispose()
    return rows[0]['uuid']


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', type=int, default=7, help='runs of each command')
    parser.add_argument('--database', choices=('auto', 'postgresql', 'sqlite'),
                        default='auto')
    opts = parser.parse_args()
    database, label = bench.open_database(opts.database)
    workdir = tempfile.TemporaryDirectory(prefix='bench-cli-')
    try:
        config = os.path.join(workdir.name, 'ironic-compute.conf')
        with open(config, 'w') as f:
            f.write(f'[DEFAULT]\nstate_path = {workdir.name}\n'
                    f'[database]\nconnection = {database.url}\n')
        manage = [*manage_command(), '--config-file', config]
        run_once([*manage, 'db', 'sync'], 0)
        shown = add_instances(database.url, INSTANCES)
        cases = [
            ('python -c pass', [sys.executable, '-c', 'pass'], 0, False),
            ('import ironic_compute.cmd.manage',
             [sys.executable, '-c', 'import ironic_compute.cmd.manage'], 0, False),
            ('instance list', [*manage, 'instance', 'list'], 0, True),
            ('instance show UUID', [*manage, 'instance', 'show', shown], 0, True),
            ('instance create (refused)',
             [*manage, 'instance', 'create', '--name', 'bench',
              '--resource-class', 'baremetal'], 1, True),
        ]
        bench.say(f'ironic-compute-manage start-up, {label}, {INSTANCES} instances, '
                  f'median of {opts.runs} runs, {datetime.date.today()}, '
                  f'load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs')
        bench.say()
        bench.say('| command | median wall (s) | fastest wall (s) | median CPU (s) | target |')
        bench.say('| --- | ---: | ---: | ---: | --- |')
        measured = measure([(argv, expect) for _, argv, expect, _ in cases], opts.runs)
        for (name, _, _, targeted), (median, fastest, cpu) in zip(cases, measured,
                                                                  strict=True):
            target = f'< {TARGET} s' if targeted else ''
            bench.say(f'| {name} | {median:.3f} | {fastest:.3f} | {cpu:.3f} | {target} |')
    finally:
        workdir.cleanup()
        database.drop()
    return 0


if __name__ == '__main__':
    try:
        sys.exit(main())
    except bench.BenchError as exc:
        print(f'bench_cli: {exc}', file=sys.stderr)
        sys.exit(1)
