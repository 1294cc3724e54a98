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

"""Benchmark [ironic]shard_ring against full listing with a real Ironic.

A standalone Ironic (``ironic_compute.harness.ironic``: SQLite, noauth,
fake-hardware) holds ``--nodes`` nodes (10^4 by default) spread over
``--shards`` shards (100) by ``shard_ring.shard_key``, as ``ironic-compute-
manage ironic shard-assign`` would give them. The nodes are created once,
through the API, in a state directory kept under ``.bench/`` (gitignored);
a later run with the same sizes finds that directory, starts Ironic on its
database and creates only the nodes that are missing.

Then ``--services`` services (10) run their resource-tracker cycles in this
process, one after the other, each a ``ResourceTracker`` with its own host,
against one database (PostgreSQL through the openstack_citest user when it
answers, else a SQLite file) and with its own Ironic adapter, a real
``ironic.IronicClient`` that counts what Ironic returns. Twice:

* ``shard_ring`` off: every service lists the whole inventory;
* ``shard_ring`` on: every service lists the nodes of its shards only.

Each mode runs rounds of cycles (every service one cycle) until one changes
no row (at most ``MAX_WARMUP`` rounds; with ``shard_ring`` on, until every
service has the shard ring in force): that round and the next ones, up to
``--rounds``, are measured. It prints a markdown table, per service, of the
cycle time (median of the measured rounds), the nodes fetched from Ironic
per cycle and the Ironic requests per cycle, side by side, and exits 1
unless every service fetches at least ``TARGET_RATIO`` times fewer nodes
with the shard ring (``--no-fail``: always 0).

    python tools/bench_shards.py [--nodes 10000] [--shards 100]
                                 [--services 10] [--rounds 2]
                                 [--database auto|postgresql|sqlite]
                                 [--state-dir DIR] [--no-fail]

``--nodes 2000`` is a quick check (its own state directory). Creating the
nodes goes at what Ironic on SQLite takes, 5 to 30 nodes per second here
depending on the load of the machine (10^4 nodes: 6 to 35 min, once).
"""

import argparse
import dataclasses
import datetime
import os
import pathlib
import statistics
import sys
import tempfile
import time
import uuid as uuidlib

import sqlalchemy as sa
from oslo_config import cfg

from ironic_compute import ironic
from ironic_compute.conf import ironic as ironic_conf
from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.harness import bench
from ironic_compute.harness import ironic as standalone
from ironic_compute.harness.bench import BenchError
from ironic_compute.harness.bench import open_database
from ironic_compute.harness.bench import say
from ironic_compute.nodes import tracker as resource_tracker
from ironic_compute.ring import shard_ring

DEFAULT_NODES = 10_000
DEFAULT_SHARDS = 100
DEFAULT_SERVICES = 10
DEFAULT_ROUNDS = 2
MAX_WARMUP = 6
TARGET_RATIO = 5.0
PAGE_SIZE = 1000  # Ironic's [api]max_limit (its default)
CREATE_WORKERS = 4
CHUNK = 1000  # nodes created between two progress lines
NAME_PREFIX = 'bench'
# Long enough that no service is judged down while the others list.
SERVICE_DOWN_TIME = 600
# A few node shapes, so that the rows differ as a real inventory's do.
SHAPES = ({'cpus': 16, 'memory_mb': 65536, 'local_gb': 480},
          {'cpus': 32, 'memory_mb': 131072, 'local_gb': 960},
          {'cpus': 64, 'memory_mb': 262144, 'local_gb': 1920})


def size_label(count):
    return f'{count // 1000}k' if count % 1000 == 0 else str(count)


def default_state_dir(nodes, shards):
    suffix = '' if shards == DEFAULT_SHARDS else f'-{shards}shards'
    return standalone.REPO_ROOT / '.bench' / f'ironic-{size_label(nodes)}{suffix}'


# --------------------------------------------------------------------------- Ironic


