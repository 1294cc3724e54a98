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

"""How the service leaves: one deadline, and the peers told.

SIGTERM gives the running cycle, heartbeat and instance steps until one
deadline (graceful_shutdown_timeout less what is kept for the
mark_stopped write); whatever still runs then is left, and resumed by
whoever manages that work next. The process exits at the deadline even
with work still running.
"""

import logging as std_logging
import os
import threading
import time

from oslo_log import log as logging

from ironic_compute import text
from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services

LOG = logging.getLogger(__name__)

# Of graceful_shutdown_timeout, the part kept for the mark_stopped write
# (at most MARK_STOPPED_TIMEOUT s; that bound alone when there is no
# deadline): work still running before it is left.
MARK_STOPPED_SHARE = 0.25
MARK_STOPPED_TIMEOUT = 10


def deadlines(total, graceful):
    """Return (work deadline, stop deadline, seconds kept for mark_stopped).

    ``total`` is graceful_shutdown_timeout. Deadlines are time.monotonic()
    values, None for no bound: a total of 0 means "wait for ever", as in
    oslo.service. Not graceful: the work deadline is now.
    """
    now = time.monotonic()
    if not graceful:
        return now, None, MARK_STOPPED_TIMEOUT
    if not total:
        return None, None, MARK_STOPPED_TIMEOUT
    keep = min(MARK_STOPPED_TIMEOUT, total * MARK_STOPPED_SHARE)
    return now + total - keep, now + total, keep


def remaining(deadline):
    """Return the seconds left until ``deadline`` (time.monotonic(); None:
    no bound, returned as None)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0)


def mark_stopped(service_id, host, timeout):
    """Tell the peers this service left, giving up after ``timeout`` s: a
    database that accepts and never answers must not keep the process
    alive. Failures are logged; raises nothing."""
    def write():
        try:
            db_services.mark_stopped(db_api.Context(), service_id)
        except db_api.OUTAGE_ERRORS as exc:
            LOG.error('Could not mark the service stopped, the database '
                      'is unreachable (%s); peers take its nodes after '
                      'service_down_time', text.one_line(exc, 300))
        except Exception:
            LOG.exception('Could not mark the service stopped; peers '
                          'take its nodes after service_down_time')
        else:
            LOG.info('Service %s stopped; its peers take its nodes at '
                     'their next cycle', host)

    writer = threading.Thread(target=write, name='mark-stopped',
                              daemon=True)
    writer.start()
    writer.join(timeout)
    if writer.is_alive():
        LOG.error('Could not mark the service stopped within %.1f s (the '
                  'database does not answer); peers take its nodes after '
                  'service_down_time', timeout)


def leave_by(deadline, finished):
    """Exit at ``deadline`` at the latest, even with work still running.

    At exit Python waits for every non-daemon thread (the launcher's, which
    may still wait for a first cycle) and for every worker of a thread pool
    (daemon or not): one stuck on a request would hold the process past
    graceful_shutdown_timeout. ``finished``: stop() saw every loop and
    worker end. What is left is resumed by whoever manages the work next.
    Returns when nothing is left; otherwise ends the process (os._exit).
    """
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join(remaining(deadline))
    left = sorted(t.name for t in threading.enumerate()
                  if t is not me and not t.daemon and t.is_alive())
    if finished and not left:
        return
    LOG.warning('Leaving with work still running (%s); it is resumed by '
                'whoever manages it next',
                ', '.join(left) or 'instance workers')
    std_logging.shutdown()  # flush the log: os._exit() will not
    os._exit(0)
