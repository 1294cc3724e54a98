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

"""Host names: the one place they are normalised.

Services, peer lists, instance records and the ring compare host names
without regard to case or surrounding blanks; every comparison goes
through :func:`normalize`, so "Compute-1 " and "compute-1" are one host.
"""


def normalize(host: str) -> str:
    return host.strip().lower()


def normalize_all(hosts) -> frozenset:
    """The normalised names of ``hosts``; empty names and non-strings refused."""
    if isinstance(hosts, (str, bytes)):
        raise TypeError('hosts must be an iterable of host names, not a '
                        'single string')
    out = set()
    for host in hosts:
        if not isinstance(host, str):
            raise TypeError(f'host name must be str, not {type(host).__name__}')
        name = normalize(host)
        if not name:
            raise ValueError('empty host name in hash ring host list')
        out.add(name)
    return frozenset(out)


def parse_list(value) -> frozenset:
    """A peer list (a list, or a raw comma-separated option value), blanks
    dropped."""
    if isinstance(value, str):
        value = value.split(',')
    return frozenset(normalize(h) for h in value or ()) - {''}
