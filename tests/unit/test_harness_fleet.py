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

"""Fleet.restore: what each functional test starts from, on real processes."""

import sys

from ironic_compute.harness import fleet as harness_fleet

# A stand-in daemon: a real process that runs until it is stopped.
SLEEPER = [sys.executable, '-c', 'import time; time.sleep(120)']


def process_state(daemon):
    """The one-letter state of the process in /proc ('T': stopped)."""
    with open(f'/proc/{daemon.process.pid}/stat') as f:
        return f.read().rsplit(')', 1)[1].split()[0]


def started_fleet(tmp_path):
    """Four stand-ins on a SQLite database (``start`` runs a real db sync)."""
    fleet = harness_fleet.Fleet(tmp_path, f'sqlite:///{tmp_path}/fleet.db')
    for host in ('killed', 'frozen', 'changed', 'untouched'):
        daemon = fleet.add(host, {'DEFAULT': {'host': host, 'debug': False}})
        daemon.command = SLEEPER
    fleet.start()
    return fleet


def test_restore_restarts_unfreezes_and_resets_the_daemons(tmp_path):
    fleet = started_fleet(tmp_path)
    try:
        pids = {host: d.process.pid for host, d in fleet.daemons.items()}
        fleet.daemons['killed'].kill()
        fleet.daemons['frozen'].pause()
        fleet.daemons['changed'].options['DEFAULT']['debug'] = True
        fleet.daemons['changed'].write_config()
        harness_fleet.wait_until(lambda: process_state(fleet.daemons['frozen']) == 'T', 10,
                                 0.01, 'the SIGSTOP to take')

        assert fleet.restore() == ['killed', 'changed']

        assert all(d.alive for d in fleet.daemons.values())
        harness_fleet.wait_until(lambda: process_state(fleet.daemons['frozen']) != 'T', 10,
                                 0.01, 'the SIGCONT to take')
        assert not fleet.daemons['frozen'].paused
        now = {host: d.process.pid for host, d in fleet.daemons.items()}
        assert now['frozen'] == pids['frozen'] and now['untouched'] == pids['untouched']
        assert now['killed'] != pids['killed'] and now['changed'] != pids['changed']
        changed = fleet.daemons['changed']
        assert changed.options == {'DEFAULT': {'host': 'changed', 'debug': False}}
        with open(changed.config_path) as f:
            assert 'debug = False' in f.read()
        # Nothing left to do: a second call is a no-op.
        assert fleet.restore() == []
    finally:
        fleet.close()
