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

"""Shared checks of the command-line tests."""

import dataclasses
import json

# The configuration every in-process manage command of the tests reads.
EXPONENT = 8
BASE_CONF = f"""[DEFAULT]
service_down_time = 60
[hash_ring]
partition_exponent = {EXPONENT}
"""

# [database]connection values no command can use, each with what its one
# error line must say (what is wrong, and what to write instead); the
# password must not show.
UNWORKABLE_URLS = [
    ('postgres://u:secretpw@127.0.0.1/db', ["unknown database type 'postgres'",
                                            'postgresql+psycopg2://']),
    ('mysql+mysqldb://u:secretpw@127.0.0.1/db', ["driver 'mysqldb', which is "
                                                 'not installed',
                                                 'mysql+pymysql://']),
    ('mysql://u:secretpw@127.0.0.1', ['names no database', '/DBNAME']),
    ('secretpw', ['is not a database URL', 'sqlite:///PATH']),
]


def assert_one_line_error(prog, code, stderr, *fragments, exit_code=1):
    """``prog`` failed with ``exit_code`` and one ``prog: error:`` line
    holding ``fragments``."""
    assert code == exit_code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f'{prog}: error: ')
    for fragment in fragments:
        assert fragment in lines[0]
    assert 'Traceback' not in stderr


@dataclasses.dataclass
class Result:
    """What an ironic-compute-manage run in this process gave."""

    code: int
    out: str
    err: str

    def json(self):
        assert self.code == 0, self.err
        return json.loads(self.out)

    def ok(self):
        assert self.code == 0, self.err
        return self

    def one_line_error(self, *fragments):
        assert_one_line_error('ironic-compute-manage', self.code, self.err, *fragments)
