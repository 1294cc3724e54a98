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

"""Checks that span options, and reading every option once.

oslo.config validates a typed value only when it is read, so a bad value in
a file would otherwise surface deep inside the first cycle. ``validate``
reads everything up front and turns the first problem into one line.
"""

import re

from oslo_config import cfg

from ironic_compute import exception
from ironic_compute.cluster import hosts


def _read(conf, name, group=None):
    try:
        return getattr(conf[group] if group else conf, name)
    except (cfg.ConfigFileValueError, ValueError) as exc:
        # oslo.config's message embeds a LocationInfo repr; keep the file.
        text = str(exc)
        where = re.search(r"detail='([^']*)'", text)
        reason = text.rsplit('is not valid: ', 1)[-1].strip()
        section = group or 'DEFAULT'
        raise exception.InvalidConfig(
            f'invalid value for [{section}]{name}'
            + (f' in {where.group(1)}' if where else '')
            + f': {reason}') from exc


def read_all(conf):
    """Read every registered option once, raising InvalidConfig."""
    for name in list(conf):
        value = _read(conf, name)
        if isinstance(value, cfg.ConfigOpts.GroupAttr):
            for opt_name in list(value):
                _read(conf, opt_name, name)


def validate(conf):
    """Raise InvalidConfig with one readable line for the first problem."""
    read_all(conf)
    if conf.service_down_time <= conf.report_interval:
        raise exception.InvalidConfig(
            f'[DEFAULT]service_down_time ({conf.service_down_time}) must be '
            f'larger than [DEFAULT]report_interval ({conf.report_interval}): '
            'otherwise a live service would be seen as down between two '
            'heartbeats')


def validate_service(conf):
    """What the daemon needs on top of validate(): Ironic auth, peer_list."""
    validate(conf)
    if not conf.ironic.auth_type:
        raise exception.InvalidConfig(
            '[ironic]auth_type is not set: use "password" (Keystone) or "none" '
            '(a standalone Ironic, with [ironic]endpoint_override)')
    host = hosts.normalize(conf.host)
    peers = hosts.parse_list(conf.ironic.peer_list)
    if conf.ironic.partition_key and peers and host not in peers:
        raise exception.InvalidConfig(
            f'[ironic]peer_list {sorted(peers)} does not contain this host '
            f'{host!r}: every service of a partition lists itself')


# The last ": '...'" of the message (the prefix is greedy).
_PARSE_ERROR_LINE = re.compile(r"""^(.*): (['"]).*\2$""")


def redact(message):
    """A config error message without the raw line it quotes.

    oslo.config quotes the offending line of a file that does not parse,
    and that line may hold a password or a database URL.
    """
    text = ' '.join(str(message).split())
    if not text.startswith('Failed to parse'):
        return text
    return _PARSE_ERROR_LINE.sub(r'\1: <line not shown>', text)
