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

"""Three daemons on a three-node Galera cluster, every node a writer.

A MariaDB Galera cluster of its own (tests/functional/galera.py: three
``mariadbd`` on loopback, free ports, own data directories, stopped at
the end) holds the database. Each daemon writes to its own Galera node;
``instance create`` runs on all three in turn; three samplers, one per
node, read with ``wsrep_sync_wait = 1`` (causal reads). Nothing here
waits on a lock another node holds: two writers of one row on two nodes
both go ahead, and Galera's certification aborts one at commit with a
deadlock error (1213), which the project's writers retry
(``db_api.writer``). The tests of the class share one cluster and each
first builds the state it needs, so any one of them runs alone:

1. ownership: every node held by exactly one live service, 4/4/4, in
   every sample of every node; every Galera node took writes;
2. a burst of builds for the last free nodes, the CLI spread over the three
   Galera nodes: each free node is built on once, the rest refused;
3. ``kill -9`` of a daemon: the survivors take its nodes and instances;
4. write conflicts injected from another Galera node on the rows the
   daemons write (services, compute_nodes, instances): the daemons retry
   them, with no ERROR and no traceback in their logs.

On CI (``CI=true``) a missing ``mariadbd`` or Galera library fails the
module; elsewhere it skips, naming what to install (tools/test-setup.sh).
"""

import collections
import concurrent.futures
import json
import secrets
import threading
import time

import pytest
import sqlalchemy as sa

# The harness (daemons, Ironic, InstanceCluster): imported here only.
from tests.functional import daemons
from tests.functional import galera as galera_env
from tests.functional import ironic_env
from tests.functional import test_instances
from tests.functional.test_instances import InstanceCluster

HOSTS = test_instances.HOSTS
# Bounded loads give 12 nodes on 3 services 4/4/4 exactly (at most
# max(ceil(4), floor(1.1 * 4)) = 4 each).
NODES = 12
BURST = NODES + 4  # builds asked for at once: four more than free nodes
# Conflicts are injected for at least CONFLICT_SECONDS, and on until the
# daemons ran RETRIES_WANTED transactions again, or CONFLICT_MAX_SECONDS.
CONFLICT_SECONDS = 10
CONFLICT_MAX_SECONDS = 45
RETRIES_WANTED = 3
# Seconds between two of an injector's writes.
INJECT_PAUSE = 0.01
SETTLE = test_instances.SETTLE

_services = sa.table('services', sa.column('host'), sa.column('updated_at'),
                     sa.column('deleted'))
_nodes = sa.table('compute_nodes', sa.column('host'), sa.column('updated_at'),
                  sa.column('deleted'))
_instances = sa.table('instances', sa.column('host'), sa.column('updated_at'),
                      sa.column('deleted'))


class _GaleraDatabase:
    """A database on the Galera cluster, as db_fixtures.ProvisionedDatabase."""

    def __init__(self, galera):
        self.galera = galera
        self.name = 'ictest_' + secrets.token_hex(6)
        galera.create_database(self.name)
        self.url = galera.sync_wait_url(1, self.name)

    def node_url(self, index, sync_wait=False):
        return self.galera.url(index, self.name, sync_wait)

    def drop(self):
        self.galera.drop_database(self.name)