def node_uuid(index):
    """The same uuid for the same index on every run."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL,
                             f'ironic-compute-bench-shards/{index}'))


def node_name(index):
    return f'{NAME_PREFIX}-{index:06d}'


def node_shape(index):
    return dict(SHAPES[index % len(SHAPES)], cpu_arch='x86_64', capabilities='boot_mode:uefi')


def node_shard(index, shards):
    return shard_ring.shard_key(node_uuid(index), shards)


def create(client, indexes, shards):
    """The benchmark's nodes of these indexes (the same uuid and name on every run)."""
    standalone.create_nodes(
        client, len(indexes), name_prefix=None, properties=lambda i: node_shape(indexes[i]),
        shard=lambda i: node_shard(indexes[i], shards), workers=CREATE_WORKERS,
        uuid=lambda i: node_uuid(indexes[i]), name=lambda i: node_name(indexes[i]))


def start_ironic(state_dir):
    server = standalone.IronicServer(state_dir=state_dir, port=0, groups=('',),
                                     max_limit=PAGE_SIZE, die_with_parent=True,
                                     log=lambda msg: say(f'  {msg}'))
    reuse = server.db_path.exists()
    say(f'Ironic: {"reusing" if reuse else "creating"} {state_dir}')
    try:
        server.start(keep_db=reuse)
    except standalone.IronicError as exc:
        raise BenchError(f'cannot start Ironic: {exc}') from None
    return server


def seed(client, nodes, shards):
    """Create the nodes that are missing; check the others' shards."""
    started = time.monotonic()
    existing = {n['name']: n for n in standalone.list_nodes(
        client, fields=['name', 'shard'])}
    wrong = [name for name, n in existing.items()
             if not name or not name.startswith(NAME_PREFIX + '-')
             or n.get('shard') != node_shard(int(name.split('-')[1]), shards)]
    if wrong:
        raise BenchError(f'{len(wrong)} nodes of this Ironic are not the '
                         f'benchmark\'s (e.g. {wrong[0]!r} or its shard); '
                         'delete its state directory or choose another')
    missing = [i for i in range(nodes) if node_name(i) not in existing]
    if not missing:
        say(f'  {len(existing)} nodes already there, in '
            f'{len({n["shard"] for n in existing.values()})} shards')
        return 0
    say(f'  creating {len(missing)} nodes ({len(existing)} already there) '
        f'through the API, {CREATE_WORKERS} at a time')

    done = 0
    for start in range(0, len(missing), CHUNK):
        chunk = missing[start:start + CHUNK]
        create(client, chunk, shards)
        done += len(chunk)
        rate = done / (time.monotonic() - started)
        say(f'  {done}/{len(missing)} created ({rate:.0f}/s)')
    return len(missing)


class CountingIronic(ironic.IronicClient):
    """The real adapter, counting the nodes it returns and its requests."""

    def __init__(self, conf):
        super().__init__(conf)
        self.reset()

    def reset(self):
        self.nodes = 0  # nodes Ironic returned (listings, gets, exists)
        self.requests = 0  # HTTP requests (each page of a listing is one)
        self.seconds = 0.0  # time spent in those requests
        self.shards = set()  # the shards listed ('None': the unsharded)

    def _call(self, func, *args, **kwargs):
        started = time.perf_counter()
        try:
            return super()._call(func, *args, **kwargs)
        finally:
            self.requests += 1
            self.seconds += time.perf_counter() - started

    def list_nodes(self, conductor_group=None, shards=None, **filters):
        nodes = super().list_nodes(conductor_group, shards, **filters)
        self.nodes += len(nodes)
        self.shards.update(shards or ())
        if filters.get('sharded') is False:
            self.shards.add(ironic.UNSHARDED)
        return nodes

    def get_nodes(self, uuids):
        nodes = super().get_nodes(uuids)
        self.nodes += len(nodes)
        return nodes

    def node_exists(self, uuid):
        exists = super().node_exists(uuid)
        self.nodes += exists
        return exists


def adapter(url):
    conf = cfg.ConfigOpts()
    ironic_conf.register_opts(conf)
    conf([], default_config_files=[], default_config_dirs=[])
    for name, value in {'auth_type': 'none', 'endpoint_override': url,
                        'api_max_retries': 3, 'api_retry_interval': 1,
                        'timeout': 120}.items():
        conf.set_override(name, value, group='ironic')
    return CountingIronic(conf)


# --------------------------------------------------------------------------- services


@dataclasses.dataclass
class Sample:
    seconds: float
    nodes: int
    requests: int
    shards: int  # shards listed by name (0: listed without a shard filter)
    ironic_seconds: float
    stats: object


