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

"""Benchmark the Placement report (issue 28, item 4) on a real Placement.

Starts a standalone Placement (ironic_compute/harness/placement.py: its own
venv, gunicorn with two workers, a fresh MariaDB database) and, for each
size (10^3 and 10^4 nodes; --quick: 10^3), measures with the service's own
code (placement/sync.py, placement/claims.py) beside a plain client doing
the same requests (the ceiling):

* the ceiling: the provider writes a first sync makes (POST, then PUT
  inventories, traits, aggregates) from a plain client on 4 threads,
  requests per second;
* the first sync of every node: seconds, requests, requests per second;
* a steady cycle (no node changed): requests and seconds; the same at a
  refresh (the one listing);
* one changed node: requests;
* a restart (every provider read again, none written): seconds, requests;
* scheduling: ``Claims.claim_one`` (candidates in the group's aggregate,
  the claim, the check after it) beside a plain client's
  ``GET /allocation_candidates`` and ``PUT /allocations``, median ms; the
  target is within 1.5x of the plain client.

    python tools/bench_placement.py [--quick] [--sizes 1000,10000]
"""

import argparse
import concurrent.futures
import dataclasses
import statistics
import sys
import tempfile
import time
import uuid

import requests
from oslo_config import cfg

from ironic_compute import conf as ic_conf
from ironic_compute.harness import bench
from ironic_compute.harness import databases
from ironic_compute.harness import placement as standalone
from ironic_compute.placement import claims as placement_claims
from ironic_compute.placement import client as placement_client
from ironic_compute.placement import provider
from ironic_compute.placement import sync as placement_sync

SIZES = (1_000, 10_000)
THREADS = 4
CLAIMS = 30
TARGET = 1.5  # claim_one within this factor of the plain client
HEADERS = {'X-Auth-Token': standalone.TOKEN, 'Accept': 'application/json',
           'OpenStack-API-Version': f'placement {placement_client.MICROVERSION}'}


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def plain_session():
    session = requests.Session()
    session.headers.update(HEADERS)
    return session


def ceiling(url, count, resource_class, aggregate):
    """Requests per second of the first-sync writes of ``count`` providers
    from a plain client on THREADS threads."""
    sessions = [plain_session() for _ in range(THREADS)]
    inventory = {resource_class: {'total': 1, 'reserved': 0, 'max_unit': 1}}
    sessions[0].put(f'{url}/resource_classes/{resource_class}').raise_for_status()

    def one(index):
        session = sessions[index % THREADS]
        uuid_ = str(uuid.uuid4())
        gen = session.post(f'{url}/resource_providers',
                           json={'uuid': uuid_, 'name': uuid_}).json()['generation']
        for what, body in (('inventories', {'inventories': inventory}),
                           ('traits', {'traits': ['COMPUTE_NODE']}),
                           ('aggregates', {'aggregates': [aggregate]})):
            answer = session.put(f'{url}/resource_providers/{uuid_}/{what}',
                                 json={'resource_provider_generation': gen, **body})
            answer.raise_for_status()
            gen = answer.json()['resource_provider_generation']
        return uuid_

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        made = list(pool.map(one, range(count)))
    seconds = time.monotonic() - started
    for uuid_ in made:
        sessions[0].delete(f'{url}/resource_providers/{uuid_}')
    return 4 * count / seconds


def plain_claim(session, url, resource_class, aggregate):
    """A plain client's claim: the candidates, then the first one."""
    found = session.get(f'{url}/allocation_candidates', params={
        'resources': f'{resource_class}:1', 'member_of': aggregate}).json()
    for request in found['allocation_requests']:
        node = next(iter(request['allocations']))
        consumer = str(uuid.uuid4())
        answer = session.put(f'{url}/allocations/{consumer}', json={
            'allocations': {node: {'resources': {resource_class: 1}}},
            'project_id': 'bench', 'user_id': 'bench',
            'consumer_generation': None, 'consumer_type': 'INSTANCE'})
        if answer.status_code == 204:
            return consumer
    raise bench.BenchError('the plain client found no free provider')


