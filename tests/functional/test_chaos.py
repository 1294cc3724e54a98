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

"""Chaos soak: seeded random faults against five real daemons.

Five ironic-compute processes share the real standalone Ironic: three
manage conductor group "group-a", two "group-b". Each reaches the database
and Ironic through TCP proxies of its own, so a cut can hit one daemon or
all of them. For ``IC_CHAOS_MINUTES`` (default 3) the soak injects random
faults, one after the other, drawn from a deck so that every kind comes up
before any repeats: kill -9 and restart, SIGTERM and restart, SIGSTOP then
SIGCONT past service_down_time, SIGHUP with a good and with a broken
configuration, a database cut and an Ironic cut (3-15 s, one daemon or
all), a node moved to the other conductor group, a node deleted and
created again with the same uuid, instance records added and removed
(``ironic-compute-manage instance add/remove``: records only, they pin
nodes), instances built and deleted (``instance create/delete``, on the
few nodes made buildable), instance actions (stop, start, reboot,
rebuild), and an instance takeover (a host with a built instance frozen
or killed past ``instance_takeover_grace``, an action asked for the
instance meanwhile: a peer takes it over and carries the action out; a
frozen host resumes with stale workers that must not act). The
power-state sync runs every SYNC_POWER_STATE_INTERVAL seconds. The seed
is printed; ``IC_CHAOS_SEED`` replays the same choices.

A sampler reads the database every 0.3 s and keeps what is wrong: two
live rows for one node, a row deleted while its node exists in Ironic, a
row held by no known service, an instance node that left its host; and
at every sample it reads Ironic too and keeps every disagreement between
the database and Ironic (tests/functional/agreement.py: an active instance
not deployed on its node, a node serving a deleted, failed or moved
instance, two allocations for one), then Placement's tables
(tests/functional/placement_agreement.py: every node keeps the provider it
had, no provider outlives its node beyond a bound, a claim exactly for each
live instance built by create, no provider claimed twice, no leaked claim).
After the last fault the database and Ironic must agree exactly (the strict
"quiet" check). No daemon may exit
unless the soak stopped it. After every fault, every node
must be owned by a live service of its group (an instance's node by the
instance's host) within service_down_time + 2 cycles + 2 s of the end of
the fault (SIGTERM: 2 cycles + 2 s). The table printed at the end gives,
per fault, how many ran, the median and worst time to converge, the time
to settle (every node where the rules put it, not bounded) and the
violations seen while it was the latest fault.

The machinery (the settings, the sampler, the Soak fleet and its
convergence) is in chaos.py; the faults, one function each, in
chaos_faults.py.
"""

import bisect
import collections
import random
import statistics
import time

import pytest

from tests.functional import agreement
from tests.functional import chaos_faults
from tests.functional import chaos_placement
from tests.functional import daemons
from tests.functional.chaos import CYCLE
from tests.functional.chaos import HOSTS
from tests.functional.chaos import KINDS
from tests.functional.chaos import MINUTES
from tests.functional.chaos import Soak
from tests.functional.chaos import seed
from tests.functional.placement_env import placement_server  # noqa: F401


def run(soak, minutes):
    """Run faults one after the other for ``minutes``, drawn from a shuffled deck of
    every kind so that each comes up before any repeats."""
    end = time.monotonic() + minutes * 60
    deck = []
    while time.monotonic() < end:
        if not deck:
            first = not soak.timeline
            deck = list(KINDS)
            soak.rng.shuffle(deck)
            if first:  # the longest fault, in every soak however short
                deck.remove('instance takeover')
                deck.append('instance takeover')
        chaos_faults.FAULTS[deck.pop()](soak)
        soak.sleep(soak.rng.uniform(0, CYCLE))
    soak.fault = 'after the last fault'


def quiet_check(soak):
    """The last word on Ironic: once settled, it agrees exactly with the database."""
    found = agreement.quiet(soak.agreement.fresh(soak.sampler.engine),
                            free_states=('available', 'enroll'))
    if found:
        soak.fail(f'the database and Ironic disagree after the last fault: {found[:5]}')


def settle_times(soak):
    """Per measure with a target: seconds until every node sat where the
    rules put it, before the next fault began (None: not by then)."""
    starts = [start for start, _ in soak.timeline] + [float('inf')]
    for measure in soak.measures:
        if measure.target is None:
            continue
        until = next(s for s in starts if s > measure.since)
        found = soak.sampler.first(
            lambda owners, _u, _h, t=measure.target: all(
                owners.get(u) == h for u, h in t.items()), measure.since)
        if found is not None and found[0] <= until:
            measure.settled = found[0] - measure.since