class Fleet:
    """The services: one ResourceTracker and one adapter each."""

    def __init__(self, url, count):
        self.hosts = [f'compute-{i:02d}' for i in range(count)]
        ctx = db_api.Context()
        self.ids = {h: db_services.register(ctx, h) for h in self.hosts}
        self.adapters = {h: adapter(url) for h in self.hosts}
        self.trackers = {h: resource_tracker.ResourceTracker(
            h, self.ids[h], self.adapters[h]) for h in self.hosts}

    def cycle(self, host, settings):
        db_services.heartbeat(db_api.Context(), self.ids[host])
        counter = self.adapters[host]
        counter.reset()
        started = time.perf_counter()
        stats = self.trackers[host].run_cycle(settings)
        return Sample(time.perf_counter() - started, counter.nodes,
                      counter.requests, len(counter.shards), counter.seconds,
                      stats)

    def round(self, settings):
        return {h: self.cycle(h, settings) for h in self.hosts}


def quiet(samples):
    return all(not (s.stats.skipped or s.stats.taken or s.stats.released
                    or s.stats.created or s.stats.revived or s.stats.deleted
                    or s.stats.lost_races) for s in samples.values())


def run_mode(fleet, settings, rounds, label):
    """Rounds until one is quiet (it counts as the first measured one),
    then more measured rounds until there are ``rounds``."""
    shard_mode = settings.shard_ring
    measured = []
    for number in range(1, MAX_WARMUP + rounds + 1):
        t0 = time.monotonic()
        samples = fleet.round(settings)
        in_force = all(t._shard_ring_in_force == shard_mode
                       for t in fleet.trackers.values())
        if measured and not quiet(samples):
            raise BenchError(f'{label}: round {number} changed rows after a '
                             f'quiet one: {[s.stats for s in samples.values()]}')
        if quiet(samples) and in_force:
            measured.append(samples)
            say(f'  {label}: round {number}: measured '
                f'({time.monotonic() - t0:.1f} s)')
            if len(measured) == rounds:
                return measured
            continue
        if number >= MAX_WARMUP:
            break
        moved = sum(s.stats.taken + s.stats.created + s.stats.released
                    for s in samples.values())
        say(f'  {label}: round {number}: warm-up, {moved} rows created or '
            f'moved' + (f', shard ring in force: {in_force}' if shard_mode
                        else '') + f' ({time.monotonic() - t0:.1f} s)')
    raise BenchError(f'{label}: no quiet round after {MAX_WARMUP} rounds')


def check_owned_once(engine, nodes):
    table = models.compute_nodes
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.uuid, sa.func.count())
                            .where(table.c.deleted == 0)
                            .group_by(table.c.uuid)).all()
    if len(rows) != nodes or any(count != 1 for _, count in rows):
        raise BenchError(f'expected {nodes} rows, one per node; found '
                         f'{len(rows)} uuids')


def summarise(measured, host):
    samples = [r[host] for r in measured]
    return {'seconds': statistics.median(s.seconds for s in samples),
            'ironic': statistics.median(s.ironic_seconds for s in samples),
            'nodes': max(s.nodes for s in samples),
            'requests': max(s.requests for s in samples),
            'shards': max(s.shards for s in samples),
            'owned': samples[-1].stats.owned}


