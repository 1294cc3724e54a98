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

"""Benchmark one resource-tracker cycle on SQLite and PostgreSQL.

Ironic is faked in memory (ironic_compute/harness/fakes.py), so what is measured is the
database work and the Python work of ``ResourceTracker.run_cycle``.  For each
ring, backend, number of nodes and number of services, the database gets
every other service's rows, then one service runs:

* its first cycle, which creates its share of the rows (ring cache cleared);
* its steady state: three more cycles when nothing changed (median time).

Two rings: ``node`` (the default settings: every service lists every node
and owns the ones the node ring gives it) and ``shard`` (``[ironic]
shard_ring``: the nodes are in ``SHARDS_PER_SERVICE`` x services shards,
every service runs the shard ring and lists only its shards). A service's
first cycle lists every node even under the shard ring (it does not know
yet whether all its peers run it), so with ``shard`` the first cycle takes
the rows the node ring gives it and the next cycles give them back; the
steady state is measured once a cycle changes nothing (at most
``SETTLE_CYCLES`` cycles).

Prints a markdown table and exits non-zero when a target fails, unless
--no-fail.  SQL counts one statement per execution (an executemany, including
PostgreSQL's batched "insertmanyvalues", is one), with the number of
transactions and of rows written (inserted, updated or deleted).

With --takeover it measures instead the cycles that take over a dead
service's instances (issue 19): the dead service held every node, each with
one of its instances; once it has been silent for longer than
``service_down_time + instance_takeover_grace``, each survivor runs one
cycle, which takes the instances the ring gives it. Reported: the slowest
survivor's takeover cycle, the statements of all of them, and the next
cycle of each for comparison. MariaDB (``mysql``) can be measured too.

    python tools/bench_cycle.py [--quick] [--backends sqlite,postgresql]
                                [--rings node,shard] [--no-fail]
                                [--show-sql] [--profile PREFIX]
    python tools/bench_cycle.py --takeover [--backends postgresql,mysql]
                                [--survivors 2] [--quick]
"""

import collections
import cProfile
import dataclasses
import datetime
import gc
import os
import pstats
import statistics
import sys
import time
import uuid

import sqlalchemy as sa

from ironic_compute import ironic
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import migration
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.harness import bench
from ironic_compute.harness import databases
from ironic_compute.harness import fakes
from ironic_compute.instances import model as inst
from ironic_compute.nodes import ownership
from ironic_compute.nodes import tracker as resource_tracker
from ironic_compute.ring import assignment
from ironic_compute.ring import hash_ring
from ironic_compute.ring import shard_ring

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)
SERVICE_COUNTS = (10, 100)
BACKENDS = ('sqlite', 'postgresql')
KNOWN_BACKENDS = ('sqlite', 'postgresql', 'mysql')
TAKEOVER_SIZES = (1_000, 10_000)
TAKEOVER_QUICK_SIZES = (1_000,)
FREE_PER_SURVIVOR = 100
RINGS = ('node', 'shard')
STEADY_RUNS = 3
SETTLE_CYCLES = 4
SHARDS_PER_SERVICE = 10
SETTINGS = resource_tracker.Settings()  # the defaults: 2**16 buckets
SHARD_SETTINGS = dataclasses.replace(SETTINGS, shard_ring=True)
TAKEOVER_SETTINGS = dataclasses.replace(SETTINGS, service_down_time=60,
                                        takeover_grace=120)

# (ring, nodes, services) -> (max steady seconds, max steady statements)
TARGETS = {('node', 100_000, 10): (1.0, 10),
           ('shard', 100_000, 100): (0.1, 10)}


def shard_nodes(nodes, n_services):
    """``nodes`` in shards named as ``ironic shard-assign`` names them."""
    count = SHARDS_PER_SERVICE * n_services
    return [dataclasses.replace(n, shard=shard_ring.shard_key(n.uuid, count))
            for n in nodes]


