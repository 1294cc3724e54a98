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

"""Whether a service is alive, and if not why: the one statement of it.

A service is judged by its ``services`` row, on the database's clock (the
row's ``last_seen_up`` against the database's ``now``). Two questions are
asked of it, and they differ on purpose:

- **May it take new work?** (:func:`down_reason`, :func:`is_up`): be a
  peer in the ring, get builds. Not when it is disabled, forced down,
  stopped, has never reported, or has been silent for longer than
  ``service_down_time``.
- **Is it alive: may it keep its work?** (:func:`dead_reason`,
  :func:`is_alive`): its instances and its nodes stay with it. Only
  dying loses them: forced down by an operator, no services row, never
  reported, or silent for longer than the limit. Being disabled or
  stopped does not make a service dead: a disabled service still
  heartbeats, holds a valid lease and carries out its instances' tasks;
  a stopped one may be a restart under way, and its heartbeats say when
  it really has gone. The takeover of a dead host's instances
  (:func:`takeover_due`) and ``node move`` ask this question.

Between the two, :func:`idle_reason` says why a service carries out no
work now (its queued tasks wait): forced down, stopped or silent, but not
disabled. :func:`half_silent` says whether the peers will soon judge a
service down: what a service checks of itself before it acts on a view.

Pure: no database, no clock of its own; ``now`` is given. A record is
anything with ``disabled``, ``forced_down``, ``stopped`` and
``last_seen_up`` (``nodes.ownership.ServiceRecord``); None means the
service has no live row of its binary. Naive datetimes are UTC.

The SQL twins of :func:`is_up` and :func:`is_alive` are in
``db/liveness.py``, beside this module's rules, and
``tests/unit/db/test_liveness.py`` checks that all forms agree on the same
rows, on the three databases.
"""

from datetime import UTC
from datetime import datetime
from typing import Protocol

NOT_REGISTERED = 'not a registered service'
DISABLED = 'disabled'
FORCED_DOWN = 'forced down'
STOPPED = 'stopped'
NEVER_REPORTED = 'never reported'
# The part of service_down_time after which a service's heartbeat is old
# enough that it must heartbeat again before it acts (half_silent).
HALF = 0.5


class ServiceState(Protocol):
    """What liveness reads of a service (a services row as a record)."""

    disabled: bool
    forced_down: bool
    stopped: bool
    last_seen_up: datetime | None


def _utc(dt: datetime) -> datetime:
    # Naive values come from the database in UTC; aware ones may be in any
    # zone.
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def age(since: datetime, now: datetime) -> float:
    """Seconds from ``since`` to ``now`` (naive values are UTC)."""
    return (_utc(now) - _utc(since)).total_seconds()


def _silence(record: ServiceState, now: datetime, limit: float) -> str | None:
    """Why the heartbeats say the service is gone, or None."""
    if record.last_seen_up is None:
        return NEVER_REPORTED
    elapsed = age(record.last_seen_up, now)
    # A heartbeat exactly ``limit`` seconds old still counts (the SQL twins
    # say ``last_seen_up >= now - limit``).
    if elapsed > limit:
        return f'no heartbeat for {elapsed:.0f} s'
    return None


def dead_reason(record: ServiceState | None, now: datetime,
                limit: float) -> str | None:
    """Why the service has lost its work, or None while it is alive.

    Returns 'not a registered service' (``record`` None), 'forced down',
    'never reported' or 'no heartbeat for N s' (silent for longer than
    ``limit`` seconds: ``service_down_time``, or more for a takeover).
    Disabled and stopped are not reasons: such a service keeps its work
    while it heartbeats. SQL twin: ``db.liveness.alive``.
    """
    if record is None:
        return NOT_REGISTERED
    if record.forced_down:
        return FORCED_DOWN
    return _silence(record, now, limit)


def is_alive(record: ServiceState | None, now: datetime,
             limit: float) -> bool:
    """Whether the service keeps its work (:func:`dead_reason` is None)."""
    return dead_reason(record, now, limit) is None


def idle_reason(record: ServiceState | None, now: datetime,
                service_down_time: float) -> str | None:
    """Why the service carries out no work now, or None when it does.

    Returns the reasons of :func:`down_reason` but 'disabled': a disabled
    service still carries out the tasks of its instances.
    """
    if record is None:
        return NOT_REGISTERED
    if record.forced_down:
        return FORCED_DOWN
    if record.stopped:
        return STOPPED
    return _silence(record, now, service_down_time)


def down_reason(record: ServiceState | None, now: datetime,
                service_down_time: float) -> str | None:
    """Why the service may take no new work (no peer, no build), or None
    when it may.

    Returns 'not a registered service', 'disabled', 'forced down',
    'stopped', 'never reported' or 'no heartbeat for N s', the first that
    applies. SQL twin: ``db.liveness.up``.
    """
    if record is not None and record.disabled:
        return DISABLED
    return idle_reason(record, now, service_down_time)


def is_up(record: ServiceState | None, now: datetime,
          service_down_time: float) -> bool:
    """Whether the service may take new work (:func:`down_reason` is
    None)."""
    return down_reason(record, now, service_down_time) is None


def takeover_due(record: ServiceState | None, now: datetime,
                 service_down_time: float, grace: float) -> bool:
    """Whether a host's instances go to the living: it is dead
    (:func:`dead_reason`) for a limit of ``service_down_time + grace``.

    Silence is measured from the last heartbeat on the database's clock (a
    service that stops cleanly heartbeats until it stops); the takeover
    itself checks it again in SQL (``db.liveness.host_alive``). Counting
    the grace from the moment the host is judged down leaves the host's
    own lease (service_down_time / 2, cluster/lease.py) ending well before
    anyone acts for it. ``grace`` 0 means never. A host forced down by an
    operator is fenced by that operator's word, and a host without a
    services row is gone: their instances move at once. A disabled host
    takes no new builds but keeps its instances while it heartbeats.
    """
    if grace <= 0:
        return False
    return not is_alive(record, now, service_down_time + grace)


def half_silent(record: ServiceState | None, now: datetime,
                service_down_time: float) -> bool:
    """Whether a service's own heartbeat, as its peers read it, is older
    than half of ``service_down_time``: it is still alive, but they may
    judge it down soon, so it must heartbeat and rejoin before it acts on
    a view again (nodes/gate.py).

    Not the lease (cluster/lease.py): the lease is the service's own
    count, on its own clock, of its right to change anything in Ironic;
    this is what its peers see on the database's clock. A service without
    a row (None) is not judged here; one that never reported is.
    """
    if record is None:
        return False
    if record.last_seen_up is None:
        return True
    return age(record.last_seen_up, now) > service_down_time * HALF
