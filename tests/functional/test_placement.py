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

"""Three real ironic-compute processes, the real Ironic and the real
Placement, on MariaDB and PostgreSQL.

The daemons manage conductor group "group-b" and report to the session's
Placement. After their first cycles the providers of the group's aggregate
are exactly Ironic's nodes, with the inventory, reserved flag and traits
the rules give; a service killed with kill -9 makes no provider deleted or
created (read in Placement's own table: every provider keeps its row id)
while its successor keeps them up to date; a node deleted in Ironic loses
its provider; builds claim their node and deletes give it back, and a
burst of creates from two CLI processes claims each free node once. The
Placement is the session's (harness/placement.py); the
tests of the class share one cluster per backend, and each starts from the
state ``ready()`` builds.
"""

import concurrent.futures
import dataclasses
import json
import threading
import uuid as uuidlib

import pytest
import sqlalchemy as sa
from oslo_config import cfg

from ironic_compute import conf as ic_conf
from ironic_compute.db import models
from ironic_compute.harness import fakes
from ironic_compute.placement import claims as placement_claims
from ironic_compute.placement import client as placement_client
from ironic_compute.placement import provider
from ironic_compute.placement import sync as placement_sync
from tests.functional import daemons
from tests.functional import ironic_env
from tests.functional.placement_env import placement_server  # noqa: F401

GROUP = 'group-b'
AGGREGATE = provider.aggregate_uuid(GROUP)
HOSTS = ('compute-1', 'compute-2', 'compute-3')
SERVICE_DOWN_TIME = 8
CYCLE = 1
FREE, ENROLLED = 5, 4  # nodes made available and powered off; left in enroll
TRAIT = 'CUSTOM_PLACEMENT_TEST'
RESOURCE_CLASS = provider.normalize_resource_class(ironic_env.DEFAULT_RESOURCE_CLASS)
_instances = models.instances


class Cluster(daemons.BackendFleet):
    placement = None  # the session's PlacementServer, set by the fixture

    def __init__(self, backend, workdir, ironic):
        super().__init__(backend, workdir, ironic)
        prefix = f'pl-{backend}-{uuidlib.uuid4().hex[:6]}'
        self.free = ironic_env.create_nodes(self.client, FREE, GROUP,
                                            name_prefix=prefix + '-f')
        self.enrolled = ironic_env.create_nodes(self.client, ENROLLED, GROUP,
                                                name_prefix=prefix + '-e')
        self.nodes = self.free + self.enrolled
        ironic_env.make_buildable(self.client, self.free)
        self.client.node.add_trait(self.free[0], TRAIT)
        self.placement_db = sa.create_engine(self.placement.database.url,
                                             poolclass=sa.pool.NullPool)
        # The CLI reaches Ironic and Placement too (placement audit).
        with open(self.manage_config, 'a') as f:
            f.write(daemons.config_text({
                'ironic': {'auth_type': 'none', 'endpoint_override': ironic.url,
                           'partition_key': GROUP, 'api_max_retries': 0},
                'placement': self.placement.config()}))
        for host in HOSTS:
            self.add(host, {
                'DEFAULT': {'host': host, 'report_interval': 1,
                            'service_down_time': SERVICE_DOWN_TIME,
                            'update_resources_interval': CYCLE,
                            'state_path': self.workdir},
                'database': {'connection': self.db_url},
                'ironic': {'auth_type': 'none',
                           'endpoint_override': ironic.url,
                           'partition_key': GROUP, 'api_max_retries': 0,
                           'timeout': 5},
                'hash_ring': {'partition_exponent': 12},
                'placement': self.placement.config(),
            })

    def expected(self, uuid, maintenance=False):
        """What the provider of ``uuid`` should hold."""
        reserved = int(maintenance or uuid not in self.free)
        return {'inventories': {RESOURCE_CLASS: {
                    'total': 1, 'reserved': reserved, 'min_unit': 1,
                    'max_unit': 1, 'step_size': 1, 'allocation_ratio': 1.0}},
                'traits': {'COMPUTE_NODE'} | ({TRAIT} if uuid == self.free[0] else set()),
                'aggregates': {AGGREGATE}}

    def providers_match(self, changed=None):
        """True when the group's providers are exactly our nodes, each
        holding what it should (``changed``: {uuid: maintenance})."""
        self.check_daemons()
        if set(self.placement.providers(member_of=[AGGREGATE])) != set(self.nodes):
            return False
        changed = changed or {}
        return all(self.placement.provider(u) == self.expected(u, changed.get(u, False))
                   for u in self.nodes)

    def provider_rows(self):
        """{uuid: (row id, created_at)} in Placement's own table: a provider
        deleted and made again would have another id."""
        table = sa.table('resource_providers', sa.column('id'), sa.column('uuid'),
                         sa.column('created_at'))
        with self.placement_db.connect() as conn:
            return {uuid: (row_id, created) for row_id, uuid, created in conn.execute(
                sa.select(table.c.id, table.c.uuid, table.c.created_at)
                .where(table.c.uuid.in_(self.nodes)))}

    def wait_cycles(self, count):
        """Until every daemon has logged ``count`` more cycles."""
        seen = {h: d.count_in_log('Cycle: ') for h, d in self.daemons.items()}
        daemons.wait_until(lambda: all(
            d.count_in_log('Cycle: ') >= seen[h] + count
            for h, d in self.daemons.items()), 10 * count * CYCLE,
            message=f'{count} more cycles of every daemon')

    def owners(self):
        return {u: host for u, (host, _free) in self.node_rows().items()
                if u in self.nodes}

    def ready(self):
        self.restore()
        for uuid in self.nodes:
            ironic_env.retry_locked(lambda u=uuid: self.client.node.set_maintenance(u, False))
        # Every service holds its share (bounded loads: 3 of the 9 nodes
        # each), not only every node a row: a service that started first
        # holds them all until its peers' first cycles have run.
        daemons.wait_until(
            lambda: set(self.owners()) == set(self.nodes)
            and set(self.owners().values()) == set(HOSTS) and self.providers_match(),
            60, message='every node with its row and its provider, every service its share')

    def create(self, name, *args):
        """``instance create`` for a node of the group, in JSON."""
        return self.manage('instance', 'create', '--name', name, '--resource-class',
                           ironic_env.DEFAULT_RESOURCE_CLASS, '--partition-key', GROUP,
                           '--format', 'json', *args)

    def instances(self):
        """{uuid: row} of the live instances."""
        with self.engine.connect() as conn:
            return {row.uuid: row for row in conn.execute(
                sa.select(_instances.c.uuid, _instances.c.node, _instances.c.vm_state)
                .where(_instances.c.deleted == 0))}

    def close(self, *closeables):
        super().close(*closeables)
        self.placement.delete_providers(self.nodes)
        self.placement_db.dispose()


