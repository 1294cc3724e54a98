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

"""Fencing end to end: a service that only looks dead never acts on what it lost.

Three daemons share an Ironic of this module's own whose fake deploys and
tear downs take ``2 * DEPLOY_DELAY`` seconds (the session's Ironic deploys
at once), and reach the database through TCP proxies of their own. A
victim is made to look dead while it has work in flight (builds being
deployed, an instance being torn down): frozen by SIGSTOP, or cut from the
database only, for longer than ``instance_takeover_grace``. A peer takes
its instances over and finishes them, new builds go on, then the victim
resumes with its workers where they stopped.

A sampler (``agreement.AgreementSampler``) reads the database and Ironic
every SAMPLE_PERIOD all along and keeps every sample in which they
disagree (tests/functional/agreement.py says what that means), besides
the instance sampler's own checks. After the victim is back and the run
has settled, the strict "quiet" check must find the database and Ironic
in exact agreement. Each test prints what happened.
"""

import time

import pytest
from sqlalchemy.engine import make_url

from tests.functional import agreement
from tests.functional import daemons
from tests.functional import ironic_env
from tests.functional import test_instances

HOSTS = test_instances.HOSTS
# The daemons' settings are test_instances' (InstanceCluster._options).
REPORT_INTERVAL = test_instances.REPORT_INTERVAL
SERVICE_DOWN_TIME = test_instances.SERVICE_DOWN_TIME
# A frozen host's instances move service_down_time + grace after its last
# heartbeat (10 s), while its deploys, started a second or two before the
# freeze, still run (16 s): the peer that takes a build over waits on the
# deploy the frozen host started.
TAKEOVER_GRACE = test_instances.TAKEOVER_GRACE
CYCLE = test_instances.CYCLE
DEPLOY_DELAY = 8  # [fake]deploy_delay: a deploy and a tear down take twice this
# Short enough that every deadline the victim's workers had is past when
# it resumes (the cut lasts longer, see Run.run), long enough for a deploy
# and a tear down (2 * DEPLOY_DELAY) on a loaded machine.
DEPLOY_TIMEOUT = 30
NODES = 9
SAMPLE_PERIOD = 0.3
# Every delete here goes through ``instance delete``, which soft-deletes a
# row only once Ironic is clean: no reaper teardown after a deletion is
# expected. The allowance only absorbs the gap between the services' clock
# (deleted_at) and the database's (the same machine).
TEARDOWN_GRACE = CYCLE
# Waits, not bounds.
IN_FLIGHT_WAIT = 2 * DEPLOY_DELAY
TAKEOVER_WAIT = SERVICE_DOWN_TIME + TAKEOVER_GRACE + 2 * CYCLE + 4 * DEPLOY_DELAY + 40
SETTLE = 90
# What a fenced worker logs (the reasons of instances/fencing.py): the call
# was not sent.
FENCE_LINES = (': it is managed by ', ': it was taken over since ',
               'cannot be re-checked', 'Instance work paused')


class FencingCluster(test_instances.InstanceCluster):
    """test_instances' cluster on a slow Ironic, each daemon behind a DB proxy."""

    def __init__(self, backend, workdir, ironic):
        self.ironic_url = ironic.url
        self.agreement = agreement.Agreement(ironic.client(timeout=5), lambda: self.nodes,
                                             TEARDOWN_GRACE)
        daemons.BackendFleet.__init__(
            self, backend, workdir, ironic,
            lambda url: agreement.AgreementSampler(url, self.agreement, SAMPLE_PERIOD),
            {'service_down_time': SERVICE_DOWN_TIME, 'report_interval': REPORT_INTERVAL})
        self.nodes = ironic_env.create_nodes(self.client, NODES,
                                             name_prefix=f'fence-{backend}')
        ironic_env.make_buildable(self.client, self.nodes)
        url = make_url(self.database.url)
        self.proxies = {}  # the database proxies (the parent's close() closes them)
        for host in HOSTS:
            proxy = self.proxies[host] = daemons.TcpProxy(url.host, url.port)
            proxy.start()
            db_url = url.set(port=proxy.port).render_as_string(hide_password=False)
            self.add(host, self._options(host, self.ironic_url, db_url))

    def _options(self, host, ironic_url, db_url):
        options = super()._options(host, ironic_url, db_url)
        # This module's own Ironic has the nodes in the default group.
        del options['ironic']['partition_key']
        options['ironic']['deploy_timeout'] = DEPLOY_TIMEOUT
        return options

    def start(self):
        daemons.BackendFleet.start(self)
        daemons.wait_until(lambda: len(self.free_nodes()) == NODES, test_instances.SETTLE,
                           message=f'rows for the {NODES} nodes, all free')
        self.wait_stable()

    def ironic_nodes(self):
        listed = ironic_env.list_nodes(self.client, detail=True)
        return {n['uuid']: n for n in listed if n['uuid'] in self.nodes}

    def ironic_states(self):
        """{instance uuid: (provision_state, target)} of the nodes Ironic has them on."""
        return {node['instance_uuid']: (node['provision_state'],
                                        node['target_provision_state'])
                for node in self.agreement.fresh(self.engine).nodes.values()
                if node['instance_uuid']}

    def ready(self):
        """Every daemon running and no instance: what each test starts from."""
        super().ready()
        self.delete_everything()

    def delete_everything(self):
        """Delete every live instance and wait until they are gone."""
        live = list(self.instances())
        for uuid in live:
            done = self.delete(uuid)
            assert done.returncode == 0, done.stderr
        daemons.wait_until(lambda: not set(self.instances()) & set(live), SETTLE, 0.5,
                           f'{len(live)} instances deleted')
        daemons.wait_until(lambda: len(self.free_nodes()) == NODES, SETTLE, 0.5,
                           f'the {NODES} nodes recorded free')


