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

"""An instance's config drive: what cloud-init on the node reads at boot.

What the tenant gives (SSH public keys, user data, metadata KEY=VALUE
pairs, network data, a hostname) is checked here, kept on the instance's
row, and sent to Ironic with the deploy (and again with every rebuild) in
the structured form Ironic's API takes since 1.56: Ironic builds the
config drive image itself (``meta_data``, ``user_data``,
``network_data``). Pure: no I/O.

User data is a secret of the tenant's: nothing here puts it in an error,
and the public view of it is its size and SHA-256 digest (summary()).
"""

import base64
import binascii
import dataclasses
import hashlib
import json
import re
import struct

from ironic_compute import exception

# Ironic's limit on a config drive: 64 MiB. Its API refuses a provision
# request whose body is larger (HTTP 413, [api]max_json_body_size_provision,
# 65536 KiB by default), and its documentation gives the drive "a maximum
# size of 64MB" (the config-2 partition the agent writes). The limit is
# checked on the body a rebuild sends, as ironicclient writes it (JSON,
# non-ASCII escaped): what Ironic's API receives.
MAX_BYTES = 64 * 1024 * 1024
MAX_TEXT = '64 MiB'

# Public key types OpenSSH writes in a .pub file.
KEY_TYPES = ('ssh-rsa', 'ssh-dss', 'ssh-ed25519', 'ecdsa-sha2-nistp256',
             'ecdsa-sha2-nistp384', 'ecdsa-sha2-nistp521',
             'sk-ssh-ed25519@openssh.com',
             'sk-ecdsa-sha2-nistp256@openssh.com')
# Nova's limits on an instance's metadata: 255 characters a key or value.
META_MAX = 255
# RFC 1123: labels of letters, digits and "-", not at either end.
_LABEL = re.compile(r'(?!-)[A-Za-z0-9-]{1,63}(?<!-)')
HOSTNAME_MAX = 253


def _first_string(blob):
    """The first length-prefixed string of an SSH key blob, or None."""
    if len(blob) < 4:
        return None
    size = struct.unpack('>I', blob[:4])[0]
    return blob[4:4 + size] if len(blob) >= 4 + size else None


def public_keys(text, source):
    """The SSH public keys in ``text`` (a .pub or authorized_keys file,
    read from ``source``): one per line, blank lines and # comments
    skipped. Raises exception.InvalidRequest, naming ``source``, when one
    line is not ``TYPE BASE64 [COMMENT]`` of a known type whose body
    decodes and names that type, or there is none."""
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        if 'PRIVATE KEY' in line:
            raise exception.InvalidRequest(
                f'{source} holds a private key: give the public one (.pub)')
        fields = line.split(None, 2)
        kind = fields[0]
        try:
            blob = base64.b64decode(fields[1], validate=True)
        except (IndexError, binascii.Error, ValueError):
            blob = b''
        if kind not in KEY_TYPES or _first_string(blob) != kind.encode():
            raise exception.InvalidRequest(
                f'{source} line {number} is not an SSH public key (TYPE '
                f'BASE64 [COMMENT], TYPE one of {", ".join(KEY_TYPES[:3])}, '
                'ecdsa-sha2-*, sk-*)')
        keys.append(' '.join(fields))
    if not keys:
        raise exception.InvalidRequest(f'{source} holds no SSH public key')
    return keys


def user_data(raw, source):
    """The user data in ``raw`` (bytes read from ``source``) as text, or
    None when it is empty. Ironic's API carries it as a JSON string:
    InvalidRequest when it is not UTF-8 text (the error never quotes it)."""
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError:
        raise exception.InvalidRequest(
            f'{source} is not UTF-8 text (Ironic takes user data as '
            'text)') from None
    return text or None


