"""Host names: normalised in one place (case and blanks do not matter)."""

import pytest

from ironic_compute.cluster import hosts


def test_case_and_blanks_do_not_make_another_host():
    assert hosts.normalize(' Compute-1 ') == 'compute-1'
    assert hosts.normalize_all(['A', 'a ', 'b']) == frozenset({'a', 'b'})


@pytest.mark.parametrize('bad, error', [
    ('compute-1', TypeError),  # one string, not a list of names
    (['a', ''], ValueError),
    (['a', ' '], ValueError),
    (['a', 3], TypeError),
])
def test_a_host_list_refuses_what_is_not_a_list_of_names(bad, error):
    with pytest.raises(error):
        hosts.normalize_all(bad)


def test_a_peer_list_from_an_option_value_or_a_list():
    assert hosts.parse_list('Compute-1, compute-2,,') == frozenset(
        {'compute-1', 'compute-2'})
    assert hosts.parse_list([' X ', '']) == frozenset({'x'})
    assert hosts.parse_list(None) == frozenset()
