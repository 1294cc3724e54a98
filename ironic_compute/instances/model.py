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

"""Instances: the request spec, the node choice, the state machine and the
takeover rule. Pure: no I/O.

An instance is asked for by writing its row (``vm_state`` building,
``task_state`` scheduled, ``host`` the service that builds it). That service
claims it (spawning), reserves a node through an Ironic allocation whose
uuid and name are the instance's uuid, deploys it and records the result
(active, or error with a one-line fault; ``task_state`` releasing while a
node it reserved could not be freed yet). A delete sets ``task_state``
deleting; the managing service tears the node down and soft-deletes the row
(``vm_state`` deleted).
"""

import dataclasses
import json
import re
from collections.abc import Iterable
from collections.abc import Mapping
from datetime import UTC
from datetime import datetime

from ironic_compute.nodes import ownership

# vm_state
BUILDING = 'building'
ACTIVE = 'active'
STOPPED = 'stopped'  # deployed, powered off on purpose
ERROR = 'error'
DELETED = 'deleted'
# A record forgotten by "instance remove": the node is left as it is.
REMOVED = 'removed'
# task_state
SCHEDULED = 'scheduled'  # written by the request, not yet picked up
SPAWNING = 'spawning'  # the host reserves and deploys a node
DELETING = 'deleting'  # the host tears the node down
RELEASING = 'releasing'  # failed build: the host still frees its node
POWERING_OFF = 'powering-off'  # instance stop
POWERING_ON = 'powering-on'  # instance start
REBOOTING = 'rebooting'  # instance reboot
REBUILDING = 'rebuilding'  # instance rebuild
# power_state: what Ironic last said (None: not read yet)
POWER_ON, POWER_OFF, POWER_UNKNOWN = 'on', 'off', 'unknown'

# What a host's worker does next for an instance in a task_state.
ACTIONS = {SCHEDULED: 'build', SPAWNING: 'build', DELETING: 'delete',
           RELEASING: 'release', POWERING_OFF: 'power', POWERING_ON: 'power',
           REBOOTING: 'reboot', REBUILDING: 'rebuild'}
PENDING_TASKS = tuple(ACTIONS)


@dataclasses.dataclass(frozen=True)
class Request:
    """An action an operator asks for on a built instance."""

    task_state: str
    allowed_from: tuple  # vm_states it may be asked in
    done_state: str  # the vm_state once it is done


# The commands of ``ironic-compute-manage instance``: stop, start, reboot
# and rebuild. A reboot or a rebuild of a stopped instance powers it on.
REQUESTS = {
    'stop': Request(POWERING_OFF, (ACTIVE,), STOPPED),
    'start': Request(POWERING_ON, (STOPPED,), ACTIVE),
    'reboot': Request(REBOOTING, (ACTIVE, STOPPED), ACTIVE),
    'rebuild': Request(REBUILDING, (ACTIVE, STOPPED), ACTIVE),
}
DONE_STATE = {r.task_state: r.done_state for r in REQUESTS.values()}


def request_refusal(action: str, vm_state: str | None,
                    task_state: str | None, node: str | None) -> str | None:
    """Why ``action`` cannot be asked for an instance in these states, or
    None. One task at a time: a task in flight refuses any other."""
    if task_state is not None:
        return f'it has a task in flight: {task_state}'
    if vm_state not in REQUESTS[action].allowed_from or node is None:
        allowed = ' or '.join(REQUESTS[action].allowed_from)
        return f'it is {vm_state or "unknown"}; {action} needs {allowed}'
    return None


def power_of(ironic_power: str | None) -> str:
    """Ironic's power_state ('power on', 'power off'...) as recorded."""
    return {'power on': POWER_ON, 'power off': POWER_OFF}.get(
        ironic_power, POWER_UNKNOWN)


# What the power-state sync does for an instance (besides recording it).
SYNC_MARK_STOPPED = 'mark stopped'
SYNC_POWER_OFF = 'power off'


def power_sync(vm_state: str | None, task_state: str | None,
               node_power: str, maintenance: bool) -> str | None:
    """What the periodic sync does for an instance whose node Ironic says
    is ``node_power`` (on/off/unknown): None, SYNC_MARK_STOPPED or
    SYNC_POWER_OFF. Callers skip instances with a task in flight and nodes
    in maintenance altogether (not even recorded).

    Who wins: for an active instance found off, the node (someone or
    something powered it off: the instance is stopped, as nova records it);
    for a stopped instance found on, the database (it was stopped on
    purpose: it is powered off again).
    """
    if task_state is not None or maintenance:
        return None
    if vm_state == ACTIVE and node_power == POWER_OFF:
        return SYNC_MARK_STOPPED
    if vm_state == STOPPED and node_power == POWER_ON:
        return SYNC_POWER_OFF
    return None