@pytest.fixture(scope='module')
def slow_ironic(tmp_path_factory):
    with ironic_env.private_server(tmp_path_factory,
                                   {'fake': {'deploy_delay': DEPLOY_DELAY}}) as env:
        yield env


started_cluster = daemons.started_on_each_backend(FencingCluster, 'slow_ironic')


class Run:
    """One fault against a victim with work in flight, and what happened."""

    def __init__(self, cluster, label):
        self.cluster = cluster
        self.label = label
        self.events = []  # (seconds since the fault, what)
        self.fault_at = None

    def note(self, what):
        since = time.monotonic() - self.fault_at if self.fault_at else 0.0
        self.events.append((since, what))
        print(f'  {self.label} +{since:5.1f} s: {what}', flush=True)

    def victim(self):
        """The host that holds the most free nodes (at least two)."""
        holders = list(self.cluster.free_nodes().values())
        victim = max(HOSTS, key=holders.count)
        assert holders.count(victim) >= 2, holders
        return victim

    def work_in_flight(self, victim):
        """An instance of ``victim`` being torn down, and builds being deployed;
        returns (the one being deleted, the builds)."""
        cluster = self.cluster
        done, old = cluster.create(f'{self.label}-old', '--host', victim, '--wait',
                                   '--timeout', str(test_instances.BUILD_WAIT))
        assert done.returncode == 0 and old['vm_state'] == 'active', (done.stderr, old)
        free = [n for n, h in cluster.free_nodes().items() if h == victim]
        builds = cluster.create_many([(f'{self.label}-inflight-{i}', ('--host', victim))
                                      for i in range(max(1, len(free)))])
        assert cluster.delete(old['uuid']).returncode == 0
        inflight = [b['uuid'] for b in builds]

        def busy():
            cluster.check_daemons()
            states = cluster.ironic_states()
            return (all(states.get(u, (None, None))[1] == 'active' for u in inflight)
                    and states.get(old['uuid']) == ('deleting', 'available'))

        daemons.wait_until(busy, IN_FLIGHT_WAIT, 0.2,
                           f'{victim} deploying {len(inflight)} and tearing one down')
        return old['uuid'], inflight

    def taken_over(self, victim, old, inflight):
        cluster = self.cluster
        live = cluster.instances()
        return (old not in live and not [i for i in live.values() if i.host == victim]
                and all(live[u].vm_state == 'active' and live[u].task_state is None
                        for u in inflight))

    def run(self, victim, cut, heal):
        cluster = self.cluster
        old, inflight = self.work_in_flight(victim)
        samples_before = cluster.agreement.samples
        errors_before = cluster.agreement.ironic_errors
        cut()
        self.fault_at = time.monotonic()
        self.note(f'{victim} cut while deploying {len(inflight)} and tearing down 1')
        daemons.wait_until(lambda: not [i for i in cluster.instances().values()
                                        if i.host == victim],
                           TAKEOVER_WAIT, 0.3, f'the takeover of {victim}')
        states = cluster.ironic_states()
        self.note('its instances taken over by '
                  + ', '.join(sorted({i.host for i in cluster.instances().values()}))
                  + '; Ironic then: ' + ', '.join(
                      f'{u[:8]} {"/".join(filter(None, states.get(u, ("no node",))))}'
                      for u in [old, *inflight]))
        daemons.wait_until(lambda: self.taken_over(victim, old, inflight), TAKEOVER_WAIT,
                           0.3, 'the peers to finish its work')
        self.note('its builds active on the peers, its delete done')
        free = len(cluster.free_nodes())
        more = cluster.create_many([(f'{self.label}-more-{i}', ())
                                    for i in range(min(2, free))])
        built = cluster.wait_done([r['uuid'] for r in more])
        self.note(f'{len(more)} new builds while it is out: '
                  f'{sorted(i.vm_state for i in built.values())}')
        # The victim's workers resume past every deadline they had: the
        # issue's case (a stale owner that fails its build after the
        # deadline and would tear the node down).
        past = self.fault_at + DEPLOY_TIMEOUT + 2 - time.monotonic()
        if past > 0:
            time.sleep(past)
        cycles = cluster.daemons[victim].count_in_log('Cycle: ')
        log_before = len(cluster.daemons[victim].log())
        heal()
        self.note(f'{victim} back')
        daemons.wait_until(lambda: cluster.daemons[victim].count_in_log('Cycle: ') > cycles,
                           SETTLE, message=f'a cycle of {victim} after it came back')
        self.note(f'a cycle of {victim}')
        # Its stale workers act now, if they act at all: watch them a while.
        time.sleep(3 * CYCLE + 2 * DEPLOY_DELAY)
        cluster.check_daemons()
        after = cluster.daemons[victim].log()[log_before:]
        fenced = sum(after.count(line) for line in FENCE_LINES)
        self.note(f'{fenced} calls of its stale workers fenced (not sent)')
        assert 'Traceback' not in after, after[-3000:]
        quiet = self.settle()
        self.note('settled')
        samples = cluster.agreement.samples - samples_before
        self.report(victim, samples, quiet)
        # The agreement was really read all along: a sample per period at
        # least every few seconds, and Ironic answered nearly all of them.
        assert samples >= (time.monotonic() - self.fault_at) / 5, samples
        errors = cluster.agreement.ironic_errors - errors_before
        assert errors <= max(3, samples // 10), (errors, samples)
        return quiet

    def settle(self):
        """The strict check, once nothing is in flight: [(rule, detail)]."""
        cluster = self.cluster

        def settled():
            live = cluster.instances().values()
            return all(i.task_state is None and i.vm_state in ('active', 'error')
                       for i in live)

        daemons.wait_until(settled, SETTLE, 0.5, 'every instance settled')
        # The reaper or a late teardown may still move: the quiet check must
        # hold on two samples a cycle apart.
        found = []
        for _ in range(2):
            time.sleep(CYCLE)
            found = agreement.quiet(cluster.agreement.fresh(cluster.engine))
            if not found:
                break
        return found

    def report(self, victim, samples, quiet):
        cluster = self.cluster
        counts = cluster.agreement.counts()
        live = cluster.instances().values()
        print(f'\n{self.label} on {cluster.backend}, victim {victim}:')
        print('| time | event |\n| ---: | --- |')
        for since, what in self.events:
            print(f'| +{since:.1f} s | {what} |')
        print(f'agreement samples: {samples} (Ironic unreadable: '
              f'{cluster.agreement.ironic_errors}); violations per rule: {counts}; '
              f'instance sampler: {cluster.sampler.violations() or "none"}; '
              f'quiet check: {quiet or "exact agreement"}; live instances: '
              f'{sorted((i.host, i.vm_state) for i in live)}', flush=True)


class TestFencing:
    def test_sigstop_past_the_grace(self, cluster):
        run = Run(cluster, 'SIGSTOP')
        victim = run.victim()
        daemon = cluster.daemons[victim]
        quiet = run.run(victim, daemon.pause, daemon.resume)
        assert daemon.alive
        assert not cluster.sampler.violations(), cluster.sampler.violations()
        assert not quiet, quiet

    def test_database_cut_past_the_grace(self, cluster):
        run = Run(cluster, 'DB cut')
        victim = run.victim()
        proxy = cluster.proxies[victim]
        quiet = run.run(victim, proxy.down, proxy.up)
        assert cluster.daemons[victim].alive
        assert not cluster.sampler.violations(), cluster.sampler.violations()
        assert not quiet, quiet