def network_data(text, source):
    """The network data in ``text`` (network_data.json, as cloud-init reads
    it): a JSON object. InvalidRequest, naming ``source``, otherwise."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise exception.InvalidRequest(
            f'{source} is not valid JSON: {exc}') from None
    if not isinstance(value, dict):
        raise exception.InvalidRequest(
            f'{source} is not a JSON object (network_data.json is one)')
    return value


def parse_meta(items):
    """{key: value} of the KEY=VALUE pairs ``items``; InvalidRequest for
    one without "=", an empty key, a key or value longer than META_MAX,
    or a key given twice with two values."""
    found = {}
    for item in items:
        key, sep, value = item.partition('=')
        key = key.strip()
        if not sep or not key:
            raise exception.InvalidRequest(
                f'invalid --meta {item[:60]!r}: use KEY=VALUE')
        if len(key) > META_MAX or len(value) > META_MAX:
            raise exception.InvalidRequest(
                f'invalid --meta {item[:60]!r}: up to {META_MAX} characters '
                'a key or value')
        if found.setdefault(key, value) != value:
            raise exception.InvalidRequest(
                f'--meta {key} given twice: {found[key]!r} and {value!r}')
    return found


def check_hostname(name):
    """``name`` if it is a valid RFC 1123 host name (labels of letters,
    digits and "-", not at either end, up to 63 characters each and 253 in
    all); InvalidRequest otherwise."""
    if (len(name) > HOSTNAME_MAX
            or not all(_LABEL.fullmatch(label) for label in name.split('.'))):
        raise exception.InvalidRequest(
            f'invalid hostname {name[:60]!r}: labels of letters, digits and '
            f'"-" (not first or last), up to 63 characters each and '
            f'{HOSTNAME_MAX} in all, joined by "."')
    return name


@dataclasses.dataclass(frozen=True)
class ConfigDrive:
    """What an instance's config drive holds beyond its uuid and name."""

    ssh_keys: tuple = ()
    user_data: str | None = dataclasses.field(default=None, repr=False)
    meta: tuple = ()  # sorted (key, value) pairs
    network_data: dict | None = dataclasses.field(default=None, hash=False)
    hostname: str | None = None

    def empty(self):
        """True when there is nothing to send: the deploy sends no config
        drive at all, as before there was one."""
        return not (self.ssh_keys or self.user_data or self.meta
                    or self.network_data or self.hostname)

    def contents(self, uuid, name):
        """The ``configdrive`` of Ironic's provision request (API 1.56),
        for instance ``uuid`` named ``name``; None when empty(). The
        meta_data keys are those of OpenStack's metadata, as nova's
        driver writes them: ``public_keys`` by name (``key-N``), the
        metadata pairs under ``meta``."""
        if self.empty():
            return None
        meta_data = {'uuid': uuid, 'name': name or uuid}
        if self.hostname:
            meta_data['hostname'] = self.hostname
        if self.ssh_keys:
            meta_data['public_keys'] = {
                f'key-{index}': key
                for index, key in enumerate(self.ssh_keys, 1)}
        if self.meta:
            meta_data['meta'] = dict(self.meta)
        drive = {'meta_data': meta_data}
        if self.user_data:
            drive['user_data'] = self.user_data
        if self.network_data:
            drive['network_data'] = self.network_data
        return drive

    def check_size(self, uuid, name):
        """Raise InvalidRequest when the drive, as sent, is larger than
        Ironic's limit (MAX_BYTES); returns its size in bytes."""
        drive = self.contents(uuid, name)
        size = len(json.dumps({'target': 'rebuild', 'configdrive': drive})
                   .encode()) if drive else 0
        if size > MAX_BYTES:
            raise exception.InvalidRequest(
                f'the config drive is {size} bytes, more than Ironic takes '
                f'({MAX_TEXT}: its API refuses a larger provision request)')
        return size

    def columns(self):
        """The instance row's columns that keep it (migration 0014)."""
        return {'ssh_keys': json.dumps(list(self.ssh_keys))
                if self.ssh_keys else None,
                'user_data': self.user_data,
                'meta': json.dumps(dict(self.meta), sort_keys=True)
                if self.meta else None,
                'network_data': json.dumps(self.network_data, sort_keys=True)
                if self.network_data else None,
                'hostname': self.hostname}

    @classmethod
    def from_columns(cls, ssh_keys, user_data, meta, network_data, hostname):
        """The drive the row's columns keep (columns())."""
        return cls(ssh_keys=tuple(json.loads(ssh_keys)) if ssh_keys else (),
                   user_data=user_data,
                   meta=tuple(sorted(json.loads(meta).items()))
                   if meta else (),
                   network_data=json.loads(network_data)
                   if network_data else None,
                   hostname=hostname)


# What a rebuild request may replace: keys of its task_args, which carry
# the new values from the request to the call (a kill or a takeover
# between them loses nothing); absent, the row's are sent again.
REBUILD_USER_DATA = 'user_data'
REBUILD_SSH_KEYS = 'ssh_keys'


def rebuild_request(user_data=None, ssh_keys=None):
    """The task_args of a rebuild that replaces ``user_data`` (text; ''
    drops it) and ``ssh_keys`` (a list) where given (None: kept)."""
    args = {}
    if user_data is not None:
        args[REBUILD_USER_DATA] = user_data
    if ssh_keys is not None:
        args[REBUILD_SSH_KEYS] = list(ssh_keys)
    return args


def rebuild_columns(args):
    """The row's columns a rebuild with task_args ``args`` replaces: its
    values recorded on the row when the rebuild is sent."""
    columns = {}
    if REBUILD_USER_DATA in args:
        columns['user_data'] = args[REBUILD_USER_DATA] or None
    if REBUILD_SSH_KEYS in args:
        columns['ssh_keys'] = ConfigDrive(
            ssh_keys=tuple(args[REBUILD_SSH_KEYS])).columns()['ssh_keys']
    return columns


def summary(text):
    """The public view of user data: {'size': bytes, 'sha256': hex}, or
    None when there is none."""
    if not text:
        return None
    raw = text.encode('utf-8')
    return {'size': len(raw), 'sha256': hashlib.sha256(raw).hexdigest()}
