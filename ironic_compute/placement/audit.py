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

"""What disagrees between the database, Ironic and Placement: pure.

``ironic-compute-manage placement audit`` reads the three and asks
:func:`findings` what is wrong with each node's provider, and what would fix
it. Only what this service sets is judged: traits and aggregates that others
set on a provider are theirs. :func:`claim_findings` judges the claims: an
allocation on a node's provider whose consumer is no live instance on that
node (a leaked claim), and a live instance built by ``instance create``
without its claim.
"""

import dataclasses
import datetime

from ironic_compute.instances import model as inst
from ironic_compute.placement import provider

MISSING = 'no provider'
DIFFERS = 'differs'
STALE = 'provider of a node gone from Ironic'
LEAKED = 'leaked claim'
UNCLAIMED = 'no claim'
# A claim whose instance was deleted longer ago than this (on the
# database's clock) is nobody's: its host releases it right after the
# node's teardown, and a node of an instance deleted while its host was
# down is torn down by the host's successor within service_down_time and a
# cycle or two. Younger ones are left to them.
LEAK_AGE = datetime.timedelta(minutes=10)
# Tasks in which the instance's service gives the claim back: a delete
# releases it before it deletes the row (which still names the node), a
# failed build after it wrote the failure (``releasing``, the node no
# longer named once Ironic freed it). Neither is judged meanwhile.
FREEING = (inst.DELETING, inst.RELEASING)


@dataclasses.dataclass(frozen=True)
class Finding:
    node: str
    owner: str | None  # the host of the node's live row (None: no row)
    problem: str  # MISSING, DIFFERS, STALE
    detail: str
    fix: str
    fixable: bool  # --fix may act on it (the node is this database's)
    instance: str | None = None  # the consumer of a claim finding


@dataclasses.dataclass(frozen=True)
class Holder:
    """What the claim rules need of an instance row."""

    uuid: str
    node: str | None
    task_state: str | None
    built: bool  # made by instance create (not an instance add record)
    deleted_at: datetime.datetime | None = None  # None: live


def _differences(want, seen):
    found = []
    if want.inventory != seen.inventory:
        found.append(f'inventory {seen.inventory or "none"}, should be '
                     f'{want.inventory or "none"}')
    missing = want.traits - seen.traits
    if missing:
        found.append(f'traits {sorted(missing)} missing')
    missing = want.aggregates - seen.aggregates
    if missing:
        found.append(f'not in the aggregate of its conductor group '
                     f'({sorted(missing)[0]})')
    return found


def findings(nodes, rows, providers, gone, allocations):
    """The disagreements, node by node.

    :param nodes: {uuid: ironic.Node} that Ironic lists (the partition)
    :param rows: {uuid: host} of the live compute_nodes rows
    :param providers: {uuid: provider.State, or None for none} of every
        node of ``nodes`` and every uuid of ``gone``
    :param gone: uuids of providers (of our aggregates) whose node Ironic
        answered 404 for; with ``known``, those this database had a row for,
        as {uuid: bool}
    :param allocations: {uuid: [consumer, ...]} for the providers of
        ``gone``
    """
    result = []
    for uuid in sorted(nodes):
        owner = rows.get(uuid)
        seen = providers.get(uuid)
        who = f'its owner {owner}' if owner else 'the service that takes it'
        if seen is None:
            result.append(Finding(
                uuid, owner, MISSING, 'Ironic lists the node, Placement has '
                'no provider for it',
                f'{who} creates it at its next cycle if [placement] is '
                'configured there; --fix creates it', owner is not None))
            continue
        wrong = _differences(provider.desired(nodes[uuid]), seen)
        if wrong:
            result.append(Finding(
                uuid, owner, DIFFERS, '; '.join(wrong),
                f'{who} rewrites it at its next refresh '
                '([placement]refresh_interval); --fix writes it',
                owner is not None))
    for uuid, ours in sorted(gone.items()):
        held = allocations.get(uuid) or []
        if held:
            fix = (f'deleted once its allocations ({", ".join(sorted(held))}) '
                   'are gone')
        else:
            fix = '--fix deletes it' if ours else (
                'not this database\'s node: delete it by hand')
        result.append(Finding(uuid, rows.get(uuid), STALE,
                              'Ironic answers 404 for the node', fix,
                              ours and not held))
    return result