class GaleraInstanceCluster(InstanceCluster):
    """InstanceCluster with daemon i on Galera node i, the CLI on any node
    and a causal sampler on every node."""

    node_count = NODES

    def __init__(self, galera, workdir, ironic):  # all of InstanceCluster's, on Galera
        self.galera = galera
        self.backend = 'galera'
        self.workdir = workdir
        self.client = ironic.client()
        self.prefix = f'galera-{secrets.token_hex(3)}'
        self.database = _GaleraDatabase(galera)
        self.engine = sa.create_engine(self.database.url, poolclass=sa.pool.NullPool)
        self.node_of = {host: i + 1 for i, host in enumerate(HOSTS)}
        self.nodes = []
        if ironic.managed:  # the 4/4/4 premise counts on our nodes being all of the group
            left = [n['uuid'] for n in ironic_env.list_nodes(
                self.client, fields=['uuid'], conductor_group=test_instances.GROUP)]
            ironic_env.delete_nodes(self.client, left)
        self.nodes = ironic_env.create_nodes(self.client, self.node_count,
                                             test_instances.GROUP, name_prefix=self.prefix)
        ironic_env.make_buildable(self.client, self.nodes)
        target = ironic.url.split('//', 1)[1].rstrip('/')
        target_host, target_port = target.rsplit(':', 1)
        self.proxies = {}
        self.daemons = {}
        for host in HOSTS:
            proxy = self.proxies[host] = daemons.TcpProxy(target_host, int(target_port))
            proxy.start()
            self.daemons[host] = daemons.Daemon(host, workdir, self._options(
                host, f'http://127.0.0.1:{proxy.port}', self.database.node_url(self.node_of[host])))
        # One CLI configuration per Galera node; manage() uses the first.
        self.manage_configs = []
        for index in range(1, galera.size + 1):
            path = f'{workdir}/manage-{index}.conf'
            with open(path, 'w') as f:
                f.write(daemons.config_text({
                    'DEFAULT': {'service_down_time': test_instances.SERVICE_DOWN_TIME,
                                'report_interval': test_instances.REPORT_INTERVAL},
                    'database': {'connection': self.database.node_url(index)}}))
            self.manage_configs.append(path)
        self.manage_config = self.manage_configs[0]
        # sampler (node 1) is the one InstanceCluster checks; the others
        # read the same rows on nodes 2 and 3.
        self.samplers = [daemons.InstanceSampler(galera.sync_wait_url(i, self.database.name))
                         for i in range(1, galera.size + 1)]
        self.sampler = self.samplers[0]

    def _options(self, host, *urls):
        options = super()._options(host, *urls)
        # oslo.db says at DEBUG when it runs a transaction again.
        options['DEFAULT']['debug'] = True
        return options

    def start(self):
        for sampler in self.samplers[1:]:
            sampler.start()
        super().start()

    def create_on(self, index, name, *args):
        """``instance create`` through Galera node ``index``; (completed
        process, record or None, seconds it took)."""
        started = time.monotonic()
        done = daemons.manage(self.manage_configs[index - 1], 'instance', 'create',
                              '--name', name, '--resource-class',
                              test_instances.RESOURCE_CLASS, '--format', 'json', *args)
        record = json.loads(done.stdout) if done.stdout.strip() else None
        return done, record, time.monotonic() - started

    def violations(self):
        found = {}
        for index, sampler in enumerate(self.samplers, 1):
            found.update({f'node {index}: {k}': v for k, v in sampler.violations().items()})
        return found

    def close(self):
        try:
            super().close()
        finally:
            for sampler in self.samplers[1:]:
                sampler.close()


def wsrep_status(galera, name):
    """{node index: int value of the wsrep status variable ``name``}."""
    values = {}
    for node in galera.nodes:
        with galera.engine(node.index).connect() as conn:
            row = conn.execute(sa.text('SHOW GLOBAL STATUS LIKE :name'), {'name': name}).one()
        values[node.index] = int(row[1])
    return values


@pytest.fixture(scope='module')
def galera():
    why = galera_env.missing()
    if why:
        if ironic_env.on_ci():
            pytest.fail(f'CI=true and {why}', pytrace=False)
        pytest.skip(why)
    started = time.monotonic()
    cluster = galera_env.GaleraCluster()
    try:
        cluster.start()
        print(f'Galera: {cluster.size} nodes Synced in {time.monotonic() - started:.1f} s')
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope='module')
def started_cluster(galera, ironic_server, tmp_path_factory):
    def on_galera(backend, workdir, ironic):
        return GaleraInstanceCluster(galera, workdir, ironic)

    try:
        with daemons.running(on_galera, 'galera', ironic_server,
                             tmp_path_factory) as cluster:
            yield cluster
    finally:
        print(galera.logs(1500))



def logs_since(cluster, offsets):
    return {host: daemon.log()[offsets.get(host, 0):]
            for host, daemon in cluster.daemons.items()}


def assert_clean(logs, when):
    for host, text in logs.items():
        bad = [line for line in text.splitlines()
               if ' ERROR ' in line or 'Traceback' in line]
        assert not bad, f'{when}: {host} logged:\n' + '\n'.join(bad[:10])


