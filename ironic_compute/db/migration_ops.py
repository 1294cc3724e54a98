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

"""Schema operations the migrations share.

SQLite cannot ALTER a table in place: alembic's batch mode copies it, and
does so once for all the columns given together.
"""

from alembic import op


def add_columns(table, *columns):
    """Add ``columns`` (sa.Column) to ``table`` in one batch."""
    with op.batch_alter_table(table) as batch:
        for column in columns:
            batch.add_column(column)
