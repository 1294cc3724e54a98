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
from datetime import UTC
from datetime import datetime

from ironic_compute import ownership

# vm_state
BUILDING = 'building'
ACTIVE = 'active'
ERROR = 'error'
DELETED = 'deleted'
# A record forgotten by "instance remove": the node is left as it is.
REMOVED = 'removed'
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
    """Whether a host's instances go to the living: down for > ``grace`` s.

    Down is measured from the last heartbeat (a service that stops cleanly
    heartbeats until it stops). ``grace`` 0 means never. A host forced down
    by an operator is fenced: its instances move at once, which is what
    forcing a host down is for. A host without a services row (deleted by
    an operator) is gone: at once too. A disabled host takes no new builds
    but still manages its instances while it heartbeats.
    """
    if grace <= 0:
        return False
    if record is None or record.forced_down or record.last_seen_up is None:
        return True
    silent = _seconds_between(record.last_seen_up, now)
    if not record.stopped and silent <= service_down_time:
        return False
    return silent > grace


def _seconds_between(earlier: datetime, later: datetime) -> float:
    # Naive values are UTC (the database's clock).
    if earlier.tzinfo is None:
        earlier = earlier.replace(tzinfo=UTC)
    if later.tzinfo is None:
        later = later.replace(tzinfo=UTC)
    return (later - earlier).total_seconds()


def takeover_key(node: str | None, instance_uuid: str) -> str:
    """The ring key that decides who takes an instance: its node, else
    itself (a build that has no node yet)."""
    return node or instance_uuid
