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

"""A connection whose rollback fails when it goes back to the pool (the
database went away while it was checked out) is one warning line, not an
ERROR with a traceback (CI: test_recovery's database outage on MariaDB)."""

import logging

import pytest
import sqlalchemy as sa

from ironic_compute.db import api as db_api  # noqa: F401  (installs the filter)


class _CutConnection:
    """A DBAPI connection whose server is gone: its rollback fails."""

    def rollback(self):
        raise OSError("(2013, 'Lost connection to MySQL server during query')")

    def close(self):
        pass


@pytest.mark.parametrize('pool_class', [sa.pool.QueuePool, sa.pool.NullPool])
def test_a_connection_that_cannot_be_reset_is_one_warning_line(caplog,
                                                               pool_class):
    pool = pool_class(_CutConnection, reset_on_return='rollback')
    with caplog.at_level(logging.DEBUG, logger='sqlalchemy.pool'):
        pool.connect().close()

    lines = [r for r in caplog.records if r.name.startswith('sqlalchemy.pool')
             and r.levelno >= logging.WARNING]
    assert len(lines) == 1
    (line,) = lines
    assert line.levelname == 'WARNING'
    assert line.exc_info is None and not line.exc_text
    assert line.getMessage() == (
        'A database connection could not be reset on its return to the pool '
        "and is dropped: (2013, 'Lost connection to MySQL server during "
        "query')")
    assert 'Traceback' not in caplog.text


def test_other_pool_lines_are_left_as_they_are(caplog):
    logger = logging.getLogger('sqlalchemy.pool.impl.QueuePool')
    with caplog.at_level(logging.DEBUG, logger='sqlalchemy.pool'):
        logger.error('Pool overflow')
    (line,) = caplog.records
    assert (line.levelname, line.getMessage()) == ('ERROR', 'Pool overflow')
