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

"""The Ironic adapter: the only module that talks to Ironic.

It lists nodes (optionally of one conductor group and/or shards), says whether a node
still exists, and turns a node's properties into the capacity it offers. Every failure
to ask Ironic raises :class:`IronicUnavailable`, so that callers never read "could not
list" as "no nodes".
"""

import contextlib
import dataclasses
import functools
import logging as std_logging
import math
import random
import threading
import time
from collections.abc import Mapping

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
from keystoneauth1 import session as ks_session
from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.ring import shard_ring

LOG = logging.getLogger(__name__)
GROUP = 'ironic'


class _DemoteAttemptErrors(std_logging.Filter):
    """ironicclient logs each failed attempt as an ERROR (with max_retries=0
    every attempt is its last); the adapter logs one line per failure with
    its retries, so theirs goes to DEBUG."""

    def filter(self, record):
        if record.getMessage().startswith('Error contacting Ironic server'):
            record.levelno, record.levelname = std_logging.DEBUG, 'DEBUG'
            return std_logging.getLogger(record.name).isEnabledFor(
                std_logging.DEBUG)
        return True


std_logging.getLogger('ironicclient.common.http').addFilter(
    _DemoteAttemptErrors())


# The fields of a request body that hold a tenant's secret: the rescue
# password, and the config drive (its user data), with what each is.
_SECRET_FIELDS = (('rescue_password', 'a rescue password'),
                  ('configdrive', 'a config drive'))


class _HideSecretBodies(std_logging.Filter):
    """keystoneauth logs each request's body and each answer's body at
    DEBUG (when an operator lowers its level from oslo.log's WARN): a
    rescue request's body holds the rescue password, a deploy's or a
    rebuild's the config drive with the tenant's user data, and Ironic's
    answer with a node's instance_info holds both (the plain rescue
    password while the node is rescued, the config drive it was deployed
    with). A line that holds one keeps only what comes before the body: a
    request's method, URL and headers, an answer's "RESP BODY:"."""

    def filter(self, record):
        text = record.getMessage()
        held = next((what for field, what in _SECRET_FIELDS
                     if f'"{field}"' in text or f"'{field}'" in text), None)
        if held is not None:
            if text.startswith(('REQ: curl ', 'curl ')) and ' -d ' in text:
                # A request's curl line: its body is last, after the
                # method, the URL and the headers (none of which holds a
                # " -d "; the body may: user data "docker run -d ...").
                kept = text.split(' -d ', 1)[0] + ' '
            elif text.startswith('RESP BODY:'):
                kept = 'RESP BODY: '
            else:  # split loggers: the body logger's line is the body
                kept = ''
            record.msg = kept + f'(body not logged: it holds {held})'
            record.args = ()
        return True


# A logger's filter sees only what is logged to that logger, not what its
# children log: every name keystoneauth logs a request or an answer under,
# with and without split_loggers.
for _name in ('keystoneauth.session', 'keystoneauth.session.request',
              'keystoneauth.session.response', 'keystoneauth.session.body'):
    std_logging.getLogger(_name).addFilter(_HideSecretBodies())

MIN_API = (1, 21)     # ``fields`` (1.8) and ``resource_class`` (1.21)
GROUP_API = (1, 46)   # ``conductor_group`` field and filter
TRAITS_API = (1, 37)  # ``traits`` field
RESCUE_API = (1, 38)  # the ``rescue`` and ``unrescue`` verbs, rescue_password
CONFIGDRIVE_API = (1, 56)  # a config drive as a JSON object Ironic builds
ALLOCATION_API = (1, 52)  # the Allocation API (reservations for builds)
LESSEE_API = (1, 65)  # a node's ``lessee``: the tenant of its instance
SHARD_API = (1, 82)   # ``shard`` field and filter
# Negotiation picks the highest of these the server supports; we never ask for "latest",
# so the behaviour we depend on cannot change under us when Ironic is upgraded.
VERSIONS = [f'{major}.{minor}' for major, minor in (MIN_API, RESCUE_API, GROUP_API,
                                                    ALLOCATION_API, CONFIGDRIVE_API,
                                                    LESSEE_API, SHARD_API)]
