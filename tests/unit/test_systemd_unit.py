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

"""The shipped systemd unit says what the service relies on."""

import configparser
import os

UNIT = os.path.join(os.path.dirname(__file__), '..', '..', 'etc', 'systemd',
                    'ironic-compute.service')


def load():
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNIT)
    return parser


def test_notify_reload_restart():
    service = load()['Service']
    assert service['Type'] == 'notify'
    assert service['ExecReload'] == '/bin/kill -HUP $MAINPID'
    assert service['Restart'] == 'on-failure'
    assert service['KillSignal'] == 'SIGTERM'
    assert 'XDG_CACHE_HOME=' in service['Environment']


def test_hardened():
    service = load()['Service']
    for key in ('NoNewPrivileges', 'ProtectSystem', 'PrivateTmp', 'ProtectHome'):
        assert key in service, key
    assert service['User'] != 'root'


def test_watchdog_is_set_and_restarts():
    service = load()['Service']
    # The pings come every WatchdogSec / 3 from their own thread, not from
    # cycles: a short value is safe, a missing one leaves hangs undetected.
    seconds = int(service['WatchdogSec'])
    assert 10 <= seconds <= 600
    # A watchdog kill (SIGABRT) counts as a failure: the service restarts.
    assert service['Restart'] in ('on-failure', 'on-abnormal', 'on-watchdog',
                                  'always')
    assert service['NotifyAccess'] in ('main', 'all')