def run_size(server, client, count):
    group = f'bench-{count}-{uuid.uuid4().hex[:6]}'
    nodes = [dataclasses.replace(n, conductor_group=group, power_state='power off')
             for n in bench.make_nodes(count)]
    by_uuid = {n.uuid: n for n in nodes}
    resource_class = provider.normalize_resource_class(nodes[0].resource_class)
    aggregate = provider.aggregate_uuid(group)
    row = {'nodes': count}
    row['ceiling'] = ceiling(server.url, max(200, count // 20), resource_class,
                             aggregate)
    clock = Clock()
    sync = placement_sync.ProviderSync(client, budget=float('inf'), clock=clock)
    started = time.monotonic()
    stats = sync.run(by_uuid)
    row['first_s'] = time.monotonic() - started
    row['first_requests'] = stats.requests
    row['first_rate'] = stats.requests / row['first_s']
    if stats.created != count or stats.failed:
        raise bench.BenchError(f'first sync: {stats}')
    started = time.monotonic()
    row['steady_requests'] = sync.run(by_uuid).requests
    row['steady_ms'] = 1000 * (time.monotonic() - started)
    clock.now += sync.refresh_interval + 1
    row['refresh_requests'] = sync.run(by_uuid).requests
    changed = nodes[0]
    by_uuid[changed.uuid] = dataclasses.replace(changed, maintenance=True)
    row['changed_requests'] = sync.run(by_uuid).requests
    restarted = placement_sync.ProviderSync(client, budget=float('inf'))
    started = time.monotonic()
    stats = restarted.run(by_uuid)
    row['restart_s'] = time.monotonic() - started
    row['restart_requests'] = stats.requests
    if stats.created or stats.updated:
        raise bench.BenchError(f'a restart wrote: {stats}')
    # Scheduling, one claim after the other, each released at once.
    claims = placement_claims.Claims(client)
    session = plain_session()
    ours, plain = [], []
    for _ in range(CLAIMS):
        instance = str(uuid.uuid4())
        started = time.monotonic()
        node = claims.claim_one(instance, nodes[0].resource_class, (), group,
                                None, 'bench', 'bench')
        ours.append(1000 * (time.monotonic() - started))
        if node is None:
            raise bench.BenchError('claim_one found no free node')
        claims.release(instance)
        started = time.monotonic()
        consumer = plain_claim(session, server.url, resource_class, aggregate)
        plain.append(1000 * (time.monotonic() - started))
        session.delete(f'{server.url}/allocations/{consumer}')
    row['claim_ms'] = statistics.median(ours)
    row['plain_claim_ms'] = statistics.median(plain)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='10^3 nodes only')
    parser.add_argument('--sizes', default=','.join(map(str, SIZES)))
    parser.add_argument('--no-fail', action='store_true', help='always exit 0')
    args = parser.parse_args(argv)
    sizes = [1000] if args.quick else [int(s) for s in args.sizes.split(',')]
    database = databases.ProvisionedDatabase('mysql')
    server = standalone.PlacementServer(tempfile.mkdtemp(prefix='bench-placement-'),
                                        database.url, log=bench.say)
    rows = []
    try:
        server.start()
        conf = cfg.ConfigOpts()
        ic_conf.register_opts(conf)
        with tempfile.NamedTemporaryFile('w', suffix='.conf') as f:
            f.write('[placement]\n' + ''.join(f'{k} = {v}\n'
                                             for k, v in server.config().items()))
            f.flush()
            conf(['--config-file', f.name])
        client = placement_client.PlacementClient(conf)
        for count in sizes:
            bench.say(f'{count} nodes...')
            rows.append(run_size(server, client, count))
            bench.say(f'  {rows[-1]}')
    except bench.BenchError as exc:
        bench.say(f'error: {exc}')
        return 1
    finally:
        server.stop()
        database.drop()
    bench.say()
    bench.say('| nodes | ceiling (plain client, 4 threads) | first sync | steady cycle '
              '| at a refresh | one changed node | restart | claim_one | plain claim |')
    bench.say('| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
    failed = False
    for r in rows:
        ratio = r['claim_ms'] / r['plain_claim_ms']
        failed |= ratio > TARGET
        bench.say(
            f"| {r['nodes']:,} | {r['ceiling']:.0f} req/s "
            f"| {r['first_s']:.1f} s, {r['first_requests']:,} req, "
            f"{r['first_rate']:.0f} req/s "
            f"| {r['steady_requests']} req, {r['steady_ms']:.0f} ms "
            f"| {r['refresh_requests']} req | {r['changed_requests']} req "
            f"| {r['restart_s']:.1f} s, {r['restart_requests']:,} req "
            f"| {r['claim_ms']:.0f} ms ({ratio:.2f}x) | {r['plain_claim_ms']:.0f} ms |")
    return 0 if args.no_fail or not failed else 1


if __name__ == '__main__':
    sys.exit(main())