# (field, first API version that has it). Not updated_at: recent Ironic (39 here) refuses it
# in a node list with ``fields`` (HTTP 400), so Node.updated_at is None from list_nodes.
FIELDS = [('uuid', MIN_API), ('name', MIN_API), ('conductor_group', GROUP_API),
          ('shard', SHARD_API), ('instance_uuid', MIN_API), ('provision_state', MIN_API),
          ('power_state', MIN_API), ('maintenance', MIN_API), ('properties', MIN_API),
          ('resource_class', MIN_API), ('last_error', MIN_API), ('traits', TRAITS_API)]
# ironicclient is imported where it is used, not here: importing it loads openstacksdk
# (about a second), which the commands that never talk to Ironic should not pay for.


@functools.cache
def retriable_errors():
    """409/503 and connection failures (keystoneauth raises ConnectTimeout for a read
    timeout too): what ironicclient itself would retry. The adapter retries them,
    ironicclient not; a request that changes something only while
    :func:`never_sent` or Ironic answered (409, 503)."""
    from ironicclient import exc as ironic_exc
    return (ironic_exc.Conflict, ironic_exc.ServiceUnavailable,
            ironic_exc.ConnectionRefused, ks_exc.RetriableConnectionFailure)


# The requests that only read. Every other request changes something in Ironic
# (whatever a later action adds counts as a change until it is listed here).
READ_CALLS = frozenset({'node.get', 'node.list', 'allocation.get', 'allocation.list',
                        'node.states', 'node.get_console', 'shard.list'})


def _causes(error):
    """``error`` and every error it was raised from or wraps: its __cause__ and
    __context__, urllib3's ``reason`` and the errors among its args."""
    seen, todo = [], [error]
    while todo:
        current = todo.pop()
        if current is None or any(current is old for old in seen):
            continue
        seen.append(current)
        todo += [current.__cause__, current.__context__, getattr(current, 'reason', None)]
        todo += [arg for arg in getattr(current, 'args', ()) if isinstance(arg, BaseException)]
    return seen


def may_have_acted(error) -> bool:
    """Whether Ironic may have carried out a change whose request failed with
    ``error``: anything but Ironic's own answer that it did not (a 4xx, a 503)
    and a request that never left (:func:`never_sent`). A 500, 502 or 504 may
    come after the API handed the change to its conductor (an RPC that timed
    out, a proxy that gave up waiting); a read timeout or a reset after
    sending, an unknown error, may come after Ironic received it."""
    from ironicclient import exc as ironic_exc
    if isinstance(error, (exception.NotSent, exception.IronicUnavailable)):
        return False  # a fence's refusal, or a stop: not sent
    if isinstance(error, (ironic_exc.HTTPClientError, ironic_exc.ServiceUnavailable)):
        return False
    return not never_sent(error)


def never_sent(error) -> bool:
    """Whether a failed request certainly never reached Ironic: the connection was
    refused, or could not be opened (a connect timeout, a name that does not resolve).

    keystoneauth raises the same ConnectFailure for a refused connection and for one
    reset after the request went out, and the same ConnectTimeout for a connect timeout
    and a read timeout; the errors it was raised from (requests', urllib3's) tell them
    apart. Anything else, unknown included, may have been received."""
    import requests
    from ironicclient import exc as ironic_exc
    from urllib3 import exceptions as urllib3_exc
    for cause in _causes(error):
        if isinstance(cause, (ConnectionRefusedError, urllib3_exc.NewConnectionError,
                              requests.exceptions.ConnectTimeout,
                              ironic_exc.ConnectionRefused)):
            return True
    return False
# No wait between two retries is longer than BACKOFF_CAP × [ironic]api_retry_interval.
BACKOFF_CAP = 8
POOL_SIZE = 10  # requests' default: connections kept per Ironic endpoint


# The name GET /v1/shards gives the count of the nodes without a shard.
UNSHARDED = shard_ring.UNSHARDED

# What the compute_nodes columns hold (Integer, String(32)).
MAX_COUNT = 2**31 - 1
MAX_ARCH_LENGTH = 32


