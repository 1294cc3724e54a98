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

"""The chaos soak's agreement with Placement (doc/chaos-soak.md).

Every daemon of the soak reports to the session's real Placement.
:func:`start` waits for a provider per node, notes each one's row id in
Placement's own table and arms the sampler's check of Placement at every
sample (placement_agreement.py: providers and claims); :func:`check`,
after the last fault, waits until Placement agrees with Ironic and fails
the soak for every provider of a node never deleted in Ironic that is not
the one made at start-up.
"""

import types

import sqlalchemy as sa

from ironic_compute.placement import provider
from tests.functional import daemons
from tests.functional import ironic_env

AGREE_WITHIN = 30  # seconds after the last fault


def provider_rows(soak):
    """{uuid: row id} of the soak's nodes' providers, in Placement's table."""
    table = sa.table('resource_providers', sa.column('id'), sa.column('uuid'))
    engine = sa.create_engine(soak.placement.database.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(sa.select(table.c.uuid, table.c.id).where(
                table.c.uuid.in_(list(soak.group_of)))).all())
    finally:
        engine.dispose()


def disagreements(soak):
    """What Placement says that Ironic does not, for the soak's nodes."""
    nodes = {n['uuid']: n for n in ironic_env.list_nodes(soak.client, fields=[
        'uuid', 'conductor_group', 'maintenance', 'power_state',
        'provision_state', 'instance_uuid'])}
    resource_class = provider.normalize_resource_class(ironic_env.DEFAULT_RESOURCE_CLASS)
    found = []
    for uuid in sorted(soak.group_of):
        node, seen = nodes.get(uuid), soak.placement.provider(uuid)
        if node is None or seen is None:
            if (node is None) != (seen is None):
                found.append(f'{uuid}: ' + ('a provider, no node' if node is None
                                            else 'no provider'))
            continue
        reserved = int(provider.reserved_reason(types.SimpleNamespace(**node)) is not None)
        got = seen['inventories'].get(resource_class, {}).get('reserved')
        if got != reserved:
            found.append(f'{uuid}: reserved {got}, should be {reserved}')
        aggregate = provider.aggregate_uuid(node['conductor_group'])
        if seen['aggregates'] != {aggregate}:
            found.append(f'{uuid}: aggregates {sorted(seen["aggregates"])}, '
                         f'should be [{aggregate}]')
    return found


def start(soak):
    """{uuid: row id} of every node's provider, once there is one for each;
    from then on the sampler checks Placement at every sample."""
    daemons.wait_until(lambda: set(provider_rows(soak)) == set(soak.group_of), 60,
                       message='a provider for every node at start-up')
    first = provider_rows(soak)
    soak.placement_agreement.arm(first)
    return first


def check(soak, first_providers):
    """Placement agrees with Ironic once settled, and no provider of a node
    that stayed in Ironic was deleted or made again."""
    try:
        daemons.wait_until(lambda: not disagreements(soak), AGREE_WITHIN,
                           message='Placement agrees with Ironic')
    except AssertionError:
        soak.fail(f'Placement disagrees with Ironic after the last fault: '
                  f'{disagreements(soak)[:5]}')
    now = provider_rows(soak)
    changed = sorted(u for u, row_id in first_providers.items()
                     if u not in soak.recreated and now.get(u) != row_id)
    if changed:
        soak.fail(f'providers deleted or made again without their node being '
                  f'deleted: {changed[:5]}')
