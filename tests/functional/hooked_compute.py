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

"""``ironic-compute`` with two test hooks, for the recovery tests.

Run as ``python -m tests.functional.hooked_compute --config-file F`` from
the repository's root. The product has no test hooks; this entry point
injects them before the daemon starts:

- ``IC_TEST_CLOCK_OFFSET`` (seconds): this process's clock is that far
  off (db.models.CLOCK_OFFSET), to show that liveness is judged on the
  database's clock only;
- ``IC_TEST_HANG_FILE`` (a path): while that file exists, each
  resource-tracker cycle hangs before it starts (inside the watchdog's
  turn), to show that the watchdog stops the pings.
"""

import datetime
import os
import sys

from ironic_compute.cmd import compute
from ironic_compute.db import models
from tests import hooks


def main():
    offset = os.environ.get('IC_TEST_CLOCK_OFFSET')
    if offset:
        models.CLOCK_OFFSET = datetime.timedelta(seconds=float(offset))
    hang_file = os.environ.get('IC_TEST_HANG_FILE')
    if hang_file:
        from ironic_compute.nodes import tracker as resource_tracker
        tracker = resource_tracker.ResourceTracker
        tracker.run_cycle = hooks.hang_while(hang_file, tracker.run_cycle)
    return compute.main()


if __name__ == '__main__':
    sys.exit(main())
