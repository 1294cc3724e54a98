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

from ironic_compute import exception

# vm_state
BUILDING = 'building'
ACTIVE = 'active'
STOPPED = 'stopped'  # deployed, powered off on purpose
RESCUED = 'rescued'  # booted into Ironic's rescue ramdisk
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
RESCUING = 'rescuing'  # instance rescue
UNRESCUING = 'unrescuing'  # instance unrescue
# power_state: what Ironic last said (None: not read yet)
POWER_ON, POWER_OFF, POWER_UNKNOWN = 'on', 'off', 'unknown'

# What a host's worker does next for an instance in a task_state.
ACTIONS = {SCHEDULED: 'build', SPAWNING: 'build', DELETING: 'delete',
           RELEASING: 'release', POWERING_OFF: 'power', POWERING_ON: 'power',
           REBOOTING: 'reboot', REBUILDING: 'rebuild', RESCUING: 'rescue',
           UNRESCUING: 'unrescue'}
PENDING_TASKS = tuple(ACTIONS)


@dataclasses.dataclass(frozen=True)
class Request:
    """An action an operator asks for on a built instance."""

    task_state: str
    allowed_from: tuple  # vm_states it may be asked in
    done_state: str  # the vm_state once it is done


# The commands of ``ironic-compute-manage instance``: stop, start, reboot,
# rebuild, rescue and unrescue. A reboot or a rebuild of a stopped instance
# powers it on. A rescued instance runs Ironic's rescue ramdisk, not its
# own system: only unrescue (and delete) apply to it; rescue is asked
# again there to give the ramdisk a new password, as Ironic allows.
REQUESTS = {
    'stop': Request(POWERING_OFF, (ACTIVE,), STOPPED),
    'start': Request(POWERING_ON, (STOPPED,), ACTIVE),
    'reboot': Request(REBOOTING, (ACTIVE, STOPPED), ACTIVE),
    'rebuild': Request(REBUILDING, (ACTIVE, STOPPED), ACTIVE),
    'rescue': Request(RESCUING, (ACTIVE, STOPPED, RESCUED), RESCUED),
    'unrescue': Request(UNRESCUING, (RESCUED,), ACTIVE),
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


# The key of the rescue password in an instance's task_args: it stays on
# the row (a kill or a takeover must not lose it before it is sent) until
# the rescue ends, done or failed, and is never logged or shown.
RESCUE_PASSWORD = 'rescue_password'
# Characters of a rescue password at most: Ironic sets no limit of its
# own; this one keeps a mistaken file (an image, a log) out of the row.
RESCUE_PASSWORD_MAX = 4096


def rescue_password(text: str) -> str:
    """The rescue password in ``text`` (a file's content or standard
    input), with its one trailing line end removed.

    Raises exception.InvalidRequest, in one line that never quotes it,
    when it is empty or blank (Ironic refuses those), spans several lines
    or is longer than RESCUE_PASSWORD_MAX characters.
    """
    if text.endswith('\n'):
        text = text[:-1]
        if text.endswith('\r'):
            text = text[:-1]
    if not text.strip():
        raise exception.InvalidRequest('the rescue password is empty')
    if '\n' in text or '\r' in text:
        raise exception.InvalidRequest(
            'the rescue password must be one line')
    if len(text) > RESCUE_PASSWORD_MAX:
        raise exception.InvalidRequest(
            f'the rescue password is longer than {RESCUE_PASSWORD_MAX} '
            'characters')
    return text


# vm_states the power-state sync leaves alone (not even recorded): their
# node's power is the rescue ramdisk's, not the tenant's system's.
SYNC_LEFT_ALONE = (RESCUED,)

# vm_states whose node may have its console enabled (instance console).
CONSOLE_STATES = (ACTIVE, STOPPED, RESCUED)

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
    if task_state is not None or maintenance or vm_state in SYNC_LEFT_ALONE:
        return None
    if vm_state == ACTIVE and node_power == POWER_OFF:
        return SYNC_MARK_STOPPED
    if vm_state == STOPPED and node_power == POWER_ON:
        return SYNC_POWER_OFF
    return None


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
        raise exception.InvalidRequest('a resource class is required')
    if len(value) > RESOURCE_CLASS_MAX or not _RESOURCE_CLASS.fullmatch(
            value):
        raise exception.InvalidRequest(
            f'invalid resource class {_shown(value)}: use up to '
            f'{RESOURCE_CLASS_MAX} letters, digits and "-", ".", "_", "~"')


def _check_trait(value):
    if (not isinstance(value, str) or len(value) > TRAIT_MAX
            or not _TRAIT.fullmatch(value)):
        raise exception.InvalidRequest(
            f'invalid trait {_shown(value)}: a trait is a standard one (such '
            'as HW_CPU_X86_AVX2) or CUSTOM_ followed by upper-case letters, '
            f'digits and "_", up to {TRAIT_MAX} characters')


# A capability as Ironic's node properties hold it ("k1:v1,k2:v2"): a key
# without ":", and neither may hold "," (Ironic's separator) nor "|" (the
# compute_nodes column's, see compute_nodes.capabilities_text).
CAPABILITY_MAX = 255
_CAPABILITY_KEY = re.compile(r'[^:,|=\s]+')
_CAPABILITY_VALUE = re.compile(r'[^,|\s]+')
# A file system name, as Ironic's partition deploy passes it to mkfs
# (ext4, xfs, vfat...): it decides whether the tool exists, on the node.
_EPHEMERAL_FORMAT = re.compile(r'[a-z][a-z0-9]{0,31}')


def _check_capability(key, value):
    if not (isinstance(key, str) and isinstance(value, str)
            and len(key) <= CAPABILITY_MAX and len(value) <= CAPABILITY_MAX
            and _CAPABILITY_KEY.fullmatch(key)
            and _CAPABILITY_VALUE.fullmatch(value)):
        raise exception.InvalidRequest(
            f'invalid capability {_shown(f"{key}={value}")}: KEY=VALUE, the '
            'key without ":" or "=", neither with "," "|" or spaces, up to '
            f'{CAPABILITY_MAX} characters each')


def parse_capability(text):
    """(key, value) of a KEY=VALUE capability; InvalidRequest if it is
    not one."""
    key, sep, value = text.partition('=')
    if not sep:
        raise exception.InvalidRequest(
            f'invalid capability {_shown(text)}: use KEY=VALUE')
    _check_capability(key, value)
    return key, value


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """What a node must offer to host the instance.

    ``capabilities``: (key, value) pairs the node's capabilities must
    hold, exactly. The local disk must hold the root (``disk_gb``), the
    ephemeral partition and the swap (:meth:`disk_needed_gb`).
    """

    resource_class: str
    vcpus: int = 0
    memory_mb: int = 0
    disk_gb: int = 0
    traits: frozenset = frozenset()
    partition_key: str | None = None
    capabilities: tuple = ()
    ephemeral_gb: int = 0
    ephemeral_format: str | None = None
    swap_mb: int = 0

    def __post_init__(self):
        # Checked here, before the values reach a query or Ironic, so the
        # CLI and a row read back refuse them alike.
        _check_resource_class(self.resource_class)
        for trait in sorted(self.traits, key=str):
            _check_trait(trait)
        for name in ('vcpus', 'memory_mb', 'disk_gb', 'ephemeral_gb',
                     'swap_mb'):
            if getattr(self, name) < 0:
                raise exception.InvalidRequest(f'{name} must not be negative')
        capabilities = dict(self.capabilities)
        for key, value in capabilities.items():
            _check_capability(key, value)
        object.__setattr__(self, 'capabilities',
                           tuple(sorted(capabilities.items())))
        if self.ephemeral_format is not None:
            if not self.ephemeral_gb:
                raise exception.InvalidRequest(
                    'an ephemeral format needs an ephemeral size '
                    '(--ephemeral-gb)')
            if not _EPHEMERAL_FORMAT.fullmatch(self.ephemeral_format):
                raise exception.InvalidRequest(
                    f'invalid ephemeral format {_shown(self.ephemeral_format)}'
                    ': a file system name such as ext4 or xfs')

    def traits_json(self):
        return json.dumps(sorted(self.traits)) if self.traits else None

    def capabilities_json(self):
        """The capabilities as the instance row keeps them (None: none)."""
        return (json.dumps(dict(self.capabilities), sort_keys=True)
                if self.capabilities else None)

    def disk_needed_gb(self):
        """The local disk a node needs, in GB: root, ephemeral and swap
        (rounded up to a GB), as Ironic's partition deploy lays them out."""
        return self.disk_gb + self.ephemeral_gb + -(-self.swap_mb // 1024)

    def describe(self):
        """The spec in one line, for faults and errors."""
        parts = [f'resource class {self.resource_class}']
        parts += [f'{getattr(self, name)} {unit}'
                  for name, unit in (('vcpus', 'vcpus'), ('memory_mb', 'MB'),
                                     ('disk_gb', 'GB disk'))
                  if getattr(self, name)]
        parts += [f'{getattr(self, name)} {unit}'
                  for name, unit in (('ephemeral_gb', 'GB ephemeral'),
                                     ('swap_mb', 'MB swap'))
                  if getattr(self, name)]
        if self.traits:
            parts.append('traits ' + ','.join(sorted(self.traits)))
        if self.capabilities:
            parts.append('capabilities ' + ','.join(
                f'{key}={value}' for key, value in self.capabilities))
        if self.partition_key:
            parts.append(f'conductor group {self.partition_key}')
        return ', '.join(parts)


def parse_traits(text):
    """The traits stored as JSON (None: no traits)."""
    return frozenset(json.loads(text)) if text else frozenset()


def parse_capabilities(text):
    """The capabilities stored as a JSON object, as sorted (key, value)
    pairs (None: none)."""
    return tuple(sorted(json.loads(text).items())) if text else ()


def deploy_info(spec, name, image_source, image=None, tenant=None):
    """What a build patches into the node's instance_info: {key: value}.

    The keys and forms of nova's ironic driver (numbers as strings,
    capabilities a JSON object in a string, which Ironic's deploy reads,
    for example ``boot_mode``). ``image``: the image's checksum, kernel
    and ramdisk ({name: value or None}); ``tenant``: its project_id and
    user_id (the same). Only what is set is sent, beside the image, the
    root, the swap and the sizes asked for.
    """
    info = {'image_source': image_source, 'root_gb': str(spec.disk_gb),
            'swap_mb': str(spec.swap_mb), 'vcpus': str(spec.vcpus),
            'memory_mb': str(spec.memory_mb)}
    if name:
        info['display_name'] = name
    if spec.ephemeral_gb:
        info['ephemeral_gb'] = str(spec.ephemeral_gb)
        if spec.ephemeral_format:
            info['ephemeral_format'] = spec.ephemeral_format
    if spec.capabilities:
        info['capabilities'] = json.dumps(dict(spec.capabilities),
                                          sort_keys=True)
    for key in ('image_checksum', 'kernel', 'ramdisk'):
        if (image or {}).get(key):
            info[key] = image[key]
    for key in ('project_id', 'user_id'):
        if (tenant or {}).get(key):
            info[key] = tenant[key]
    return info


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
    capabilities: Mapping = dataclasses.field(default_factory=dict,
                                              hash=False)


# The checks of a node against a spec, in the order they are reported.
_CHECKS = (
    ('not available', lambda spec, node: node.available),
    ('of another resource class',
     lambda spec, node: node.resource_class == spec.resource_class),
    ('with too few vcpus', lambda spec, node: node.vcpus >= spec.vcpus),
    ('with too little memory',
     lambda spec, node: node.memory_mb >= spec.memory_mb),
    ('with too little disk',
     lambda spec, node: node.local_gb >= spec.disk_needed_gb()),
    ('without the traits', lambda spec, node: spec.traits <= node.traits),
)


def lacks(key, value):
    """The reason of a node without the requested capability ``key`` with
    ``value``: a refusal names each capability nodes lacked."""
    return f'without {key}={value}'


# Why a node does not fit, in the order a refusal lists them: a node counts
# under the first one it fails (db/node_match.py asks the same in SQL).
# The capabilities come last, one reason each (``reasons``).
TAKEN = 'taken by another instance'
REASONS = (TAKEN, *(why for why, _ in _CHECKS))


def reasons(spec: RequestSpec) -> tuple:
    """Every reason a node may fail ``spec`` for, in the order of REASONS
    then of the spec's capabilities."""
    return REASONS + tuple(lacks(key, value) for key, value in spec.capabilities)


def _first_failed(spec, node):
    """The first reason ``node`` fails ``spec`` for, or None if it fits."""
    for why, check in _CHECKS:
        if not check(spec, node):
            return why
    for key, value in spec.capabilities:
        if node.capabilities.get(key) != value:
            return lacks(key, value)
    return None


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
        reason = _first_failed(spec, node)
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

    ``failed`` counts the nodes by the first reason (of ``reasons(spec)``)
    they failed; the reasons are listed in that order.
    """
    if not total:
        return (f'no free node: this host has no node for '
                f'{spec.describe()}')
    why = '; '.join(f'{failed[reason]} {reason}' for reason in reasons(spec)
                    if failed.get(reason))
    return f'no free node for {spec.describe()} ({why})'


def next_action(task_state: str | None) -> str | None:
    """'build', 'delete', 'release', 'power', 'reboot', 'rebuild',
    'rescue', 'unrescue' or None: what the managing host still has to do."""
    return ACTIONS.get(task_state)


def fence_refusal(current, claim, host: str, states) -> str | None:
    """Why ``host`` may not act for the instance of ``claim`` (its row as
    a worker read it) now that its row is ``current`` (None: deleted), or
    None when it may: the row must still have this host, the claim's
    generation, a task state among ``states`` and the claim's version (the
    worker's own writes return the row it acts with from then on)."""
    if current is None:
        return 'the instance is deleted'
    if current.host != host:
        return f'it is managed by {current.host} now'
    if current.generation != claim.generation:
        return (f'it was taken over since (generation {current.generation}, '
                f'not {claim.generation})')
    if current.task_state not in states:
        return f'its task is {current.task_state or "none"} now'
    if current.version != claim.version:
        # Back to the values the worker read, but written since (a request
        # that ended and was asked again): not this worker's to act on.
        return (f'it was written since this worker read it (version '
                f'{current.version}, not {claim.version})')
    return None


def node_refusal(node, instance_uuid: str) -> str | None:
    """Why the Ironic ``node`` (answers.NodeState or Serving; None: gone)
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
