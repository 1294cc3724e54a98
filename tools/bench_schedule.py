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

"""Benchmark scheduling: ``instance create``'s choice and insert, at scale.

For each backend (PostgreSQL, MariaDB) and cloud size (10^3, 10^4, 10^5
nodes), a fresh database gets 100 live services and the nodes' rows,
inserted directly (round robin over the services, every node free, as in
issue 19's measurements). Then it calls the function ``instance create``
calls (``db_scheduling.schedule_and_create``):

* one client, one request after the other: median ms per request and the
  statements each one runs;
* 10 clients at once: requests per second over all of them.

The instances made are deleted between the two. Prints a markdown table
beside the figures issue 19 measured before scheduling was done in SQL,
and exits non-zero when a target fails, unless --no-fail. Reuses the
benchmarks' helpers (ironic_compute/harness/bench.py).

The request asks for a capability every node has (boot_mode=uefi, as
bench.make_nodes gives them), so that it is matched in SQL on every node
without changing which nodes fit; --no-capabilities asks without it.

    python tools/bench_schedule.py [--quick] [--backends postgresql,mysql]
                                   [--sizes 1000,10000] [--no-capabilities]
                                   [--no-fail]
"""

import concurrent.futures
import dataclasses
import gc
import statistics
import sys
import time
import uuid

import sqlalchemy as sa

from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import migration
from ironic_compute.db import models
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.db import services as db_services
from ironic_compute.harness import bench
from ironic_compute.instances import model as inst

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)
BACKENDS = ('postgresql', 'mysql')
SERVICES = 100
SEQUENTIAL = 60
WARM_UP = 5
CLIENTS = 10
PER_CLIENT = 20
SERVICE_DOWN_TIME = 3600  # every service stays live for the whole run
SPEC = inst.RequestSpec(resource_class='baremetal', vcpus=16,
                        capabilities={'boot_mode': 'uefi'})

# Issue 19: the same function before this change, every node free.
# (backend, nodes) -> (median ms per request, requests/s with 10 clients)
BEFORE = {('postgresql', 1_000): (10.8, 84.5),
          ('postgresql', 10_000): (69.5, 11.6),
          ('postgresql', 100_000): (946, 1.0),
          ('mysql', 1_000): (15.1, 60.6),
          ('mysql', 10_000): (111.3, 7.8),
          ('mysql', 100_000): (1257, 0.77)}
# The targets at the largest size, and how far it may be from the smallest.
MAX_MS = 20.0
MIN_RPS = 50.0
FLAT = 1.5


def request():
    db_scheduling.schedule_and_create(
        db_api.Context(), str(uuid.uuid4()), 'bench', SPEC, '',
        SERVICE_DOWN_TIME)


def forget_instances(engine):
    with engine.begin() as conn:
        conn.execute(models.instances.delete())


def setup(engine, count):
    migration.upgrade('head', engine=engine)
    hosts = bench.host_names(SERVICES)
    service_ids = {h: db_services.register(db_api.Context(), h) for h in hosts}
    nodes = bench.make_nodes(count)
    owner_of = {n.uuid: hosts[i % SERVICES] for i, n in enumerate(nodes)}
    # Every node free, as in issue 19's table (make_nodes deploys some).
    free = db_nodes.SYNCED_FIELDS.index('available')
    fields = {uuid: values[:free] + (True,) + values[free + 1:]
              for uuid, values in bench.node_fields(nodes).items()}
    bench.populate(engine, service_ids, fields, owner_of, None, 'node')
    with engine.begin() as conn:
        # Planner statistics, as the servers would gather after the insert.
        conn.execute(sa.text('ANALYZE' if engine.dialect.name == 'postgresql'
                             else 'ANALYZE TABLE compute_nodes, instances'))


def sequential(engine, counter):
    for _ in range(WARM_UP):
        request()
    gc.collect()
    seconds = []
    counter.reset()
    for _ in range(SEQUENTIAL):
        started = time.perf_counter()
        request()
        seconds.append(time.perf_counter() - started)
    statements = counter.statements / SEQUENTIAL
    forget_instances(engine)
    return statistics.median(seconds) * 1000, statements