@contextlib.contextmanager
def provisioning_errors():
    """ironicclient's errors as the project's: IronicNotFound, IronicRefused, and
    IronicUnavailable (ServiceStopping kept) for every other failure.

    What ``Ironic.request`` raises, and what a fake of ironicclient behind
    the same boundary raises through it."""
    from ironicclient import exc as ironic_exc
    try:
        yield
    except (exception.IronicUnavailable, exception.NotSent):
        raise
    except ironic_exc.NotFound as exc:
        raise exception.IronicNotFound(str(exc)) from exc
    except ironic_exc.Conflict as exc:
        raise exception.IronicConflict(str(exc)) from exc
    except (ironic_exc.BadRequest, ironic_exc.NotAcceptable) as exc:
        raise exception.IronicRefused(str(exc)) from exc
    except Exception as exc:
        raise exception.IronicUnavailable(str(exc)) from exc


@dataclasses.dataclass(frozen=True)
class Node:
    uuid: str
    name: str | None
    conductor_group: str
    shard: str | None
    instance_uuid: str | None
    provision_state: str | None
    power_state: str | None
    maintenance: bool
    properties: Mapping = dataclasses.field(hash=False)
    resource_class: str | None
    last_error: str | None
    updated_at: str | None
    traits: frozenset = frozenset()


@dataclasses.dataclass(frozen=True)
class Resources:
    vcpus: int
    memory_mb: int
    local_gb: int
    vcpus_used: int
    memory_mb_used: int
    local_gb_used: int
    cpu_arch: str | None
    resource_class: str | None
    capabilities: dict[str, str] = dataclasses.field(hash=False)
    available: bool


def offers_capacity(node: Node) -> bool:
    """True only for an ``available`` node, not in maintenance, without an instance, whose
    power state is not ``error``. Every other node (deployed, being deployed/cleaned/
    inspected, ``*failed``, ``error``, ``enroll``, ``manageable``...) offers none: the
    scheduler must not place an instance there.
    """
    # An unknown (None) power state is accepted, unlike Nova: fake-hardware nodes never
    # get one, and a BMC that stops answering shows as ``error`` or as maintenance.
    return (node.provision_state == 'available' and not node.maintenance
            and node.instance_uuid is None and node.power_state != 'error')


def _count(node: Node, field: str) -> int:
    """A non-negative integer property; 0 and a warning when missing or bad."""
    value = node.properties.get(field)
    try:
        if isinstance(value, bool):   # bool is an int: True would count as 1
            raise TypeError
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError
    except (TypeError, ValueError):
        LOG.warning('Ironic node %(node)s: property %(field)s is %(value)r, not a '
                    'non-negative number; counting 0',
                    {'node': node.uuid, 'field': field, 'value': value})
        return 0
    if number > MAX_COUNT:
        # The columns are 32-bit integers: a larger value would make the
        # database refuse the whole write of the cycle.
        LOG.warning('Ironic node %(node)s: property %(field)s is %(value)r, more than '
                    '%(max)d; counting 0', {'node': node.uuid, 'field': field,
                                            'value': value, 'max': MAX_COUNT})
        return 0
    if not number.is_integer():
        LOG.warning('Ironic node %(node)s: property %(field)s is %(value)r, not an '
                    'integer; counting %(int)d',
                    {'node': node.uuid, 'field': field, 'value': value, 'int': int(number)})
    return int(number)


def _arch(node: Node) -> str | None:
    arch = node.properties.get('cpu_arch')
    if arch is None or arch == '':
        return None
    if not isinstance(arch, str) or len(arch) > MAX_ARCH_LENGTH:
        LOG.warning('Ironic node %(node)s: property cpu_arch is %(value)r, not a name of '
                    'at most %(max)d characters; ignoring it',
                    {'node': node.uuid, 'value': arch, 'max': MAX_ARCH_LENGTH})
        return None
    return arch


