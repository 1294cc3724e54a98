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

"""The SQL twins of cluster/liveness.py: its rules asked in the database.

A query that must not read every services row into Python (the
scheduler's live hosts), or that must check a service again in the very
statement that acts (a takeover, ``node move``), asks these clauses. Each
says in SQL what its twin says in Python, on the database's clock:

- :func:`up` is ``liveness.is_up``: may the row's service take new work.
- :func:`alive` is ``liveness.is_alive``: does it keep its work.
- :func:`host_alive` is ``alive`` asked of one host (EXISTS).

``TWINS`` pairs them for tests/unit/db/test_liveness.py, which checks on
the three databases that each pair agrees on the same rows: change both
sides of a pair together, or that test fails.

A row that is soft-deleted, or of another binary, is no row at all: the
Python side sees it as ``None`` (``liveness.NOT_REGISTERED``), because
``db.services.load_services`` reads only the live rows of our binary.
"""

import datetime

import sqlalchemy as sa

from ironic_compute.cluster import liveness
from ironic_compute.db import clock
from ironic_compute.db import models
from ironic_compute.db import services as db_services

_services = models.services


def _cutoff(limit, now):
    """SQL: the oldest heartbeat that still counts, ``limit`` seconds
    before ``now`` (None: the database's clock at the statement)."""
    if now is None:
        return clock.utc_ago(limit)
    # A fixed time to judge at (the agreement test's): the arithmetic in
    # Python, exact to the microsecond on every backend.
    return sa.literal(now - datetime.timedelta(seconds=limit),
                      models.Timestamp)


def _registered():
    return sa.and_(_services.c.binary == db_services.BINARY,
                   _services.c.deleted == 0)


def heard_within(limit, now=None):
    """SQL: the row's last heartbeat is at most ``limit`` seconds old.

    A row that never reported (NULL) does not match: liveness's 'never
    reported'. Exactly ``limit`` seconds old still matches, as in Python.
    """
    return _services.c.last_seen_up >= _cutoff(limit, now)


def up(service_down_time, now=None):
    """SQL twin of ``liveness.is_up``: a WHERE clause on ``services`` that
    matches the rows whose service may take new work (not disabled, not
    forced down, not stopped, heard within ``service_down_time``)."""
    return sa.and_(_registered(),
                   _services.c.disabled == sa.false(),
                   _services.c.forced_down == sa.false(),
                   _services.c.stopped_at.is_(None),
                   heard_within(service_down_time, now))


def alive(limit, now=None):
    """SQL twin of ``liveness.is_alive``: a WHERE clause on ``services``
    that matches the rows whose service keeps its work (not forced down,
    heard within ``limit`` seconds; disabled or stopped do not matter)."""
    return sa.and_(_registered(),
                   _services.c.forced_down == sa.false(),
                   heard_within(limit, now))


def host_alive(host, limit, now=None):
    """SQL: EXISTS a row of ``host`` that is :func:`alive`.

    ``host`` is a name, or a column of the outer statement (correlated:
    e.g. ``instances.host``, each instance's own host). Its negation is
    ``liveness.dead_reason(...) is not None``: no row, forced down, never
    reported, or silent for longer than ``limit``.
    """
    return (sa.select(sa.literal(1))
            .where(_services.c.host == host, alive(limit, now))
            .exists())


# Each Python rule of cluster/liveness.py and its SQL twin here.
TWINS = {liveness.is_up: up, liveness.is_alive: alive}