def with_clients(engine):
    def client(_):
        for _ in range(PER_CLIENT):
            request()
    gc.collect()
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    rate = CLIENTS * PER_CLIENT / (time.perf_counter() - started)
    forget_instances(engine)
    return rate


def run(backend, count):
    database = bench.provision(backend)
    try:
        manager = db_api.facade().make_new_manager()
        manager.configure(connection=database.url, max_retries=0,
                          max_pool_size=CLIENTS + 2)
        reset = db_api.facade().patch_factory(manager)
        engine = manager.writer.get_engine()
        try:
            setup(engine, count)
            counter = bench.SqlCounter(engine)
            ms, statements = sequential(engine, counter)
            return ms, with_clients(engine), statements
        finally:
            reset()
            engine.dispose()
    finally:
        database.drop()


def judge(results):
    """The targets that failed, one line each."""
    problems = []
    for backend in {b for b, _ in results}:
        sizes = sorted(n for b, n in results if b == backend)
        small, large = results[backend, sizes[0]], results[backend, sizes[-1]]
        ms, rate, _ = large
        if sizes[-1] == SIZES[-1]:
            if ms > MAX_MS:
                problems.append(f'{backend}: {ms:.1f} ms per request at '
                                f'{sizes[-1]:,} nodes (target <= {MAX_MS:g})')
            if rate < MIN_RPS:
                problems.append(f'{backend}: {rate:.1f} requests/s at '
                                f'{sizes[-1]:,} nodes (target >= {MIN_RPS:g})')
        if ms > FLAT * small[0] or rate < small[1] / FLAT:
            problems.append(f'{backend}: {sizes[-1]:,} nodes not within '
                            f'{FLAT:g}x of {sizes[0]:,} ({ms:.1f} vs '
                            f'{small[0]:.1f} ms, {rate:.1f} vs {small[1]:.1f}'
                            ' requests/s)')
    return problems


def table(results):
    lines = ['| nodes | backend | ms/request (median) | before | '
             'req/s, 10 clients | before | statements/request |',
             '|---|---|---|---|---|---|---|']
    for (backend, count), (ms, rate, statements) in sorted(
            results.items(), key=lambda item: (item[0][1], item[0][0])):
        before_ms, before_rate = BEFORE[backend, count]
        name = 'MariaDB' if backend == 'mysql' else 'PostgreSQL'
        lines.append(f'| {count:,} | {name} | {ms:.1f} | {before_ms:g} | '
                     f'{rate:.1f} | {before_rate:g} | {statements:g} |')
    return '\n'.join(lines)


def main(argv=None):
    global SPEC
    parser = bench.parser(__doc__.splitlines()[0], QUICK_SIZES, BACKENDS)
    parser.add_argument('--sizes', help='comma-separated node counts '
                        '(default: ' + ','.join(map(str, SIZES)) + ')')
    parser.add_argument('--no-capabilities', action='store_true',
                        help='a request without capabilities')
    args = parser.parse_args(argv)
    backends = bench.chosen(parser, args.backends, BACKENDS)
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.sizes:
        sizes = tuple(int(size) for size in bench.chosen(
            parser, args.sizes, [str(size) for size in SIZES], 'sizes'))
    if args.no_capabilities:
        SPEC = dataclasses.replace(SPEC, capabilities=())
    results, problems = {}, []
    for backend in backends:
        try:
            bench.provision(backend).drop()
        except bench.Unavailable as exc:
            print(f'SKIP {backend}: {exc}', file=sys.stderr, flush=True)
            problems.append(f'{backend}: not reachable')
            continue
        for count in sizes:
            results[backend, count] = run(backend, count)
            ms, rate, statements = results[backend, count]
            print(f'# {backend}, {count:,} nodes, {SERVICES} services: '
                  f'{ms:.1f} ms/request, {rate:.1f} requests/s with '
                  f'{CLIENTS} clients, {statements:g} statements/request',
                  flush=True)
    print(table(results))
    problems += judge(results)
    for problem in problems:
        print(f'FAIL {problem}')
    return 0 if args.no_fail or not problems else 1


if __name__ == '__main__':
    sys.exit(main())
