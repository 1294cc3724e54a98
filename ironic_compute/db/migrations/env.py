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

"""alembic environment: runs on the connection given by migration.py."""

from alembic import context

from ironic_compute.db import models

config = context.config
connection = config.attributes['connection']
context.configure(connection=connection, target_metadata=models.metadata,
                  render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