class IndexedIronic(fakes.FakeIronic):
    """FakeIronic answering a shard listing and the shard counts from an
    index, as Ironic does from its own: the fake's scan of every node is
    not what a cycle costs."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.by_shard = collections.defaultdict(list)
        for node in self.nodes.values():
            self.by_shard[node.shard].append(node)
        self.counts = {shard or ironic.UNSHARDED: len(nodes)
                       for shard, nodes in self.by_shard.items()}

    def list_nodes(self, conductor_group=None, shards=None, sharded=None):
        if conductor_group is not None or (shards is None and sharded is None):
            return super().list_nodes(conductor_group, shards, sharded)
        keys = [None] if sharded is False else shards
        nodes = [n for shard in keys for n in self.by_shard.get(shard, ())]
        self.fetched += len(nodes)
        return nodes

    def list_shards(self):
        return dict(self.counts)


def refresh_heartbeats(engine):
    """Every service was seen just now: all of them are live peers."""
    table = models.services
    with engine.begin() as conn:
        conn.execute(table.update().values(last_seen_up=models._utcnow()))


def owners(hosts, nodes, ring_kind):
    """{uuid: host} as the services compute it (no instances)."""
    ring = hash_ring.get_ring(hosts, SETTINGS.partition_exponent)
    uuids = [n.uuid for n in nodes]
    if ring_kind == 'shard':
        counts = collections.Counter(n.shard or ironic.UNSHARDED for n in nodes)
        assigned = shard_ring.assign(ring, counts, SETTINGS.load_factor)
        return {n.uuid: shard_ring.owner(assigned, n.shard or ironic.UNSHARDED)
                for n in nodes}
    # Bounded loads over every node.
    ring = ownership.node_ring(ring, [ownership.NodeInfo(u) for u in uuids], [],
                               SETTINGS.load_factor)
    return dict(zip(uuids, ring.primaries(uuids), strict=True))


def measured(engine, counter, tracker, settings):
    refresh_heartbeats(engine)
    gc.collect()  # the same start for every run; the cycle's own GC counts
    counter.reset()
    started = time.perf_counter()
    stats = tracker.run_cycle(settings)
    seconds = time.perf_counter() - started
    return stats, seconds, counter.result()


def changed(stats):
    return (stats.created or stats.updated or stats.taken or stats.released
            or stats.deleted or stats.revived or stats.lost_races
            or stats.skipped)


def run_scenario(backend, ring_kind, nodes, fields, n_services, args,
                 profile=None):
    database = bench.provision(backend)
    try:
        with bench.facade_on(database.url) as engine:
            return _scenario(engine, ring_kind, nodes, fields, n_services,
                             args, profile)
    finally:
        database.drop()


def _scenario(engine, ring_kind, nodes, fields, n_services, args, profile):
    migration.upgrade('head', engine=engine)
    hosts = bench.host_names(n_services)
    service_ids = {h: db_services.register(db_api.Context(), h) for h in hosts}
    me = hosts[0]
    share = bench.populate(engine, service_ids, fields,
                     owners(hosts, nodes, ring_kind), me, ring_kind)
    if engine.dialect.name == 'postgresql':
        # Planner statistics, as autovacuum would gather after such an insert.
        with engine.begin() as conn:
            conn.execute(sa.text('ANALYZE'))
    counter = bench.SqlCounter(engine)
    fake = IndexedIronic(nodes) if ring_kind == 'shard' else fakes.FakeIronic(nodes)
    settings = SHARD_SETTINGS if ring_kind == 'shard' else SETTINGS
    tracker = resource_tracker.ResourceTracker(me, service_ids[me], fake)
    hash_ring.clear_ring_cache()  # a service's first cycle builds its ring
    assignment.clear_cache()  # and places the nodes
    # What the service does once start-up is done (service.py): the
    # benchmark's own data (the nodes, the fake Ironic) stays out of the
    # collector's scans, as it does not exist in a service.
    gc.collect()
    gc.freeze()
    try:
        return _cycles(engine, counter, tracker, fake, settings, ring_kind,
                       share, n_services, args, profile)
    finally:
        gc.unfreeze()


def _cycles(engine, counter, tracker, fake, settings, ring_kind, share,
            n_services, args, profile):
    counter.keep = args.show_sql
    stats, first_s, first_sql = measured(engine, counter, tracker, settings)
    first = stats
    if ring_kind == 'node' and (
            (stats.created, stats.owned, stats.peers) != (share, share, n_services)
            or changed(stats) != stats.created):
        raise AssertionError(f'first cycle: expected {share} rows created by '
                             f'{n_services} peers, got {stats}')
    settle = 0
    if ring_kind == 'shard':
        # The rows the full listing took go back to their shards' owners.
        while changed(stats):
            settle += 1
            if settle > SETTLE_CYCLES:
                raise AssertionError(f'no steady state after {SETTLE_CYCLES} '
                                     f'cycles: {stats}')
            stats, _, _ = measured(engine, counter, tracker, settings)
    steady = []
    # The profiled run, if any, is an extra one: its time is not reported.
    for run in range(STEADY_RUNS + bool(profile)):
        counter.keep = args.show_sql and run == STEADY_RUNS - 1
        profiler = cProfile.Profile() if run == STEADY_RUNS else None
        if profiler:
            profiler.enable()
        fake.fetched = 0
        stats, seconds, sql = measured(engine, counter, tracker, settings)
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
        if changed(stats) or stats.owned != share:
            raise AssertionError(f'steady state changed something (share '
                                 f'{share}): {stats}')
        if ring_kind == 'shard' and (stats.fetched != share
                                     or fake.fetched != share):
            raise AssertionError(f'the shard ring listed {fake.fetched} '
                                 f'nodes, its share is {share}')
        if not profiler:
            steady.append((seconds, sql))
    sqls = {sql[:3] for _, sql in steady}
    if len(sqls) != 1:
        raise AssertionError(f'steady-state SQL varies between runs: {sqls}')
    return {'share': share, 'first_s': first_s, 'first_sql': first_sql,
            'first': first, 'settle': settle,
            'steady_s': statistics.median(s for s, _ in steady),
            'steady_sql': steady[-1][1], 'fetched': stats.fetched}


def fmt_sql(sql):
    statements, rows, transactions, _ = sql
    return f'{statements} ({transactions} tx, {rows:,} row{"s" * (rows != 1)})'


# --- takeover at scale ---------------------------------------------------

def run_takeover(backend, count, n_survivors, args):
    database = bench.provision(backend)
    try:
        with bench.facade_on(database.url) as engine:
            return _takeover(engine, count, n_survivors, args)
    finally:
        database.drop()


def set_heartbeats(engine, hosts, seconds_ago=0):
    table = models.services
    seen = models._utcnow() - datetime.timedelta(seconds=seconds_ago)
    with engine.begin() as conn:
        conn.execute(table.update().where(table.c.host.in_(hosts))
                     .values(last_seen_up=seen))


def pin_instances(engine, dead, node_uuids):
    """One active instance of ``dead`` on each node: {node: instance}."""
    now = models._utcnow()
    placed = {node: str(uuid.uuid4()) for node in node_uuids}
    rows = [dict(uuid=instance, host=dead, node=node, deleted=0,
                 vm_state=inst.ACTIVE, power_state='on',
                 resource_class='baremetal', generation=0, created_at=now,
                 updated_at=now)
            for node, instance in placed.items()]
    table = models.instances
    with engine.begin() as conn:
        for start in range(0, len(rows), bench.INSERT_CHUNK):
            conn.execute(table.insert(), rows[start:start + bench.INSERT_CHUNK])
    return placed


def _takeover(engine, count, n_survivors, args):
    migration.upgrade('head', engine=engine)
    hosts = bench.host_names(n_survivors + 1)
    dead, survivors = hosts[-1], hosts[:-1]
    service_ids = {h: db_services.register(db_api.Context(), h) for h in hosts}
    nodes = bench.make_nodes(count)
    placed = pin_instances(engine, dead, [n.uuid for n in nodes])
    # The nodes are deployed, each with the instance the database knows.
    nodes = [dataclasses.replace(n, provision_state='active',
                                 power_state='power on',
                                 instance_uuid=placed[n.uuid]) for n in nodes]
    bench.populate(engine, service_ids, bench.node_fields(nodes),
             {n.uuid: dead for n in nodes}, None, 'node')
    # Free nodes the survivors hold (a service without any row is not yet
    # a peer of the ring): FREE_PER_SURVIVOR each, as their cycles place
    # them.
    nodes += bench.make_nodes(FREE_PER_SURVIVOR * n_survivors, seed=7)
    if engine.dialect.name == 'postgresql':
        with engine.begin() as conn:
            conn.execute(sa.text('ANALYZE'))
    counter = bench.SqlCounter(engine)
    counter.keep = args.show_sql
    fake = fakes.FakeIronic(nodes)
    trackers = [resource_tracker.ResourceTracker(h, service_ids[h], fake)
                for h in survivors]
    hash_ring.clear_ring_cache()
    assignment.clear_cache()

    def cycle(tracker):
        set_heartbeats(engine, [tracker.host])
        gc.collect()
        counter.reset()
        started = time.perf_counter()
        stats = tracker.run_cycle(TAKEOVER_SETTINGS)
        return stats, time.perf_counter() - started, counter.result()

    # While the dead service was alive: the survivors settle (its nodes
    # stay its own, each has its instance).
    for settle in range(SETTLE_CYCLES + 1):
        set_heartbeats(engine, [dead])
        rounds = [cycle(tracker)[0] for tracker in trackers]
        if any(stats.taken_over for stats in rounds):
            raise AssertionError(f'taken over while alive: {rounds}')
        if settle and not any(changed(stats) for stats in rounds):
            break
    else:
        raise AssertionError(f'no steady state before the takeover: {rounds}')
    down_for = (TAKEOVER_SETTINGS.service_down_time
                + TAKEOVER_SETTINGS.takeover_grace)
    set_heartbeats(engine, [dead], seconds_ago=down_for + 60)
    takeover = [cycle(tracker) for tracker in trackers]
    steady = [cycle(tracker) for tracker in trackers]
    taken = sum(stats.taken_over for stats, _, _ in takeover)
    left = db_instances.list_instances(db_api.Context(), host=dead)
    if taken != count or left or any(s.taken_over for s, _, _ in steady):
        raise AssertionError(f'{taken} of {count} taken over, {len(left)} '
                             f'left to {dead}: {[s for s, _, _ in takeover]}')
    generations = collections.Counter(
        row.generation for row in db_instances.list_instances(db_api.Context()))
    if generations != {1: count}:
        raise AssertionError(f'generations after takeover: {generations}')
    return {'takeover_s': max(s for _, s, _ in takeover),
            'takeover_sql': [sql for _, _, sql in takeover],
            'steady_s': max(s for _, s, _ in steady),
            'steady_sql': [sql for _, _, sql in steady],
            'taken': [stats.taken_over for stats, _, _ in takeover]}


def main_takeover(args, backends):
    sizes = TAKEOVER_QUICK_SIZES if args.quick else TAKEOVER_SIZES
    started = time.perf_counter()
    results, problems = [], []
    for backend in backends:
        try:
            bench.provision(backend).drop()
        except bench.Unavailable as exc:
            if databases.on_ci():
                problems.append(f'{backend}: {exc}')
            print(f'{"FAIL" if databases.on_ci() else "SKIP"} {backend}: '
                  f'{exc}', file=sys.stderr, flush=True)
            continue
        for count in sizes:
            t0 = time.perf_counter()
            result = run_takeover(backend, count, args.survivors, args)
            results.append((backend, count, result))
            print(f'# takeover, {backend}, {count} instances: '
                  f'{result["takeover_s"]:.3f} s, taken {result["taken"]} '
                  f'({time.perf_counter() - t0:.1f} s with setup)',
                  file=sys.stderr, flush=True)
            if args.show_sql:
                for sql in result['takeover_sql']:
                    for statement, times in sql[3].most_common():
                        print(f'#   {times:4d} x {statement}',
                              file=sys.stderr)
    print('| backend | instances | survivors | takeover cycle s (slowest) '
          '| takeover SQL (all survivors) | next cycle s (slowest) '
          '| next cycle SQL (all) |')
    print('|---|---:|---:|---:|---|---:|---|')
    for backend, count, r in results:
        print(f'| {backend} | {count:,} | {args.survivors} | '
              f'{r["takeover_s"]:.3f} | {fmt_sql(total_sql(r["takeover_sql"]))}'
              f' | {r["steady_s"]:.3f} | '
              f'{fmt_sql(total_sql(r["steady_sql"]))} |')
    print(f'\n{len(results)} scenarios; total '
          f'{time.perf_counter() - started:.0f} s ({datetime.date.today()}, '
          f'{os.cpu_count()} CPUs)')
    for problem in problems:
        print(f'FAIL: {problem}')
    return 1 if problems and not args.no_fail else 0


def total_sql(results):
    """The sum of SqlCounter results (statements, rows, transactions)."""
    return (sum(r[0] for r in results), sum(r[1] for r in results),
            sum(r[2] for r in results), None)


def main(argv=None):
    parser = bench.parser(__doc__.splitlines()[0], QUICK_SIZES, BACKENDS)
    parser.add_argument('--rings', default=','.join(RINGS),
                        help='comma-separated, of: %(default)s')
    parser.add_argument('--show-sql', action='store_true',
                        help='print the statements of each steady-state cycle')
    parser.add_argument('--profile', metavar='PREFIX',
                        help='cProfile one more steady-state cycle with the '
                             'most nodes and 10 services (node ring) or 100 '
                             '(shard ring) into PREFIX.<ring>.<backend>.prof '
                             'and print its top')
    parser.add_argument('--takeover', action='store_true',
                        help='measure the takeover of a dead service\'s '
                             'instances instead (10^3 and 10^4 of them)')
    parser.add_argument('--survivors', type=int, default=2,
                        help='with --takeover: the live services '
                             '(default %(default)s)')
    args = parser.parse_args(argv)
    backends = bench.chosen(parser, args.backends, KNOWN_BACKENDS)
    if args.takeover:
        return main_takeover(args, backends)
    rings = bench.chosen(parser, args.rings, RINGS, 'rings')
    sizes = QUICK_SIZES if args.quick else SIZES
    profiled = {('node', sizes[-1], SERVICE_COUNTS[0]),
                ('shard', sizes[-1], SERVICE_COUNTS[-1])}

    started = time.perf_counter()
    results, problems, skipped = [], [], []
    for backend in backends:
        try:
            bench.provision(backend).drop()
        except bench.Unavailable as exc:
            if databases.on_ci():  # the message says CI=true
                problems.append(f'{backend}: {exc}')
            else:
                skipped.append(f'{backend}: {exc}')
            print(f'{"FAIL" if databases.on_ci() else "SKIP"} {backend}: {exc}',
                  file=sys.stderr, flush=True)
            continue
        for ring_kind in rings:
            for count in sizes:
                plain = bench.make_nodes(count)
                for n_services in SERVICE_COUNTS:
                    nodes = (shard_nodes(plain, n_services)
                             if ring_kind == 'shard' else plain)
                    fields = bench.node_fields(nodes)
                    profile = None
                    if args.profile and (ring_kind, count,
                                         n_services) in profiled:
                        profile = f'{args.profile}.{ring_kind}.{backend}.prof'
                    t0 = time.perf_counter()
                    result = run_scenario(backend, ring_kind, nodes, fields,
                                          n_services, args, profile)
                    results.append((ring_kind, backend, count, n_services,
                                    result))
                    print(f'# {ring_kind} ring, {backend}, {count} nodes, '
                          f'{n_services} services: first '
                          f'{result["first_s"]:.3f} s, steady '
                          f'{result["steady_s"]:.3f} s, settled in '
                          f'{result["settle"]} cycles '
                          f'({time.perf_counter() - t0:.1f} s with setup); '
                          f'first cycle: {result["first"]}',
                          file=sys.stderr, flush=True)
                    if args.show_sql:
                        for what in ('first', 'steady'):
                            print(f'#  {what} cycle:', file=sys.stderr)
                            for statement, times in result[
                                    f'{what}_sql'][3].items():
                                print(f'#   {times:3d} x {statement}',
                                      file=sys.stderr)
                    if profile:
                        print(f'# profile of one steady-state cycle: {profile}',
                              file=sys.stderr)
                        pstats.Stats(profile, stream=sys.stderr).sort_stats(
                            'cumulative').print_stats(30)

    failed = list(problems)
    print('| ring | backend | nodes | services | first cycle s '
          '| first cycle SQL | steady s | steady SQL | steady fetched '
          '| target |')
    print('|---|---|---:|---:|---:|---|---:|---|---:|---|')
    for ring_kind, backend, count, n_services, r in results:
        target = TARGETS.get((ring_kind, count, n_services))
        verdict = ''
        if target is not None:
            ok = r['steady_s'] <= target[0] and r['steady_sql'][0] <= target[1]
            verdict = (f'{"PASS" if ok else "FAIL"} (≤ {target[0]:g} s, '
                       f'≤ {target[1]} SQL)')
            if not ok:
                failed.append(f'{ring_kind} ring, {backend}, {count} nodes, '
                              f'{n_services} services')
        print(f'| {ring_kind} | {backend} | {count:,} | {n_services} | '
              f'{r["first_s"]:.3f} | {fmt_sql(r["first_sql"])} | '
              f'{r["steady_s"]:.3f} | {fmt_sql(r["steady_sql"])} | '
              f'{r["fetched"]:,} | {verdict} |')
    checked = collections.Counter(
        (k, c, s) in TARGETS for k, _, c, s, _ in results)[True]
    print(f'\n{len(results)} scenarios, {checked} with a target, '
          f'{len(failed)} failed; total {time.perf_counter() - started:.0f} s '
          f'({datetime.date.today()}, {os.cpu_count()} CPUs)')
    for message in skipped:
        print(f'SKIPPED {message}')
    for failure in failed:
        print(f'FAIL: {failure}')
    return 1 if failed and not args.no_fail else 0


if __name__ == '__main__':
    sys.exit(main())