@pytest.fixture(scope='class', params=['mysql', 'postgresql'], name='started_cluster')
def started_cluster(request, tmp_path_factory, placement_server):  # noqa: F811
    Cluster.placement = placement_server
    ironic = request.getfixturevalue('ironic_server')
    with daemons.running(Cluster, request.param, ironic, tmp_path_factory) as group:
        yield group


class TestPlacement:
    def test_the_providers_are_exactly_the_nodes(self, cluster):
        # ready() waited for it; here it is, spelled out.
        assert set(cluster.placement.providers(member_of=[AGGREGATE])) == set(cluster.nodes)
        for uuid in cluster.nodes:
            assert cluster.placement.provider(uuid) == cluster.expected(uuid)
        # Three services shared the nodes, each writing its own.
        assert len(set(cluster.owners().values())) > 1
        # Steady cycles write nothing: Placement bumps a provider's
        # generation at every inventory or aggregates PUT, even identical.
        generations = cluster.placement.providers(member_of=[AGGREGATE])
        cluster.wait_cycles(3)
        assert cluster.placement.providers(member_of=[AGGREGATE]) == generations

    def test_kill9_neither_deletes_nor_creates_a_provider(self, cluster):
        before = cluster.provider_rows()
        assert set(before) == set(cluster.nodes)
        owners = cluster.owners()
        victim = max(HOSTS, key=lambda h: sum(1 for o in owners.values() if o == h))
        orphans = [u for u, o in owners.items() if o == victim]
        cluster.daemons[victim].kill()
        daemons.wait_until(
            lambda: all(cluster.owners().get(u) not in (None, victim) for u in orphans),
            SERVICE_DOWN_TIME + 20, message=f'the survivors hold the nodes of {victim}')
        # The successor keeps the provider of a node it took up to date.
        changed = {orphans[0]: True}
        ironic_env.retry_locked(lambda: cluster.client.node.set_maintenance(orphans[0], True))
        daemons.wait_until(lambda: cluster.providers_match(changed), 30,
                           message='the provider follows the node (maintenance)')
        assert cluster.provider_rows() == before
        # The victim comes back and takes its share again: still the same
        # providers, kept up to date by whoever holds them.
        cluster.restore()
        daemons.wait_until(lambda: victim in cluster.owners().values(), 30,
                           message=f'{victim} takes nodes again')
        ironic_env.retry_locked(lambda: cluster.client.node.set_maintenance(orphans[0], False))
        daemons.wait_until(cluster.providers_match, 30,
                           message='the provider follows the node (maintenance off)')
        assert cluster.provider_rows() == before

    def test_a_node_deleted_in_ironic_loses_its_provider(self, cluster):
        """...once no allocation is left on it."""
        extra, held = ironic_env.create_nodes(cluster.client, 2, GROUP, name_prefix=None)
        consumer = str(uuidlib.uuid4())
        try:
            ironic_env.make_buildable(cluster.client, [held])  # reserved 0
            daemons.wait_until(
                lambda: cluster.placement.provider(extra) is not None
                and (cluster.placement.provider(held) or {}).get('inventories', {})
                .get(RESOURCE_CLASS, {}).get('reserved') == 0, 30,
                message='providers for the new nodes, one free')
            # A consumer of Placement other than the services holds it.
            status, body = cluster.placement.request('PUT', f'/allocations/{consumer}', {
                'allocations': {held: {'resources': {RESOURCE_CLASS: 1}}},
                'project_id': 'p', 'user_id': 'u', 'consumer_generation': None,
                'consumer_type': 'INSTANCE'})
            assert status == 204, body
        finally:
            ironic_env.delete_nodes(cluster.client, [extra, held])
        daemons.wait_until(lambda: cluster.placement.provider(extra) is None, 30,
                           message="the deleted node's provider goes")
        # Kept while the allocation stays (logged), deleted once it is gone.
        daemons.wait_until(lambda: held not in cluster.owners() and any(
            'still has allocations' in d.log() for d in cluster.daemons.values()),
            30, message='the kept provider logged')
        assert cluster.placement.provider(held) is not None
        cluster.placement.request('DELETE', f'/allocations/{consumer}')
        daemons.wait_until(lambda: cluster.placement.provider(held) is None, 30,
                           message='the provider goes after its allocation')
        assert set(cluster.provider_rows()) == set(cluster.nodes)

    def test_placement_audit(self, cluster):
        clean = cluster.manage('placement', 'audit', '--format', 'json')
        assert clean.returncode == 0, clean.stderr
        assert json.loads(clean.stdout)['findings'] == 0
        # Broken by hand, while no refresh is due: COMPUTE_NODE removed.
        broken = cluster.free[1]
        status, traits = cluster.placement.request(
            'GET', f'/resource_providers/{broken}/traits')
        status, _ = cluster.placement.request(
            'PUT', f'/resource_providers/{broken}/traits',
            {'resource_provider_generation': traits['resource_provider_generation'],
             'traits': []})
        assert status == 200
        found = cluster.manage('placement', 'audit', '--format', 'json')
        assert found.returncode == 1, found.stderr
        (finding,) = json.loads(found.stdout)['disagreements']
        assert finding['node'] == broken and finding['problem'] == 'differs'
        assert "traits ['COMPUTE_NODE'] missing" in finding['detail']
        fixed = cluster.manage('placement', 'audit', '--fix', '--format', 'json')
        assert fixed.returncode == 0, fixed.stdout
        assert json.loads(fixed.stdout)['fixed'] == 1
        assert cluster.placement.provider(broken) == cluster.expected(broken)

    def test_placement_audit_of_claims(self, cluster):
        """An instance whose claim was deleted by hand, and a claim of a
        consumer this database never had: the audit lists both, --fix
        claims the instance's node again (through the real Placement's
        reshaper, its provider being reserved) and leaves the stranger's."""
        built = cluster.create('audited', '--wait', '--timeout', '60')
        assert built.returncode == 0, built.stderr
        instance, node = (json.loads(built.stdout)[k] for k in ('uuid', 'node'))
        stranger, other = str(uuidlib.uuid4()), sorted(set(cluster.free) - {node})[0]
        try:
            cluster.placement.request('DELETE', f'/allocations/{instance}')
            status, body = cluster.placement.request('PUT', f'/allocations/{stranger}', {
                'allocations': {other: {'resources': {RESOURCE_CLASS: 1}}},
                'project_id': 'p', 'user_id': 'u', 'consumer_generation': None,
                'consumer_type': 'INSTANCE'})
            assert status == 204, body
            found = cluster.manage('placement', 'audit', '--format', 'json')
            claims = {f['instance']: f for f in json.loads(found.stdout)['disagreements']
                      if f['instance']}
            assert found.returncode == 1 and set(claims) == {instance, stranger}, found.stdout
            assert (claims[instance]['problem'], claims[instance]['node'],
                    claims[instance]['fixable']) == ('no claim', node, True)
            assert (claims[stranger]['problem'], claims[stranger]['fixable']) == (
                'leaked claim', False)
            fixed = cluster.manage('placement', 'audit', '--fix', '--format', 'json')
            assert fixed.stdout, fixed.stderr
            assert json.loads(fixed.stdout)['fixed'] == 1, fixed.stdout
            status, claim = cluster.placement.request('GET', f'/allocations/{instance}')
            assert list(claim['allocations']) == [node], claim
            assert cluster.placement.provider(node)['inventories'][RESOURCE_CLASS][
                'reserved'] == 1
        finally:
            cluster.placement.request('DELETE', f'/allocations/{stranger}')
            cluster.manage('instance', 'delete', instance, '--wait', '--timeout', '60')

    def test_builds_claim_deletes_release_and_a_burst_claims_each_node_once(self, cluster):
        """Creates for the last free nodes and two more, from two CLI
        processes at a time (two schedulers): every free node is claimed
        once, for the instance built on it, with its project and user; the
        two beyond are refused; the deletes give every claim back."""
        free = set(cluster.free)
        requests = [(f'burst-{i}', ('--project', 'demo', '--user', 'alice') if i % 2 else ())
                    for i in range(len(free) + 2)]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda r: cluster.create(r[0], *r[1]), requests))
        placed = {json.loads(d.stdout)['uuid']: (json.loads(d.stdout)['node'], args)
                  for d, (_name, args) in zip(results, requests, strict=True)
                  if d.returncode == 0}
        refused = [d.stderr for d in results if d.returncode != 0]
        assert len(placed) == len(free), refused
        assert all('no free node' in e or 'Placement has no free node' in e
                   for e in refused), refused
        assert {node for node, _args in placed.values()} == free
        for uuid, (node, args) in placed.items():
            status, claim = cluster.placement.request('GET', f'/allocations/{uuid}')
            owner = ('demo', 'alice') if args else ('ironic-compute', 'ironic-compute')
            assert (list(claim['allocations']), claim['project_id'], claim['user_id']) == (
                [node], *owner), claim
        for node in free:
            status, held = cluster.placement.request(
                'GET', f'/resource_providers/{node}/allocations')
            assert len(held['allocations']) == 1, held
        # Each built on its claimed node.
        daemons.wait_until(lambda: all(
            row.vm_state == 'active' for row in cluster.instances().values()), 60,
            message='the burst built')
        assert {u: r.node for u, r in cluster.instances().items()} == {
            u: node for u, (node, _args) in placed.items()}
        for uuid in placed:
            assert cluster.manage('instance', 'delete', uuid).returncode == 0
        daemons.wait_until(lambda: not cluster.instances(), 60, message='deleted')
        for uuid in placed:
            assert cluster.placement.request('GET', f'/allocations/{uuid}')[1] == {
                'allocations': {}}


