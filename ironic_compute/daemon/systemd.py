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

"""sd_notify: READY=1 once, WATCHDOG=1 while cycles succeed.

oslo.service's notify_once() removes NOTIFY_SOCKET after the first message,
so the watchdog needs its own sender.
"""

import os
import socket

from oslo_log import log as logging

LOG = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        self.address = environ.get('NOTIFY_SOCKET') or None
        usec = environ.get('WATCHDOG_USEC', '')
        pid = environ.get('WATCHDOG_PID', '')
        # The watchdog applies to us unless systemd named another process.
        self.watchdog_usec = (int(usec) if usec.isdigit() and
                              (not pid or pid == str(os.getpid())) else 0)

    @property
    def watchdog_enabled(self):
        return self.address is not None and self.watchdog_usec > 0

    def notify(self, message):
        if self.address is None:
            return False
        address = self.address
        if address.startswith('@'):  # abstract namespace socket
            address = '\0' + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Never block a cycle on a reader that does not keep up.
                sock.setblocking(False)
                sock.connect(address)
                sock.send(message.encode())
        except BlockingIOError:
            LOG.debug('systemd notify socket is full; %s dropped', message)
            return False
        except OSError as exc:
            LOG.warning('Could not notify systemd (%s): %s', message, exc)
            return False
        return True

    def ready(self):
        return self.notify('READY=1')

    def watchdog(self):
        return self.watchdog_enabled and self.notify('WATCHDOG=1')

    def stopping(self):
        return self.notify('STOPPING=1')
