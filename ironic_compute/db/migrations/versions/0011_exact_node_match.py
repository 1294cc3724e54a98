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

"""The scheduler matches resource classes and traits exactly on MariaDB.

MariaDB and MySQL compare strings in the column's collation, by default
one that ignores case (utf8mb4_general_ci): a request for resource class
``BAREMETAL`` found the nodes of ``baremetal`` in SQL, where the Python
matching (``instances.match_nodes``) and PostgreSQL tell them apart.
``compute_nodes.resource_class`` and ``compute_nodes.traits`` get the
binary collation of their character set here (``utf8mb4_bin``; a table
made in utf8mb3 keeps its character set: ``utf8mb3_bin``). The index over
(host, resource class, available, deleted) is rebuilt with it and still
serves the equality on the resource class. PostgreSQL and SQLite compare
bytes already: nothing changes there.
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
# The same columns, only compared exactly: a service of the previous
# release runs on this schema (it then matches exactly too).
expand_only = True

_COLUMNS = {'resource_class': 'VARCHAR(255)', 'traits': 'TEXT'}


def _charsets(bind):
    """{column: its character set} of the columns to change."""
    rows = bind.execute(sa.text(
        'SELECT column_name, character_set_name'
        ' FROM information_schema.columns WHERE table_schema = DATABASE()'
        " AND table_name = 'compute_nodes'"
        ' AND column_name IN (' + ', '.join(f"'{c}'" for c in _COLUMNS)
        + ')'))
    return {name.lower(): charset for name, charset in rows}


def upgrade():
    bind = op.get_bind()
    if bind.dialect.name not in ('mysql', 'mariadb'):
        return
    charsets = _charsets(bind)
    # One ALTER: the table and its index are rebuilt once.
    op.execute('ALTER TABLE compute_nodes ' + ', '.join(
        f'MODIFY {column} {type_} CHARACTER SET {charsets[column]}'
        f' COLLATE {charsets[column]}_bin NULL'
        for column, type_ in _COLUMNS.items()))