def final_settle(soak):
    """The last word: the cluster settles where the rules put every node."""
    target = soak.target()
    try:
        daemons.wait_until(lambda: all(soak.sampler.fresh_snapshot().get(u) == h
                                       for u, h in target.items()),
                           60, message='every node where the rules put it')
    except AssertionError:
        snap = soak.sampler.snapshot()
        wrong = {u: (snap.get(u), h) for u, h in target.items() if snap.get(u) != h}
        soak.fail(f'not settled 60 s after the last fault: (holder, expected) {wrong}')


def results_table(soak):
    """Per measurement label: how many, converged (median, worst), bound,
    how many over it, violations, settled (median, worst).

    A violating sample counts for the fault that was the latest when it
    was read, on the row of that fault's first measurement.
    """
    first_label = {}
    for measure in soak.measures:
        first_label.setdefault(measure.fault, measure.label)
    violations = collections.Counter()
    starts = [start for start, _ in soak.timeline]
    for read_at, _check in soak.sampler.violation_times():
        fault = bisect.bisect_right(starts, read_at) - 1
        violations[first_label.get(fault, 'start-up' if fault < 0
                                   else soak.timeline[fault][1])] += 1
    by_label = collections.defaultdict(list)
    for measure in soak.measures:
        by_label[measure.label].append(measure)

    def stats(values):
        if not values:
            return '- | -'
        return f'{statistics.median(values):.1f} s | {max(values):.1f} s'
    lines = ['| fault | count | converged: median | worst | bound | over bound '
             '| violations | settled: median | worst |',
             '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
    for label in sorted(by_label.keys() | violations.keys()):
        group = by_label.get(label, [])
        seconds = [m.seconds for m in group if m.seconds is not None]
        settled = [m.settled for m in group if m.settled is not None]
        over = sum(1 for m in group if not m.ok)
        bound = f'{group[0].bound} s' if group else '-'
        lines.append(f'| {label} | {len(group)} | {stats(seconds)} | {bound} | {over} '
                     f'| {violations[label]} | {stats(settled)} |')
    return '\n'.join(lines)


@pytest.fixture(params=['mysql', 'postgresql'])
def soak(request, ironic_server, placement_server, tmp_path_factory):  # noqa: F811
    seed_value = seed()
    workdir = str(tmp_path_factory.mktemp(f'chaos-{request.param}'))
    soak = Soak(request.param, workdir, ironic_server, random.Random(seed_value), seed_value,
                placement_server)
    try:
        soak.start()
        yield soak
    finally:
        soak.close()
        if not soak.passed:
            for name, daemon in soak.daemons.items():
                print(f'---- {name} log (last 3000 chars) ----\n{daemon.log()[-3000:]}')


def test_chaos_soak(soak, capsys):
    with capsys.disabled():
        print(f'\nchaos soak on {soak.backend}: seed {soak.seed} (IC_CHAOS_SEED='
              f'{soak.seed} replays it), {MINUTES:g} minutes, {len(HOSTS)} daemons, '
              f'{len(soak.group_of)} nodes', flush=True)
    daemons.wait_until(lambda: soak.converged()(*soak.sampler.liveness[-1][1:])
                       if soak.sampler.liveness else False, 60,
                       message='every node owned at start-up')
    first_providers = chaos_placement.start(soak)
    run(soak, MINUTES)
    final_settle(soak)
    quiet_check(soak)
    chaos_placement.check(soak, first_providers)
    soak.check_daemons()
    settle_times(soak)
    found = soak.sampler.violations()
    if found:
        soak.fail(f'the sampler saw: {found}')
    table = results_table(soak)
    with capsys.disabled():
        print(f'\nchaos soak on {soak.backend}, seed {soak.seed}, {len(soak.timeline)} '
              f'faults in {MINUTES:g} minutes:\n{table}\nagreement with Ironic: '
              f'{soak.agreement.samples} samples ({soak.agreement.ironic_errors} without an '
              f'answer from Ironic), violations per rule {soak.agreement.counts()}\n'
              f'agreement with Placement: {soak.placement_agreement.samples} samples '
              f'({soak.placement_agreement.errors} without an answer), violations per '
              f'rule {soak.placement_agreement.counts()}', flush=True)
    soak.passed = not soak.failures
    assert soak.passed, (
        f'chaos soak on {soak.backend} (IC_CHAOS_SEED={soak.seed} replays it): '
        f'{len(soak.failures)} failures:\n' + '\n'.join(soak.failures[:10])
        + f'\n{table}')
