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

"""ironic-compute-manage placement ...: the providers in Placement beside
the database and Ironic (placement/audit.py says what disagrees)."""

import dataclasses
import sys

from ironic_compute import exception
from ironic_compute.cmd import common
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.cmd.manage_ring import partition_key_option
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.placement import audit
from ironic_compute.placement import claim_audit
from ironic_compute.placement import provider

# The clients of Ironic and Placement (ironic.py, placement/client.py,
# placement/sync.py) are imported by the functions that talk to them:
# keystoneauth1 under them costs a tenth of a second that ironic-compute-manage
# would otherwise pay for every command (see "Start-up" in doc/cli.md).

CONF = common.CONF

SUMMARY = output.columns(
    ('partition_key', 'Partition key'), ('nodes', 'Nodes in Ironic'),
    ('providers', 'Providers in its aggregates'), ('findings', 'Disagreements'),
    ('fixed', 'Fixed'))
PROVIDER_PROBLEMS = (audit.MISSING, audit.DIFFERS, audit.STALE)
FINDINGS = output.columns(
    ('node', 'Node'), ('owner', 'Owner'), ('problem', 'Problem'),
    ('instance', 'Instance'), ('detail', 'Detail'), ('fix', 'Fix'))


def _ask(func, *args, **kwargs):
    """A call to Ironic or Placement; its failure is one line."""
    try:
        return func(*args, **kwargs)
    except (exception.IronicUnavailable, exception.PlacementError) as exc:
        raise exception.CommandError(common.driver_message(exc)) from exc


def read_state(client, uuid):
    """The provider.State of a provider, or None when there is none."""
    try:
        _generation, inventory = client.get_inventories(uuid)
        _generation, traits = client.get_traits(uuid)
        _generation, aggregates = client.get_aggregates(uuid)
    except exception.PlacementNotFound:
        return None
    return provider.State(inventory, traits, aggregates)


def survey(ctx, ironic_client, client, group):
    """(findings, nodes listed, providers listed) of the partition."""
    nodes = {n.uuid: n for n in ironic_client.list_nodes(conductor_group=group)}
    rows = {uuid: row.host for uuid, row in db_nodes.load_rows(ctx, '').items()}
    aggregates = {provider.aggregate_uuid(n.conductor_group) for n in nodes.values()}
    if group is not None:
        aggregates.add(provider.aggregate_uuid(group))
    listed = client.list_providers(member_of=aggregates) if aggregates else {}
    unlisted = [u for u in sorted(set(listed) - set(nodes))
                if not ironic_client.node_exists(u)]
    known = db_nodes.known_uuids(ctx, unlisted)
    states = {uuid: read_state(client, uuid) for uuid in nodes}
    allocations = {uuid: sorted(client.provider_allocations(uuid))
                   for uuid in unlisted}
    found = audit.findings(nodes, rows, states,
                           {uuid: uuid in known for uuid in unlisted}, allocations)
    found += claim_audit.survey(ctx, client, nodes, rows, states)
    return found, nodes, listed


def _mend(ctx, client, fixable, nodes):
    """audit --fix: the claims first (placement/claim_audit.py; how many
    were mended is returned), then the providers, with the code the
    services run (placement/sync.py)."""
    from ironic_compute.placement import claims
    from ironic_compute.placement import sync as placement_sync
    fixed = _ask(claim_audit.fix, ctx, claims.Claims(client), fixable,
         (CONF.placement.claim_project_id, CONF.placement.claim_user_id))
    providers = [f for f in fixable if f.problem in PROVIDER_PROBLEMS]
    stats = _ask(placement_sync.ProviderSync(client).run,
                 {f.node: nodes[f.node] for f in providers if f.problem != audit.STALE},
                 gone=[f.node for f in providers if f.problem == audit.STALE])
    if stats.skipped:
        raise exception.CommandError(stats.skipped)
    return fixed


NODE_COLUMNS = output.columns(
    ('provider', 'Provider'), ('inventory', 'Inventory'),
    ('reserved_reason', 'Reserved because'), ('provider_traits', 'Provider traits'),
    ('allocations', 'Allocations'))


