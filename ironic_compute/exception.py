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

"""Every exception of ironic-compute, defined once, under one base class.

A module raises and catches these as ``exception.Name`` (``from
ironic_compute import exception``); no other module defines or re-exports
one. The message is given by whoever raises, as one line: it is what the
log, the instance's fault or the CLI shows, so it says what failed and,
where it helps, what to do.

This module is pure: it does no I/O and imports no module of the project,
so every room may import it, the pure rules included.

ironicclient's errors never pass beyond the Ironic adapter: ``ironic.py``
translates them once (``provisioning_errors``, and the listing's and the
node read's own handlers) into IronicNotFound, IronicRefused and
IronicUnavailable.
"""


class IronicComputeError(Exception):
    """The base class of every exception this project defines."""


# The Ironic adapter (ironic.py).

class IronicUnavailable(IronicComputeError):
    """Ironic could not be asked, or did not answer usefully: a listing,
    a node read or a request failed. Never read as "no nodes": the caller
    skips its cycle or leaves the work as it is, and tries again later."""


class ServiceStopping(IronicUnavailable):
    """The service is stopping, so a failed Ironic request was not retried.

    A subclass of IronicUnavailable, so every caller already leaves the work
    as it is for whoever manages it next.
    """


class IronicConfigError(IronicUnavailable):
    """The configuration cannot be honoured by this Ironic: an invalid
    ``[ironic]`` auth option, or a filter (conductor group, shards) its API
    version cannot apply.

    A subclass of IronicUnavailable, so a caller that skips the cycle on
    IronicUnavailable is safe; catch it first to log it as a configuration
    error.
    """


class MaybeSent(IronicUnavailable):
    """A request that changes something failed after Ironic may have
    received it (a read timeout, a connection reset once it was sent), so it
    is not retried. The caller reads what Ironic did and decides; a caller
    that does not is left with an IronicUnavailable, as for any failure."""


class IronicNotFound(IronicComputeError):
    """Ironic answered 404 for what a provisioning request names (a node,
    an allocation)."""


class IronicRefused(IronicComputeError):
    """Ironic refused a provisioning request (400, 406, or 409 past the
    retries): asking again as it is would be refused again."""


class IronicConflict(IronicRefused):
    """Ironic answered 409 past the retries: for a node, it is locked by a
    task of its conductor (busy, not a refusal of what was asked); for an
    allocation, its name or uuid is taken."""


class IronicBusy(IronicUnavailable):
    """A change of a node was answered 409 (the node is locked) past the
    retries: nothing was done, and the work is tried again later, as it
    is (a soft action is not turned into a hard one for it)."""


class NotSent(IronicComputeError):
    """A request's ``before`` check stopped it, so it was not sent (the
    instance workers' Fenced and Stopped). The adapter lets it pass through
    as it is."""


# The instance workers (instances/).

class Stopped(NotSent):
    """The service is stopping while a worker waits or is about to send:
    the work is left as it is for the next attempt or the next owner."""


class Fenced(NotSent):
    """This service may not act for the instance now (another service
    manages it, the node serves another instance, or the lease is not
    valid), so the call was not sent. The message says why, in one line."""


class NodeFenced(Fenced):
    """Fenced because the node no longer serves the instance (in Ironic),
    though its row is still this worker's: reading the row again changes
    nothing, so the request is tried again only after the back-off (an
    operator may have to look)."""


class ProvisionError(IronicComputeError):
    """Ironic refused or failed an action on a node (a deploy, undeploy,
    power change or rebuild ended in a failed state, the node is gone, or
    the wait timed out); the message is Ironic's, one line."""


class BuildFailed(IronicComputeError):
    """A build cannot succeed (no node fits, the node is gone, or Ironic
    refused or failed it); the message is the instance's fault."""


class LeaseLost(IronicComputeError):
    """This service's lease is not valid now (cluster/lease.py), so no
    Ironic call that changes anything may be sent; the message says why,
    in one line."""