class InvalidRequest(ValueError):
    """A request spec that cannot be satisfied by any node."""


# Ironic's limits: a resource class of at most 80 characters, a trait of at
# most 255 that is CUSTOM_[A-Z0-9_]+ or a standard (os-traits) name, which
# has the same form without the prefix (Ironic refuses a standard name it
# does not know). The resource class is also kept to the characters a URL
# never escapes: python-ironicclient writes it into a query string as is.
RESOURCE_CLASS_MAX = 80
TRAIT_MAX = 255
_RESOURCE_CLASS = re.compile(r'[A-Za-z0-9._~-]+')
_TRAIT = re.compile(r'CUSTOM_[A-Z0-9_]+|(?!CUSTOM_)[A-Z][A-Z0-9_]*')


def _shown(value):
    """A value in an error line: quoted, one line, not too long."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + '...'


def _check_resource_class(value):
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest('a resource class is required')
    if len(value) > RESOURCE_CLASS_MAX or not _RESOURCE_CLASS.fullmatch(
            value):
        raise InvalidRequest(
            f'invalid resource class {_shown(value)}: use up to '
            f'{RESOURCE_CLASS_MAX} letters, digits and "-", ".", "_", "~"')


def _check_trait(value):
    if (not isinstance(value, str) or len(value) > TRAIT_MAX
            or not _TRAIT.fullmatch(value)):
        raise InvalidRequest(
            f'invalid trait {_shown(value)}: a trait is a standard one (such '
            'as HW_CPU_X86_AVX2) or CUSTOM_ followed by upper-case letters, '
            f'digits and "_", up to {TRAIT_MAX} characters')


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """What a node must offer to host the instance."""

    resource_class: str
    vcpus: int = 0
    memory_mb: int = 0
    disk_gb: int = 0
    traits: frozenset = frozenset()
    partition_key: str | None = None

    def __post_init__(self):
        # Checked here, before the values reach a query or Ironic, so the
        # CLI and a row read back refuse them alike.
        _check_resource_class(self.resource_class)
        for trait in sorted(self.traits, key=str):
            _check_trait(trait)
        for name in ('vcpus', 'memory_mb', 'disk_gb'):
            if getattr(self, name) < 0:
                raise InvalidRequest(f'{name} must not be negative')

    def traits_json(self):
        return json.dumps(sorted(self.traits)) if self.traits else None

    def describe(self):
        """The spec in one line, for faults and errors."""
        parts = [f'resource class {self.resource_class}']
        parts += [f'{getattr(self, name)} {unit}'
                  for name, unit in (('vcpus', 'vcpus'), ('memory_mb', 'MB'),
                                     ('disk_gb', 'GB disk'))
                  if getattr(self, name)]
        if self.traits:
            parts.append('traits ' + ','.join(sorted(self.traits)))
        if self.partition_key:
            parts.append(f'conductor group {self.partition_key}')
        return ', '.join(parts)


def parse_traits(text):
    """The traits stored as JSON (None: no traits)."""
    return frozenset(json.loads(text)) if text else frozenset()


@dataclasses.dataclass(frozen=True)
class NodeOffer:
    """What a node offers a build: from Ironic or a compute_nodes row."""

    uuid: str
    resource_class: str | None
    vcpus: int
    memory_mb: int
    local_gb: int
    traits: frozenset = frozenset()
    available: bool = True  # available, not in maintenance, no instance


# The checks of a node against a spec, in the order they are reported.
_CHECKS = (
    ('not available', lambda spec, node: node.available),
    ('of another resource class',
     lambda spec, node: node.resource_class == spec.resource_class),
    ('with too few vcpus', lambda spec, node: node.vcpus >= spec.vcpus),
    ('with too little memory',
     lambda spec, node: node.memory_mb >= spec.memory_mb),
    ('with too little disk', lambda spec, node: node.local_gb >= spec.disk_gb),
    ('without the traits', lambda spec, node: spec.traits <= node.traits),
)


# Why a node does not fit, in the order a refusal lists them: a node counts
# under the first one it fails (db/node_match.py asks the same in SQL).
TAKEN = 'taken by another instance'
REASONS = (TAKEN, *(why for why, _ in _CHECKS))


@dataclasses.dataclass(frozen=True)
class Match:
    candidates: tuple  # uuids of the nodes that fit, sorted
    fault: str | None  # when there is none: what did not match


def match_nodes(spec: RequestSpec, nodes: Iterable[NodeOffer],
                busy: Iterable[str] = ()) -> Match:
    """The nodes that can host ``spec``; ``busy`` are taken by instances.

    The fault names the first check each node failed, counted, so an
    operator sees at once whether the cloud is full or the request is
    impossible.
    """
    busy = set(busy)
    fits = []
    failed = {}
    total = 0
    for node in nodes:
        total += 1
        if node.uuid in busy:
            failed[TAKEN] = failed.get(TAKEN, 0) + 1
            continue
        reason = next((why for why, check in _CHECKS
                       if not check(spec, node)), None)
        if reason is None:
            fits.append(node.uuid)
        else:
            failed[reason] = failed.get(reason, 0) + 1
    if fits:
        return Match(tuple(sorted(fits)), None)
    return Match((), no_match_fault(spec, failed, total))


def no_match_fault(spec: RequestSpec, failed: Mapping[str, int],
                   total: int) -> str:
    """The one line saying why none of ``total`` nodes fits ``spec``.

    ``failed`` counts the nodes by the first reason (of REASONS) they
    failed; the reasons are listed in that order.
    """
    if not total:
        return (f'no free node: this host has no node for '
                f'{spec.describe()}')
    why = '; '.join(f'{failed[reason]} {reason}' for reason in REASONS
                    if failed.get(reason))
    return f'no free node for {spec.describe()} ({why})'


def next_action(task_state: str | None) -> str | None:
    """'build', 'delete', 'release', 'power', 'reboot', 'rebuild' or None:
    what the managing host still has to do."""
    return ACTIONS.get(task_state)


def takeover_due(record: ownership.ServiceRecord | None, now: datetime,
                 service_down_time: float, grace: float) -> bool:
    """Whether a host's instances go to the living: silent for longer than
    ``service_down_time + grace`` seconds.

    Silence is measured from the last heartbeat on the database's clock (a
    service that stops cleanly heartbeats until it stops); the takeover
    itself checks it again in SQL (db.instances.take_over). Counting the
    grace from the moment the host is judged down leaves the host's own
    lease (service_down_time / 2, lease.py) ending well before anyone acts
    for it. ``grace`` 0 means never. A host forced down by an operator is
    fenced by that operator's word: its instances move at once. A host
    without a services row (deleted by an operator) is gone: at once too.
    A disabled host takes no new builds but still manages its instances
    while it heartbeats.
    """
    if grace <= 0:
        return False
    if record is None or record.forced_down or record.last_seen_up is None:
        return True
    return _seconds_between(record.last_seen_up, now) > (
        service_down_time + grace)


def _seconds_between(earlier: datetime, later: datetime) -> float:
    # Naive values are UTC (the database's clock).
    if earlier.tzinfo is None:
        earlier = earlier.replace(tzinfo=UTC)
    if later.tzinfo is None:
        later = later.replace(tzinfo=UTC)
    return (later - earlier).total_seconds()


def fence_refusal(current, claim, host: str, states) -> str | None:
    """Why ``host`` may not act for the instance of ``claim`` (its row as
    a worker read it) now that its row is ``current`` (None: deleted), or
    None when it may: the row must still have this host, the claim's
    generation and a task state among ``states``."""
    if current is None:
        return 'the instance is deleted'
    if current.host != host:
        return f'it is managed by {current.host} now'
    if current.generation != claim.generation:
        return (f'it was taken over since (generation {current.generation}, '
                f'not {claim.generation})')
    if current.task_state not in states:
        return f'its task is {current.task_state or "none"} now'
    return None


def node_refusal(node, instance_uuid: str) -> str | None:
    """Why the Ironic ``node`` (provision.NodeState or Serving; None: gone)
    may not be deployed, powered or torn down for ``instance_uuid``, or
    None: its instance and its allocation (if any) must both be that
    instance."""
    if node is None:
        return 'the node is gone from Ironic'
    if node.instance_uuid != instance_uuid:
        return (f'node {node.uuid} serves '
                f'{node.instance_uuid or "no instance"} now')
    # Our allocations are named by their instance's uuid; a node deployed
    # without one (an instance added by an operator) has none.
    if node.allocation_uuid not in (None, instance_uuid):
        return (f'node {node.uuid} carries allocation {node.allocation_uuid}'
                ', not this instance\'s')
    return None


def takeover_key(node: str | None, instance_uuid: str) -> str:
    """The ring key that decides who takes an instance: its node, else
    itself (a build that has no node yet)."""
    return node or instance_uuid