def report(fleet, off, on, shards):
    rows = []
    for host in fleet.hosts:
        a, b = summarise(off, host), summarise(on, host)
        ratio = a['nodes'] / b['nodes'] if b['nodes'] else float('inf')
        rows.append((host, a, b, b['shards'], ratio))
    say('| service | off: cycle s | off: Ironic s | off: nodes fetched '
        '| off: requests | on: shards | on: cycle s | on: Ironic s '
        '| on: nodes fetched | on: requests | less listing |')
    say('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for host, a, b, mine, ratio in rows:
        say(f'| {host} | {a["seconds"]:.2f} | {a["ironic"]:.2f} | '
            f'{a["nodes"]:,} | {a["requests"]} | {mine} | {b["seconds"]:.2f} | '
            f'{b["ironic"]:.2f} | {b["nodes"]:,} | {b["requests"]} | '
            f'{ratio:.1f}× |')

    a_sum = {k: sum(r[1][k] for r in rows) for k in ('seconds', 'ironic',
                                                      'nodes', 'requests')}
    b_sum = {k: sum(r[2][k] for r in rows) for k in ('seconds', 'ironic',
                                                      'nodes', 'requests')}
    say(f'| **all {len(rows)}** | {a_sum["seconds"]:.2f} | '
        f'{a_sum["ironic"]:.2f} | {a_sum["nodes"]:,} | {a_sum["requests"]} | '
        f'{shards} | {b_sum["seconds"]:.2f} | {b_sum["ironic"]:.2f} | '
        f'{b_sum["nodes"]:,} | {b_sum["requests"]} | '
        f'{a_sum["nodes"] / max(b_sum["nodes"], 1):.1f}× |')
    worst = min(r[4] for r in rows)
    loads = [r[2]['nodes'] for r in rows]
    say(f'\nnodes per service with shard_ring: max {max(loads):,}, mean '
        f'{statistics.mean(loads):,.0f} (max/mean '
        f'{max(loads) / statistics.mean(loads):.2f}); least gain '
        f'{worst:.1f}× (target ≥ {TARGET_RATIO:g}×)')
    return worst


# --------------------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--nodes', type=int, default=DEFAULT_NODES)
    parser.add_argument('--shards', type=int, default=DEFAULT_SHARDS)
    parser.add_argument('--services', type=int, default=DEFAULT_SERVICES)
    parser.add_argument('--rounds', type=int, default=DEFAULT_ROUNDS,
                        help='measured rounds per mode (default %(default)s)')
    parser.add_argument('--database', choices=('auto', 'postgresql', 'sqlite'),
                        default='auto')
    parser.add_argument('--state-dir', type=pathlib.Path,
                        help='Ironic\'s state directory (default: '
                             '.bench/ironic-<nodes>, kept for later runs)')
    parser.add_argument('--no-fail', action='store_true', help='always exit 0')
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.shards < 1 or args.services < 1 or args.rounds < 1:
        parser.error('--nodes, --shards, --services and --rounds must be >= 1')
    state_dir = (args.state_dir or default_state_dir(args.nodes, args.shards)
                 ).absolute()
    try:
        return run(args, state_dir)
    except BenchError as exc:
        say(f'FAIL: {exc}')
        return 1


def run(args, state_dir):
    started = time.monotonic()
    cache = tempfile.TemporaryDirectory(prefix='bench-shards-')
    standalone.isolate_version_cache(cache.name)
    server = start_ironic(state_dir)
    database = None
    try:
        client = standalone.make_client(server.url, timeout=120)
        seed(client, args.nodes, args.shards)
        counts = adapter(server.url).list_shards()
        total = sum(counts.values())
        if total != args.nodes:
            raise BenchError(f'Ironic holds {total} nodes, expected {args.nodes}')
        t0 = time.perf_counter()
        standalone.list_nodes(client, fields=[f for f, _ in ironic.FIELDS])
        full_listing = time.perf_counter() - t0
        say(f'  {total} nodes in {len(counts)} shards; one listing of all of '
            f'them: {full_listing:.2f} s (page size {PAGE_SIZE})')

        database, db_label = open_database(args.database)
        with bench.facade_on(database.url) as engine:
            migration.upgrade('head', engine=engine)
            fleet = Fleet(server.url, args.services)
            base = resource_tracker.Settings(
                service_down_time=SERVICE_DOWN_TIME)
            say(f'{args.services} services on {db_label}, cycles one after '
                'the other')
            off = run_mode(fleet, base, args.rounds, 'shard_ring off')
            check_owned_once(engine, args.nodes)
            on = run_mode(fleet, dataclasses.replace(base, shard_ring=True),
                          args.rounds, 'shard_ring on')
            check_owned_once(engine, args.nodes)
    finally:
        server.stop(quiet=True)
        if database is not None:
            database.drop()
        cache.cleanup()

    say(f'\n{args.nodes:,} nodes in {args.shards} shards, {args.services} '
        f'services, {db_label}; median of {args.rounds} measured rounds; '
        f'one listing of every node {full_listing:.2f} s '
        f'({datetime.date.today()}, {os.cpu_count()} CPUs, total '
        f'{time.monotonic() - started:.0f} s)\n')
    worst = report(fleet, off, on, args.shards)
    if worst < TARGET_RATIO:
        say(f'FAIL: a service fetches only {worst:.1f}× fewer nodes with '
            f'shard_ring (target ≥ {TARGET_RATIO:g}×)')
        return 0 if args.no_fail else 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