def claim_findings(nodes, rows, providers, allocations, instances, now,
                   leak_age=LEAK_AGE):
    """The claims that disagree with the database, node by node.

    :param nodes: {uuid: ironic.Node} that Ironic lists (the partition)
    :param rows: {uuid: host} of the live compute_nodes rows
    :param providers: {uuid: provider.State or None} of the nodes
    :param allocations: {node uuid: [consumer, ...]} on the nodes' providers
    :param instances: {uuid: Holder}: every live instance, and the newest
        deleted row of each consumer that has no live one
    :param now: the database's time (naive UTC)
    """
    result = []
    for node in sorted(allocations):
        for consumer in sorted(allocations[node]):
            holder = instances.get(consumer)
            if holder is not None and holder.deleted_at is None and (
                    holder.node == node or holder.task_state in FREEING):
                continue
            result.append(_leaked(node, rows.get(node), consumer, holder,
                                  nodes.get(node), now, leak_age))
    live = [h for h in instances.values() if h.deleted_at is None]
    for holder in sorted(live, key=lambda h: h.uuid):
        node = holder.node
        if (not holder.built or node not in nodes or providers.get(node) is None
                or holder.task_state in FREEING
                or holder.uuid in allocations.get(node, ())):
            continue
        result.append(_unclaimed(holder, rows.get(node), allocations))
    return result


def _leaked(node, owner, consumer, holder, ironic_node, now, leak_age):
    def finding(detail, fix, fixable=False):
        return Finding(node, owner, LEAKED, detail, fix, fixable, consumer)
    if holder is None:
        return finding(
            f'consumer {consumer} is no instance of this database',
            'a create killed between its claim and its record, or a claim '
            'Placement applied after the create gave it back; a create under '
            'way looks the same for a moment, and another consumer of '
            'Placement too: unless the next audit finds the instance '
            f'recorded, remove it with DELETE /allocations/{consumer}')
    if holder.deleted_at is None and holder.node is None:
        return finding(f'instance {consumer} has no node (task {holder.task_state})',
                       f'remove it with DELETE /allocations/{consumer}')
    if holder.deleted_at is None:
        return finding(
            f'instance {consumer} is recorded on {holder.node}',
            f'PUT /allocations/{consumer} naming {holder.node} only (with the '
            'consumer generation GET gives): a DELETE would drop its own claim too')
    age = now - holder.deleted_at
    detail = f'instance {consumer} was deleted {age.total_seconds():.0f} s ago'
    if ironic_node is not None and ironic_node.instance_uuid == consumer:
        return finding(f'{detail}; Ironic still has the node serving it',
                       'the service that tears the node down releases it')
    if owner is None:
        return finding(detail, 'not a node of this database: delete it by hand')
    if age <= leak_age:
        return finding(detail, 'its host releases it after the teardown; --fix '
                       f'deletes it once the instance was deleted '
                       f'{leak_age.total_seconds():.0f} s ago')
    return finding(detail, '--fix deletes it', True)


def _unclaimed(holder, owner, allocations):
    node, uuid = holder.node, holder.uuid
    others = sorted(allocations.get(node, ()))
    elsewhere = sorted(n for n, held in allocations.items() if uuid in held)
    detail = f'instance {uuid} (built by instance create) holds no allocation on it'
    if others:
        detail += f'; the provider is held by {", ".join(others)}'
    if elsewhere:
        detail += f'; it holds {", ".join(elsewhere)} instead'
    fixable = owner is not None and not others and not elsewhere
    fix = ('--fix claims it (with the reserved flag lifted in the same '
           'request: POST /reshaper)' if fixable
           else 'by hand, once the leaked claims are gone' if owner is not None
           else 'not a node of this database')
    return Finding(node, owner, UNCLAIMED, detail, fix, fixable, uuid)
