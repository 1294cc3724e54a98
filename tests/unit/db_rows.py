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

"""What the unit tests read back from the database."""

import sqlalchemy as sa

from ironic_compute.db import models


def live_nodes(engine, column='host'):
    """``{uuid: value of column}`` of the live compute_nodes rows (by default:
    who holds each node)."""
    table = models.compute_nodes
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(table.c.uuid, table.c[column])
                                 .where(table.c.deleted == 0)).all())
