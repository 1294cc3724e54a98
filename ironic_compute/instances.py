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
from collections.abc import Iterable
from datetime import UTC
from datetime import datetime

from ironic_compute import ownership

# vm_state
BUILDING = 'building'
ACTIVE = 'active'
ERROR = 'error'
DELETED = 'deleted'
# task_state
SCHEDULED = 'scheduled'  # written by the request, not yet picked up
SPAWNING = 'spawning'  # the host reserves and deploys a node
DELETING = 'deleting'  # the host tears the node down
RELEASING = 'releasing'  # failed build: the host still frees its node

# What a host's worker does next for an instance in a task_state.
ACTIONS = {SCHEDULED: 'build', SPAWNING: 'build', DELETING: 'delete',
           RELEASING: 'release'}
PENDING_TASKS = tuple(ACTIONS)


class InvalidRequest(ValueError):
    """A request spec that cannot be satisfied by any node."""


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
        if not self.resource_class or not self.resource_class.strip():
            raise InvalidRequest('a resource class is required')
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
            failed['taken by another instance'] = failed.get(
                'taken by another instance', 0) + 1
            continue
        reason = next((why for why, check in _CHECKS
                       if not check(spec, node)), None)
        if reason is None:
            fits.append(node.uuid)
        else:
            failed[reason] = failed.get(reason, 0) + 1
    if fits:
        return Match(tuple(sorted(fits)), None)
    if not total:
        return Match((), f'no free node: this host has no node for '
                         f'{spec.describe()}')
    why = '; '.join(f'{count} {reason}' for reason, count in failed.items())
    return Match((), f'no free node for {spec.describe()} ({why})')


def next_action(task_state: str | None) -> str | None:
    """'build', 'delete', 'release' or None: what the managing host still
    has to do."""
    return ACTIONS.get(task_state)


def may_delete(vm_state: str | None, task_state: str | None) -> bool:
    """A delete may be asked for in any state but an ongoing delete."""
    return vm_state != DELETED and task_state != DELETING


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
    """Why the Ironic ``node`` (provision.NodeState, None: gone) may not be
    deployed or torn down for ``instance_uuid``, or None: it must carry
    that instance."""
    if node is None:
        return 'the node is gone from Ironic'
    if node.instance_uuid != instance_uuid:
        return (f'node {node.uuid} serves '
                f'{node.instance_uuid or "no instance"} now')
    return None


def takeover_key(node: str | None, instance_uuid: str) -> str:
    """The ring key that decides who takes an instance: its node, else
    itself (a build that has no node yet)."""
    return node or instance_uuid