LIST_COLUMNS = output.columns(('provider_generation', 'Provider generation'))


def add_provider_state(records):
    """``node list`` with [placement]: each record's ``provider_generation``,
    from one listing of the providers in the nodes' conductor groups'
    aggregates (None: no provider there). Placement not answering is one
    line on stderr; the listing stands."""
    from ironic_compute.placement import client as placement_client
    aggregates = {provider.aggregate_uuid(r['conductor_group']) for r in records}
    try:
        listed = (placement_client.PlacementClient(CONF).list_providers(
            member_of=aggregates) if aggregates else {})
    except exception.PlacementError as exc:
        output.emit(f'Placement: {common.driver_message(exc)}', sys.stderr)
        return
    for record in records:
        record['provider_generation'] = listed.get(record['uuid'])


def node_report(uuid):
    """What ``node show`` adds with [placement] configured: the node's
    provider, its inventory, why it is reserved (asked of Ironic when
    [ironic] is configured) and its allocations. A failure is said in the
    report, not raised: the rest of node show stands."""
    from ironic_compute import ironic
    from ironic_compute.placement import client as placement_client
    client = placement_client.PlacementClient(CONF)
    try:
        state = read_state(client, uuid)
        held = sorted(client.provider_allocations(uuid)) if state else []
    except exception.PlacementError as exc:
        return {'provider': f'unknown: {common.driver_message(exc)}'}
    if state is None:
        return {'provider': 'none'}
    report = {'provider': uuid,
              'inventory': ', '.join(
                  f'{rc} {inv["total"]} (reserved {inv["reserved"]})'
                  for rc, inv in sorted(state.inventory.items())) or 'none',
              'provider_traits': sorted(state.traits), 'allocations': held}
    if CONF.ironic.auth_type:
        try:
            nodes = ironic.IronicClient(CONF).get_nodes([uuid])
        except exception.IronicUnavailable as exc:
            report['reserved_reason'] = f'unknown: {common.driver_message(exc)}'
        else:
            report['reserved_reason'] = (
                provider.reserved_reason(nodes[0]) or 'not reserved'
                if nodes else 'the node is gone from Ironic')
    return report


class PlacementCommands:
    """The providers in Placement ([placement] and [ironic] needed)."""

    @args('--partition-key', metavar='K',
          help='conductor group to audit (default: [ironic]partition_key; '
               'unset: every node)')
    @args('--fix', action='store_true',
          help='create or rewrite the providers of the nodes this database '
               'holds, and delete those of nodes it had that Ironic no '
               'longer has (without allocations); claim the nodes of live '
               'instances without their claim, and delete the claims of '
               'instances deleted long ago; never touches another '
               'provider, nor a trait or aggregate someone else set')
    @format_option
    def audit(self, partition_key=None, fix=False, format='table'):
        """List every disagreement between the database, Ironic and
        Placement, and what would fix each; exit 1 when any is left."""
        from ironic_compute import ironic
        from ironic_compute.placement import client as placement_client
        if not placement_client.configured(CONF):
            raise exception.CommandError('[placement] is not configured here: '
                                      'no provider to audit')
        key = partition_key_option(partition_key)
        group = key.lower() if key else None
        ctx = db_api.Context()
        ironic_client = ironic.IronicClient(CONF)
        client = placement_client.PlacementClient(CONF)
        found, nodes, listed = _ask(survey, ctx, ironic_client, client, group)
        fixed = 0
        if fix and any(f.fixable for f in found):
            fixable = [f for f in found if f.fixable]
            fixed = _mend(ctx, client, fixable, nodes)
            found, nodes, listed = _ask(survey, ctx, ironic_client, client, group)
            left = {(f.node, f.problem) for f in found}
            fixed += sum(1 for f in fixable if f.problem in PROVIDER_PROBLEMS
                         and (f.node, f.problem) not in left)
        report = {'partition_key': key, 'nodes': len(nodes),
                  'providers': len(listed), 'findings': len(found),
                  'fixed': fixed,
                  'disagreements': [dataclasses.asdict(f) for f in found]}
        output.show_report(report, format, SUMMARY,
                           (report['disagreements'] or None, FINDINGS))
        return 1 if found else 0