def test_racing_claims_never_share_a_provider(placement_server, tmp_path):  # noqa: F811
    """Claims from three threads (as many schedulers) for the last free
    nodes: every free node is claimed once, none twice, none left free
    while a claim failed. Placement itself may write a double on MariaDB
    (placement/claims.py): the claimers see it and give theirs back."""
    path = tmp_path / 'placement.conf'
    path.write_text(daemons.config_text({'placement': placement_server.config()}))
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    conf(['--config-file', str(path)])
    client = placement_client.PlacementClient(conf)
    group = f'claims-{uuidlib.uuid4().hex[:6]}'
    nodes = [dataclasses.replace(fakes.make_node(conductor_group=group),
                                 power_state='power off') for _ in range(13)]
    nodes[-1] = dataclasses.replace(nodes[-1], maintenance=True)  # reserved
    placement_sync.ProviderSync(client).run({n.uuid: n for n in nodes})
    free = {n.uuid for n in nodes[:-1]}
    claims = placement_claims.Claims(client)
    got = []

    def scheduler():
        for _ in range(5):  # 15 claims for 12 free nodes
            instance = str(uuidlib.uuid4())
            got.append((instance, claims.claim_one(
                instance, 'baremetal', (), group, None, 'project', 'user')))
    threads = [threading.Thread(target=scheduler) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        claimed = [node for _instance, node in got if node]
        assert sorted(claimed) == sorted(free)
        for uuid in free:
            assert len(client.provider_allocations(uuid)) == 1
        assert client.provider_allocations(nodes[-1].uuid) == {}
    finally:
        for instance, _node in got:
            claims.release(instance)
        placement_server.delete_providers([n.uuid for n in nodes])