def _capabilities(node: Node) -> dict[str, str]:
    """``properties['capabilities']``: a ``"k1:v1,k2:v2"`` string or a dict."""
    raw = node.properties.get('capabilities')
    if raw is None or raw == '':
        return {}
    if isinstance(raw, Mapping):
        return {str(k): str(v) for k, v in raw.items()}
    if not isinstance(raw, str):
        LOG.warning('Ironic node %(node)s: property capabilities is %(value)r, neither '
                    'a string nor a dict; ignoring it', {'node': node.uuid, 'value': raw})
        return {}
    result = {}
    for item in filter(None, (part.strip() for part in raw.split(','))):
        key, sep, value = item.partition(':')
        if not sep or not key.strip():
            LOG.warning('Ironic node %(node)s: capability %(item)r is not "key:value"; '
                        'ignoring it', {'node': node.uuid, 'item': item})
            continue
        result[key.strip()] = value.strip()
    return result


def node_resources(node: Node) -> Resources:
    """The capacity a node has and how much of it is used; never raises.

    ``vcpus`` (property ``cpus``), ``memory_mb`` and ``local_gb`` are totals; the
    ``*_used`` values equal the totals unless :func:`offers_capacity`, else 0.
    """
    vcpus, memory_mb, local_gb = (_count(node, f) for f in ('cpus', 'memory_mb', 'local_gb'))
    free = offers_capacity(node)
    return Resources(
        vcpus=vcpus, memory_mb=memory_mb, local_gb=local_gb,
        vcpus_used=0 if free else vcpus, memory_mb_used=0 if free else memory_mb,
        local_gb_used=0 if free else local_gb,
        cpu_arch=_arch(node),
        resource_class=node.resource_class, capabilities=_capabilities(node), available=free)


def parse_version(text) -> tuple[int, int]:
    major, minor = str(text).split('.')
    return int(major), int(minor)


