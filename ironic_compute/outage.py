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

"""Since when a dependency (the database, Ironic) has been failing.

An outage is logged as one line per attempt that says what failed and
since when, never a traceback: the same error every few seconds is noise,
and its stack says nothing new.

It sits at the bottom of the package, beside text.py, because both the
tracker's inventory (nodes/) and the daemon keep one, and nodes/ must not
import daemon/.
"""

import datetime
import time

from ironic_compute.text import one_line


class Outage:
    """One dependency's failing streak; not thread-safe (one per thread)."""

    def __init__(self, what):
        self.what = what
        self.since = None  # wall clock (UTC) of the first failure, for people
        self._started = None  # time.monotonic() of the first failure

    @property
    def seconds(self):
        return 0.0 if self._started is None else time.monotonic() - self._started

    def failed(self, error):
        """Record a failure; return 'since HH:MM:SS UTC (N s): error'."""
        if self._started is None:
            self._started = time.monotonic()
            self.since = datetime.datetime.now(datetime.UTC)
        return (f'since {self.since:%H:%M:%S} UTC ({self.seconds:.0f} s): '
                f'{one_line(error, 300)}')

    def ended(self, log=None):
        """The dependency answered again; return how long it failed."""
        if self._started is None:
            return 0.0
        seconds = self.seconds
        if log is not None:
            log.warning('%s reachable again after %.0f s', self.what, seconds)
        self._started = self.since = None
        return seconds
