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

"""The chaos soak's Placement rules on made-up samples: each can fail.

Pure (no Placement, no database): the soak trusts the checker to see a
disagreement, so each rule is shown to fire here, and the windows the
rules allow shown not to.
"""

from tests.functional import agreement
from tests.functional import placement_agreement
from tests.functional.test_agreement_checker import NOW
from tests.functional.test_agreement_checker import row

X, Y = 'instance-x', 'instance-y'
N, M = 'node-n', 'node-m'
STALE, WINDOW, GRACE = 14, 10, 8


def checker(providers=None):
    found = placement_agreement.PlacementAgreement('sqlite://', STALE, WINDOW, GRACE)
    found.arm({N: 1, M: 2} if providers is None else providers)
    return found


def sample(rows=(), nodes=(N, M), now=NOW):
    return agreement.Sample(now, list(rows), {n: {'uuid': n} for n in nodes}, [])


def view(providers=None, **allocations):
    return placement_agreement.View({N: 1, M: 2} if providers is None else providers,
                                    {c: frozenset(n) for c, n in allocations.items()})


def rules(found):
    return sorted(rule for rule, _ in found)


def test_agreement_is_quiet():
    c = checker()
    assert c.check(0, sample([row(X, N)]), view(**{X: [N]})) == []
    assert c.check(1, sample([row(X, N)]), view(**{X: [N]})) == []


def test_provider_remade_or_deleted_while_its_node_stayed():
    c = checker()
    assert rules(c.check(0, sample(), view({N: 3, M: 2}))) == ['provider_remade']
    assert rules(c.check(1, sample(), view({M: 2}))) == ['provider_remade']


def test_gone_node_provider_bounded_and_new_one_noted_when_back():
    c = checker()
    assert c.check(0, sample(nodes=[M]), view()) == []
    assert c.check(STALE, sample(nodes=[M]), view()) == []
    assert rules(c.check(STALE + 1, sample(nodes=[M]), view())) == ['provider_stale']
    assert c.check(STALE + 2, sample(nodes=[M]), view({M: 2})) == []
    # Back in Ironic: a new provider is fine, bounded, then noted.
    assert c.check(20, sample(), view({M: 2})) == []
    assert rules(c.check(20 + STALE + 1, sample(), view({M: 2}))) == ['provider_missing']
    assert c.check(40, sample(), view({N: 7, M: 2})) == []
    assert rules(c.check(41, sample(), view({N: 8, M: 2}))) == ['provider_remade']


def test_a_node_back_may_lose_its_old_provider_within_the_bound():
    c = checker()
    assert c.check(0, sample(nodes=[M]), view()) == []
    # Back before its owner deleted the old provider, which goes after.
    assert c.check(1, sample(), view()) == []
    assert c.check(2, sample(), view({M: 2})) == []
    assert c.check(3, sample(), view({N: 5, M: 2})) == []
    assert c.check(2 + STALE, sample(), view({N: 5, M: 2})) == []
    assert rules(c.check(3 + STALE, sample(), view({N: 6, M: 2}))) == ['provider_remade']


def test_claim_missing_only_when_the_next_read_still_wants_it():
    c = checker()
    assert c.check(0, sample([row(X, N)]), view()) == []
    assert rules(c.check(1, sample([row(X, N)]), view(**{X: [N]}))) == ['claim_missing']
    # Deleted meanwhile, or being deleted: the delete gave the claim back.
    for later in (row(X, N, task='deleting'), row(X, N, deleted_ago=0)):
        c = checker()
        assert c.check(0, sample([row(X, N)]), view()) == []
        assert c.check(1, sample([later]), view()) == []


def test_freeing_tasks_and_records_need_no_claim():
    c = checker()
    rows = [row(X, N, task='deleting'), row(Y, M, built=False)]
    assert c.check(0, sample(rows), view()) == []
    assert c.check(1, sample(rows), view()) == []
    # A failed build keeps its claim until after it wrote the failure.
    failed = [row(X, None, vm='error', task='releasing')]
    assert c.check(2, sample(failed), view(**{X: [N]})) == []


def test_claim_elsewhere_and_shared_provider():
    c = checker()
    found = c.check(0, sample([row(X, N), row(Y, M)]), view(**{X: [N, M], Y: [M]}))
    assert rules(found) == ['claim_elsewhere', 'shared_provider']


def test_leaked_claims():
    c = checker()
    assert rules(c.check(0, sample([row(X, None, vm='error')]), view(**{X: [N]}))) == [
        'claim_leaked']
    assert rules(c.check(0, sample([row(X, N, built=False)]), view(**{X: [N]}))) == [
        'claim_leaked']
    assert c.check(0, sample([row(X, N, deleted_ago=GRACE)]), view(**{X: [N]})) == []
    assert rules(c.check(0, sample([row(X, N, deleted_ago=GRACE + 1)]),
                         view(**{X: [N]}))) == ['claim_leaked']


def test_claim_before_its_row_within_the_create_window():
    c = checker()
    assert c.check(0, sample(), view(**{Y: [M]})) == []
    assert c.check(WINDOW, sample(), view(**{Y: [M]})) == []
    assert rules(c.check(WINDOW + 1, sample(), view(**{Y: [M]}))) == ['claim_leaked']
    # Recorded (or given back): the window starts again for a new claim.
    c = checker()
    assert c.check(0, sample(), view(**{Y: [M]})) == []
    assert c.check(5, sample([row(Y, M)]), view(**{Y: [M]})) == []
    assert c.check(6, sample(), view()) == []
    assert c.check(7 + WINDOW, sample(), view(**{Y: [M]})) == []


def test_nothing_checked_before_armed():
    c = placement_agreement.PlacementAgreement('sqlite://', STALE, WINDOW, GRACE)
    c.sample(0, sample())
    assert c.samples == 0 and c.violations() == {}