class TestGalera:
    def test_ownership_on_three_writers(self, cluster, galera):
        cluster.with_free_nodes(NODES)  # no instance pins a node
        cluster.wait_stable()
        replicated = wsrep_status(galera, 'wsrep_replicated')
        rows = cluster.node_rows()
        holders = collections.Counter(host for host, _ in rows.values())
        assert sorted(rows) == sorted(cluster.nodes), rows
        assert holders == {host: NODES // len(HOSTS) for host in HOSTS}, holders
        # The three causal samplers agree on who holds what.
        snapshots = [sampler.fresh_snapshot() for sampler in cluster.samplers]
        assert snapshots[0] == snapshots[1] == snapshots[2], snapshots
        found = cluster.violations()
        assert not found, found
        # Every Galera node takes writes: each daemon heartbeats to its own.
        daemons.wait_until(
            lambda: all(wsrep_status(galera, 'wsrep_replicated')[i] > replicated[i]
                        for i in replicated),
            SETTLE, message='writes replicated from every Galera node')
        print(f'samples per Galera node: {[s.samples for s in cluster.samplers]}')

    def test_burst_for_the_last_free_nodes(self, cluster, galera):
        cluster.with_free_nodes(NODES)
        free = cluster.free_nodes()
        assert len(free) == NODES, free
        offsets = {host: len(d.log()) for host, d in cluster.daemons.items()}
        requests = [(i % galera.size + 1, f'burst-{i}') for i in range(BURST)]
        with concurrent.futures.ThreadPoolExecutor(test_instances.PARALLEL_CLI) as pool:
            timed = list(pool.map(lambda r: cluster.create_on(*r), requests))
        results = [(done, record) for done, record, _ in timed]
        seconds = sorted(t for _, _, t in timed)
        placed = test_instances.placed_or_refused(results)
        # Every build that can be placed is placed: one per free node, and
        # every one reported is recorded.
        recorded = cluster.instances()
        assert len(placed) == len(free), (
            f'instance create reported {len(placed)} instances for {len(free)} free '
            f'nodes, {len([r for r in placed if r["uuid"] in recorded])} of them recorded')
        assert all(r['uuid'] in recorded for r in placed), 'reported, never recorded'
        assert {record['host'] for record in placed} <= set(HOSTS)
        ended = cluster.wait_done([r['uuid'] for r in placed])
        won = [i for i in ended.values() if i.vm_state == 'active']
        print(f'{BURST} builds through 3 Galera nodes for {len(free)} free nodes: '
              f'{len(won)} built, {BURST - len(placed)} refused; instance create took '
              f'{seconds[0]:.1f} to {seconds[-1]:.1f} s (median {seconds[len(seconds) // 2]:.1f})')
        assert len(won) == len(placed), ended
        assert sorted(i.node for i in won) == sorted(free), 'every free node once'
        assert test_instances.per_host(won) == collections.Counter(free.values())
        cluster.assert_consistent('after the burst')
        assert not cluster.violations()
        assert cluster.free_nodes() == {}
        assert_clean(logs_since(cluster, offsets), 'the burst')

    def test_kill9_and_takeover(self, cluster):
        # An instance on every node: the victim, back, has none to take.
        cluster.with_no_free_node()
        before = cluster.instances()
        victim_host = HOSTS[1]
        survivors = tuple(h for h in HOSTS if h != victim_host)
        mine = sorted(u for u, i in before.items() if i.host == victim_host)
        assert mine, before
        victim = cluster.daemons[victim_host]
        killed_at = time.monotonic()
        victim.kill()

        def taken_over():
            cluster.check_daemons()
            live = cluster.instances()
            rows = cluster.node_rows()
            return (all(live[u].host in survivors and live[u].vm_state == 'active'
                        and live[u].task_state is None
                        and rows[live[u].node][0] == live[u].host for u in mine)
                    and all(host in survivors for host, _ in rows.values()))

        daemons.wait_until(taken_over, test_instances.TAKEOVER_WAIT, 0.5, 'the takeover')
        print(f'{len(mine)} instances and the nodes of {victim_host} taken over '
              f'{time.monotonic() - killed_at:.1f} s after kill -9')
        after = cluster.instances()
        assert {u: i.node for u, i in after.items()} == {u: i.node for u, i in before.items()}
        cluster.assert_consistent('after the takeover')
        assert not cluster.violations()

        # Back, it takes nothing back: every node carries a survivor's instance.
        cycles = victim.count_in_log('Cycle: ')
        victim.start()
        daemons.wait_until(lambda: victim.count_in_log('Cycle: ') >= cycles + 3, SETTLE,
                           message=f'three cycles of the restarted {victim_host}')
        assert not [i for i in cluster.instances().values() if i.host == victim_host]
        assert victim_host not in {host for host, _ in cluster.node_rows().values()}
        cluster.assert_consistent(f'after {victim_host} came back')

    def test_injected_write_conflicts_are_retried(self, cluster, galera):
        offsets = {host: len(d.log()) for host, d in cluster.daemons.items()}
        aborts_before = {name: wsrep_status(galera, name) for name in (
            'wsrep_local_cert_failures', 'wsrep_local_bf_aborts')}
        # Each daemon's rows are written from another Galera node than its own.
        engines = {n: sa.create_engine(galera.url(n, cluster.database.name),
                                       poolclass=sa.pool.NullPool) for n in (1, galera.size)}
        injectors = [Injector(engines[galera.size if n == 1 else 1], host)
                     for host, n in cluster.node_of.items()]
        started = time.monotonic()
        for injector in injectors:
            injector.start()

        def retried():
            # oslo.db's DEBUG line for each transaction run again.
            return sum(text.count('Performing DB retry')
                       for text in logs_since(cluster, offsets).values())

        while time.monotonic() - started < CONFLICT_MAX_SECONDS and (
                time.monotonic() - started < CONFLICT_SECONDS
                or retried() < RETRIES_WANTED):
            cluster.check_daemons()
            time.sleep(1)
        for injector in injectors:
            injector.close()
        elapsed = time.monotonic() - started
        for engine in engines.values():
            engine.dispose()
        aborted = {name: {i: wsrep_status(galera, name)[i] - before[i] for i in before}
                   for name, before in aborts_before.items()}
        logs = logs_since(cluster, offsets)
        retries = {host: text.count('Performing DB retry') for host, text in logs.items()}
        print(f'injected {sum(i.commits for i in injectors)} writes in {elapsed:.0f} s '
              f'({sum(i.conflicts for i in injectors)} of them aborted); local aborts per '
              f'Galera node: {aborted}; daemon transactions run again: {retries}')
        assert all(i.commits for i in injectors), [(i.host, i.errors) for i in injectors]
        assert sum(retries.values()) > 0, 'no daemon transaction was aborted: nothing tested'
        assert_clean(logs, 'the injected conflicts')
        # The daemons went on cycling all along.
        for host, text in logs.items():
            assert text.count('Cycle: ') >= 2, (host, text[-2000:])
        cluster.check_daemons()
        cluster.assert_consistent('after the injected conflicts')
        assert not cluster.violations()
        # Over the whole run: no traceback at all.
        for host, daemon in cluster.daemons.items():
            assert 'Traceback' not in daemon.log(), host


class Injector(threading.Thread):
    """Touches ``updated_at`` of a host's rows in a loop: short transactions
    on another Galera node that conflict with the host's own writes."""

    def __init__(self, engine, host):
        super().__init__(daemon=True)
        self.engine = engine
        self.host = host
        self.commits = 0
        self.conflicts = 0
        self.errors = []
        self._halt = threading.Event()

    def run(self):
        now = sa.func.utc_timestamp(6)
        while not self._halt.is_set():
            try:
                with self.engine.connect() as conn:
                    while not self._halt.is_set():
                        # The services row (heartbeats, cycles) in each
                        # transaction, its compute_nodes and instances rows
                        # in every tenth.
                        tables = (_services,) if self.commits % 10 else (
                            _services, _nodes, _instances)
                        with conn.begin():
                            for table in tables:
                                conn.execute(table.update().where(
                                    table.c.host == self.host, table.c.deleted == 0)
                                    .values(updated_at=now))
                        self.commits += 1
                        # A pause between writes: a few dozen conflicting writes a
                        # second per row is contention no real writer comes near,
                        # and still aborts the daemons' transactions every second
                        # or so. Without it (some 300 a second) a heartbeat could
                        # lose ten certifications in a row and run out of retries.
                        self._halt.wait(INJECT_PAUSE)
            except sa.exc.DBAPIError as exc:
                if '1213' in str(exc.orig):
                    self.conflicts += 1
                else:
                    self.errors.append(str(exc.orig)[:200])
                    self._halt.wait(0.1)

    def close(self):
        self._halt.set()
        self.join(10)