# Requests and the instance rows (db/instances.py, db/scheduling.py).

class InvalidRequest(IronicComputeError, ValueError):
    """A request spec that no node can satisfy: no resource class, a
    malformed resource class or trait, a negative size. Also a ValueError,
    as it was before this module existed."""


class NoValidHost(IronicComputeError):
    """The scheduler found no live service holding a free node that
    matches the request; the message says what did not match."""


class RequestRefused(IronicComputeError):
    """A request that cannot be recorded: an instance action asked in a
    state that does not allow it or while another task is in flight, or a
    build for a host that cannot take it (unknown, down, disabled, of
    another conductor group), or the schedulers' lock stayed busy. The
    message is one line."""


class NoInstance(RequestRefused):
    """An instance action was asked for a uuid no live instance has."""


class NodeTaken(IronicComputeError):
    """A build tried to record a node that another live instance is
    already recorded on (one live instance per node)."""


# The database (db/).

class LockBusy(IronicComputeError):
    """A lock row of ``locks`` (db/locks.py) was not free within its wait;
    the message is one line."""


class TransactionNotOpen(IronicComputeError):
    """``ctx.session`` was asked for outside a reader or writer transaction
    of db/api.py: a query run outside one."""


class SchemaError(IronicComputeError):
    """The database is at a schema this code cannot run on (too old, too
    new, or not expand-only where that is required); the message says which
    release or command it needs."""


class AdminError(IronicComputeError):
    """An operator's command (``ironic-compute-manage``) cannot be done;
    reported as one line."""


class AdminNotFound(AdminError):
    """What an operator's command names does not exist: a service, a
    compute node or an instance."""


class AdminRefused(AdminError):
    """An operator's command is refused: it would take work from a live
    service, a row changed meanwhile, what it would create exists already,
    or it would forget an instance this service built without ``--force``.
    The message says what to do instead."""


# Placement (placement/client.py translates its answers once).

class PlacementError(IronicComputeError):
    """Placement refused or could not answer a request. ``status`` is the
    HTTP status (None: no answer) and ``code`` Placement's error code
    (e.g. ``placement.concurrent_update``)."""

    def __init__(self, message, status=None, code=None):
        super().__init__(message)
        self.status = status
        self.code = code


class PlacementUnavailable(PlacementError):
    """Placement cannot be reached, answers 5xx, or refuses our credentials
    (401, 403): nothing else is worth trying this cycle; the rows are
    written as without Placement, and the next cycle tries again."""


class PlacementConfigError(PlacementUnavailable):
    """``[placement]`` cannot be used as configured (an invalid auth
    option); a subclass of PlacementUnavailable, so it stops a cycle's
    Placement pass the same way."""


class PlacementNotFound(PlacementError):
    """Placement answered 404: no such provider, consumer or allocation."""


class PlacementConflict(PlacementError):
    """Placement answered 409: a generation changed under us (``code``
    ``placement.concurrent_update``: read again and retry), a name or uuid
    exists (``placement.duplicate_name``), or something is in use."""

    @property
    def generation_changed(self):
        return self.code == 'placement.concurrent_update'


class PlacementRefused(PlacementError):
    """Placement answered another 4xx: the request is wrong for this
    Placement (an unknown standard trait, say); asking again as it is
    would be refused again."""


# Configuration, the ring and the peers.

class InvalidConfig(IronicComputeError):
    """A configuration value this service cannot run with; the message says
    which option and why, in one line."""


class PeerListError(IronicComputeError, ValueError):
    """``[ironic]peer_list`` is set but does not name this host. Also a
    ValueError, as it was before this module existed."""


class EmptyRingError(IronicComputeError, ValueError):
    """A hash ring was asked for an empty set of hosts. Also a ValueError,
    as it was before this module existed."""


# The commands (cmd/).

class CommandError(IronicComputeError):
    """A command cannot go on (e.g. no configuration file); reported as one
    line and a non-zero exit."""