def _backoff(interval: float, retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1, 2...) of a request.

    The nominal wait is ``interval``, doubled on each retry up to BACKOFF_CAP × interval;
    the wait is a random time between half of it and all of it ("equal jitter"), so that
    services that failed together do not retry together.
    """
    nominal = interval * min(2 ** (retry - 1), BACKOFF_CAP)
    return random.uniform(nominal / 2, nominal)


def _with_retries(opts, func, *args, stopping=None, before=None, change=False,
                  **kwargs):
    """``func(*args, **kwargs)``, retried at most ``opts.api_max_retries`` times, with
    :func:`_backoff`, while it raises one of :func:`retriable_errors`; then its last error
    is raised.

    ``stopping`` (a threading.Event): once set, a wait between two attempts ends at once
    and :class:`ServiceStopping` is raised instead of retrying. ``before``: run right
    before every attempt (a fence); what it raises ends the retries, as it is.
    ``change``: the request changes something in Ironic, so it is retried only when
    Ironic answered without acting (409, 503) or the request never left
    (:func:`never_sent`); any other failure raises :class:`MaybeSent` at once.
    """
    retry = 0
    while True:
        if before is not None:
            before()
        try:
            return func(*args, **kwargs)
        except Exception as e:
            if change and may_have_acted(e):
                # Sending it again could do it twice (a second reboot).
                raise exception.MaybeSent(f'no answer, Ironic may have received it: {e}') from e
            if not isinstance(e, retriable_errors()):
                raise
            retry += 1
            if retry > opts.api_max_retries:
                raise
            delay = _backoff(opts.api_retry_interval, retry)
            LOG.warning('Ironic request failed (%(error)s); retry %(retry)d of %(max)d in '
                        '%(delay).1f s', {'error': e, 'retry': retry,
                                          'max': opts.api_max_retries, 'delay': delay})
            _pause(delay, stopping, e)


def _pause(delay, stopping, error):
    """Wait ``delay`` seconds before a retry; ServiceStopping when ``stopping`` is or
    gets set meanwhile (the error that made us wait goes with it)."""
    if stopping is None:
        time.sleep(delay)
    elif stopping.wait(delay):
        raise exception.ServiceStopping(f'the service is stopping; not retried: {error}') from error


def _to_node(raw) -> Node:
    get = raw.to_dict().get if hasattr(raw, 'to_dict') else vars(raw).get
    properties = get('properties')
    return Node(
        uuid=get('uuid'), name=get('name'), conductor_group=get('conductor_group') or '',
        shard=get('shard'), instance_uuid=get('instance_uuid'),
        provision_state=get('provision_state'), power_state=get('power_state'),
        maintenance=bool(get('maintenance')),
        properties=dict(properties) if isinstance(properties, Mapping) else {},
        resource_class=get('resource_class'), last_error=get('last_error'),
        updated_at=get('updated_at'), traits=frozenset(get('traits') or ()))


class _NextLink:
    """ironicclient's HTTP client, noting whether the last answer had a
    ``next`` link (ironicclient's list() drops it)."""

    def __init__(self, http):
        self._http = http
        self.more = None  # unknown

    def __getattr__(self, name):
        return getattr(self._http, name)

    def json_request(self, method, url, **kwargs):
        response, body = self._http.json_request(method, url, **kwargs)
        if isinstance(body, Mapping):
            self.more = bool(body.get('next'))
        return response, body


def _one_page(client, **kwargs):
    """(One page of ``client.node.list(**kwargs)``, whether Ironic's answer
    says there may be more: True, False, or None when it cannot be seen)."""
    manager = client.node
    http = getattr(manager, 'api', None)
    if http is None:  # not ironicclient's NodeManager
        return list(manager.list(**kwargs)), None
    # A manager of its own for the page: the same list() over a client
    # that sees the answer's body.
    seen = _NextLink(http)
    return list(type(manager)(seen).list(**kwargs)), seen.more


class IronicClient:
    """Lists and checks Ironic nodes through one lazily built ironicclient."""

    def __init__(self, conf, client=None):
        self._conf = conf
        self._client = client          # injectable for unit tests
        self._lock = threading.Lock()
        # Set when the service stops: the waits between retries end at once, so
        # that a stop is not held up by an Ironic that does not answer. A request
        # under way ends within [ironic]timeout.
        self.stopping = threading.Event()

    def _get_client(self):
        """The client, built (and its API version negotiated) on first use."""
        with self._lock:
            if self._client is None:
                self._client = self._build()
            return self._client

    def _build(self):
        opts = self._conf[GROUP]
        if not opts.auth_type:
            raise exception.IronicConfigError(
                '[ironic]auth_type is not set: use "password" (Keystone) or "none" '
                '(standalone Ironic, with [ironic]endpoint_override)')
        try:
            auth = ks_loading.load_auth_from_conf_options(self._conf, GROUP)
            session = ks_loading.load_session_from_conf_options(self._conf, GROUP, auth=auth)
        except ks_exc.ClientException as e:
            raise exception.IronicConfigError(f'invalid [ironic] auth options: {e}') from e
        self._size_connection_pool(session)
        # max_retries=0: ironicclient makes one attempt per call (None would mean its
        # default of 5 retries at a fixed interval); _with_retries() does the retrying.
        kwargs = {'session': session, 'os_ironic_api_version': list(VERSIONS),
                  'max_retries': 0, 'retry_interval': 0,
                  'service_type': opts.service_type, 'region_name': opts.region_name,
                  'valid_interfaces': opts.valid_interfaces}
        if opts.endpoint_override:
            kwargs['endpoint'] = opts.endpoint_override
        # Never log kwargs or options wholesale: they lead to passwords and tokens.
        LOG.info('Connecting to Ironic at %(endpoint)s (region %(region)s, auth_type '
                 '%(auth_type)s)', {'endpoint': opts.endpoint_override or 'catalog endpoint',
                                    'region': opts.region_name, 'auth_type': opts.auth_type})
        from ironicclient import client as ironic_client
        try:
            client = ironic_client.get_client('1', **kwargs)
            self._negotiate(client)
        except Exception as e:
            raise exception.IronicUnavailable(f'cannot connect to Ironic: {e}') from e
        LOG.info('Ironic API version %s', client.current_api_version)
        return client

    def _size_connection_pool(self, session):
        # Every build worker and the cycle may wait on Ironic at once; with
        # requests' default pool of 10 connections a burst of builds logs
        # "Connection pool is full" and reconnects for every request.
        builds = (self._conf.max_concurrent_builds
                  if 'max_concurrent_builds' in self._conf else 0)
        size = max(POOL_SIZE, builds + 2)  # + the cycle, + one to spare
        for scheme, adapter in list(session.session.adapters.items()):
            if isinstance(adapter, ks_session.TCPKeepAliveAdapter):
                session.mount(scheme, ks_session.TCPKeepAliveAdapter(
                    pool_maxsize=size,
                    tls_ciphers=getattr(adapter, 'tls_ciphers', None),
                    tls_min_version=getattr(adapter, 'tls_min_version', None)))

    def _call(self, func, *args, before=None, change=False, **kwargs):
        """One request to Ironic, with the retries of [ironic]api_max_retries
        (``before``, ``change``: see _with_retries)."""
        return _with_retries(self._conf[GROUP], func, *args, stopping=self.stopping,
                             before=before, change=change, **kwargs)

    def _negotiate(self, client):
        try:
            self._call(client.negotiate_api_version)
        except OSError as e:
            # ironicclient caches the version under $XDG_CACHE_HOME after choosing it;
            # an unwritable cache must not make Ironic look unavailable forever.
            if not client.is_api_version_negotiated:
                raise
            LOG.warning('Cannot cache the Ironic API version (%s); set XDG_CACHE_HOME '
                        'to a writable directory', e)

    def list_nodes(self, conductor_group: str | None = None,
                   shards: list[str] | None = None, **filters) -> list[Node]:
        """Every node matching the filters, each once; ``None`` means "no filter".

        ``filters`` go to Ironic as they are (``provision_state``,
        ``resource_class``, ``associated``, ``maintenance``, ``sharded=False``
        for the nodes without a shard...).

        ``conductor_group=''`` is the default group. Raises IronicConfigError when this
        Ironic cannot apply a requested filter, IronicUnavailable on any other failure
        (never returns a partial list).
        """
        client = self._get_client()
        version = parse_version(client.current_api_version)
        if conductor_group is not None and version < GROUP_API:
            raise exception.IronicConfigError(
                f'[ironic]partition_key is set but Ironic API {version[0]}.{version[1]} is '
                f'older than 1.46, which cannot filter nodes by conductor group')
        if shards is not None and not shards:
            raise exception.IronicConfigError('an empty list of shards selects no node')
        if (shards is not None or filters.get('sharded') is not None) and version < SHARD_API:
            raise exception.IronicConfigError(
                f'[ironic]shard is set but Ironic API {version[0]}.{version[1]} is older '
                f'than 1.82, which cannot filter nodes by shard')
        fields = [name for name, since in FIELDS if version >= since]
        try:
            nodes = self._list_pages(client, fields, conductor_group, shards, filters)
        except exception.IronicUnavailable:
            raise
        except Exception as e:  # whatever broke, the inventory is unknown
            self._forget_on_version_error(e)
            raise exception.IronicUnavailable(f'cannot list Ironic nodes: {e}') from e
        return list(nodes.values())

    def _list_pages(self, client, fields, conductor_group, shards,
                    filters=None) -> dict[str, Node]:
        # Not limit=0: Ironic's ``next`` links drop the conductor_group and shard filters,
        # so ironicclient would list every group's nodes from the second page on. One page
        # per call (limit=None: the server's max_limit), filters and marker sent each time,
        # until a page without a ``next`` link (Ironic gives one with every full page, and
        # filters these listings in SQL only) or an empty page: a short page alone is not
        # proof of the end (the page size is the server's).
        nodes: dict[str, Node] = {}
        marker = None
        while True:
            raw_page, more = self._call(
                _one_page, client, fields=fields, marker=marker,
                conductor_group=conductor_group, shards=shards, **(filters or {}))
            page = [_to_node(raw) for raw in raw_page]
            if not page:
                return nodes
            if page[-1].uuid in nodes:   # a server ignoring the marker would loop forever
                raise exception.IronicUnavailable(
                    f'Ironic node listing does not advance past marker {marker}')
            for node in page:
                nodes.setdefault(node.uuid, node)
            if more is False:
                return nodes
            marker = page[-1].uuid

    def list_shards(self) -> dict[str, int]:
        """``{shard: node count}`` as ``GET /v1/shards`` gives it (API 1.82).

        The unsharded nodes count under :data:`UNSHARDED` ('None'). Ironic
        counts over all conductor groups (the endpoint has no filter): the
        counts of a partition's shards are exact only when shard names are
        not shared between conductor groups (``ironic shard-assign`` names
        them per group). Raises IronicConfigError on an older Ironic,
        IronicUnavailable on any other failure.
        """
        client = self._shard_client()
        try:
            shards = self._call(client.shard.list)
            result = {}
            for shard in shards:
                get = shard.to_dict().get if hasattr(shard, 'to_dict') else vars(shard).get
                result[str(get('name'))] = int(get('count'))
        except Exception as e:
            self._forget_on_version_error(e)
            raise exception.IronicUnavailable(f'cannot list Ironic shards: {e}') from e
        return result

    def _shard_client(self):
        """The client, if its Ironic has shards; IronicConfigError if not."""
        client = self._get_client()
        version = parse_version(client.current_api_version)
        if version < SHARD_API:
            raise exception.IronicConfigError(
                f'Ironic API {version[0]}.{version[1]} is older than 1.82, which has no '
                f'shards')
        return client

    def set_shard(self, uuid: str, shard: str) -> None:
        """Give node ``uuid`` the shard ``shard`` (API 1.82)."""
        client = self._shard_client()
        patch = [{'op': 'add', 'path': '/shard', 'value': shard}]
        try:
            self._call(client.node.update, uuid, patch)
        except Exception as e:
            self._forget_on_version_error(e)
            raise exception.IronicUnavailable(
                f'cannot set the shard of Ironic node {uuid}: {e}') from e

    def get_nodes(self, uuids) -> list[Node]:
        """The nodes of ``uuids`` that exist, one request each (Ironic has no
        filter by a list of uuids); a node Ironic answers 404 for is left out.
        IronicUnavailable on any other failure (never a partial answer)."""
        from ironicclient import exc as ironic_exc
        client = self._get_client()
        version = parse_version(client.current_api_version)
        fields = [name for name, since in FIELDS if version >= since]
        nodes = []
        for uuid in dict.fromkeys(uuids):
            try:
                nodes.append(_to_node(self._call(client.node.get, uuid, fields=fields)))
            except ironic_exc.NotFound:
                continue
            except Exception as e:
                self._forget_on_version_error(e)
                raise exception.IronicUnavailable(f'cannot get Ironic node {uuid}: {e}') from e
        return nodes

    def api(self):
        """The ironicclient client (negotiated): its API version."""
        return self._get_client()

    def request(self, call, /, *args, before=None, **kwargs):
        """One provisioning request, ``call`` naming ironicclient's method
        ('allocation.create', 'node.set_power_state'...), with the retries of
        [ironic]api_max_retries; raises as ``provisioning_errors`` says.

        ``before``: run right before every attempt, the first and each retry
        (the fence of a call that changes something); a NotSent it raises
        ends the request, unsent, as it is. A call not in READ_CALLS changes
        something: after a failure that may have reached Ironic it raises
        MaybeSent instead of being sent again."""
        manager, method = call.split('.')
        with provisioning_errors():
            func = getattr(getattr(self._get_client(), manager), method)
            try:
                return self._call(func, *args, before=before,
                                  change=call not in READ_CALLS, **kwargs)
            except Exception as e:
                self._forget_on_version_error(e)
                raise

    def node_exists(self, uuid: str) -> bool:
        """False only when Ironic answers 404 for the node; IronicUnavailable otherwise."""
        from ironicclient import exc as ironic_exc
        client = self._get_client()
        try:
            self._call(client.node.get, uuid, fields=['uuid'])
        except ironic_exc.NotFound:
            return False
        except Exception as e:
            self._forget_on_version_error(e)
            raise exception.IronicUnavailable(f'cannot check Ironic node {uuid}: {e}') from e
        return True

    def _forget_on_version_error(self, error):
        # Ironic was downgraded under us: negotiate again on the next call.
        from ironicclient import exc as ironic_exc
        if isinstance(error, ironic_exc.UnsupportedVersion):
            with self._lock:
                self._client = None
