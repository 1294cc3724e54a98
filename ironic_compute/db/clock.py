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

"""The database server's clock: one time for every service.

Heartbeats are written with the server's time and judged against the
server's time read in the same query, so a host whose clock is off neither
looks dead nor makes its peers look dead. Values are naive UTC with
microseconds on the three backends, whatever the session time zone of
MariaDB or PostgreSQL.
"""

import sqlalchemy as sa
from sqlalchemy.ext import compiler
from sqlalchemy.sql import expression

from ironic_compute.db import models


class utc_now(expression.FunctionElement):  # noqa: N801 - reads like SQL
    """SQL: the database server's current time, naive UTC."""

    type = models.Timestamp
    name = 'utc_now'
    inherit_cache = True


@compiler.compiles(utc_now)
def _generic(element, compiler, **kw):
    return 'CURRENT_TIMESTAMP'


@compiler.compiles(utc_now, 'mysql')
@compiler.compiles(utc_now, 'mariadb')
def _mysql(element, compiler, **kw):
    # UTC_TIMESTAMP ignores the session time zone; (6): microseconds.
    return 'UTC_TIMESTAMP(6)'


@compiler.compiles(utc_now, 'postgresql')
def _postgresql(element, compiler, **kw):
    # timestamp without time zone, in UTC whatever the session's TimeZone.
    return "(statement_timestamp() AT TIME ZONE 'UTC')"


@compiler.compiles(utc_now, 'sqlite')
def _sqlite(element, compiler, **kw):
    # 'now' is UTC; %f gives milliseconds: pad to the six digits SQLAlchemy
    # writes, so that values compare as text and parse the same way.
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"


def now(ctx):
    """The database's current time (naive UTC), in the transaction of ctx."""
    return ctx.session.execute(sa.select(utc_now())).scalar_one()


class utc_ago(expression.FunctionElement):  # noqa: N801 - reads like SQL
    """SQL: the database server's current time less ``seconds``, naive UTC.

    ``last_seen_up >= utc_ago(service_down_time)`` says in SQL what
    liveness.is_up says of a heartbeat, on the same clock as utc_now
    (db/liveness.py builds on it).
    """

    type = models.Timestamp
    name = 'utc_ago'
    inherit_cache = True

    def __init__(self, seconds):
        # Whole microseconds, bound: the text does not change with them.
        super().__init__(sa.bindparam('utc_ago_us', round(seconds * 1e6),
                                      type_=sa.BigInteger, unique=True))


def _microseconds(element, compiler, **kw):
    return compiler.process(element.clauses, **kw)


@compiler.compiles(utc_ago)
def _ago_generic(element, compiler, **kw):
    return (f'(CURRENT_TIMESTAMP - {_microseconds(element, compiler, **kw)}'
            " * INTERVAL '1' MICROSECOND)")


@compiler.compiles(utc_ago, 'mysql')
@compiler.compiles(utc_ago, 'mariadb')
def _ago_mysql(element, compiler, **kw):
    return (f'TIMESTAMPADD(MICROSECOND, -{_microseconds(element, compiler, **kw)}'
            ', UTC_TIMESTAMP(6))')


@compiler.compiles(utc_ago, 'postgresql')
def _ago_postgresql(element, compiler, **kw):
    return ("((statement_timestamp() AT TIME ZONE 'UTC') - "
            f"{_microseconds(element, compiler, **kw)} * INTERVAL '1 microsecond')")


@compiler.compiles(utc_ago, 'sqlite')
def _ago_sqlite(element, compiler, **kw):
    # As utc_now, shifted by a modifier ('-3600.5 seconds').
    return ("(strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || "
            f"({_microseconds(element, compiler, **kw)} / 1000000.0)"
            " || ' seconds') || '000')")
