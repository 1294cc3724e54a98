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

"""The config drive options of ``instance create`` and ``instance
rebuild``: the files read and checked (instances/configdrive.py) before
anything is recorded. Every refusal is one line (CommandError) that names
the option and the file, and never quotes user data.
"""

import dataclasses
import json

from ironic_compute import exception
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.instances import configdrive


def _key_text(keys):
    """SSH keys in a table cell: each key's type and comment (or the start
    of its body)."""
    shown = []
    for key in keys:
        fields = key.split(None, 2)
        shown.append(f'{fields[0]} {fields[2] if len(fields) > 2 else fields[1][:16] + "..."}')
    return ', '.join(shown) or '-'


# The config drive in instance show: user data only as its size and
# digest (the row's public view, InstanceRow.as_dict).
SHOW_COLUMNS = output.columns(
    ('hostname', 'Hostname'), ('ssh_keys', 'SSH keys', _key_text),
    ('user_data', 'User data', lambda value: '-' if not value else
     f'{value["size"]} bytes, sha256 {value["sha256"]}'),
    ('meta', 'Meta', lambda value: ', '.join(
        f'{key}={text}' for key, text in sorted(value.items())) or '-'),
    ('network_data', 'Network data', lambda value: '-' if not value else
     json.dumps(value, sort_keys=True)))

_ssh_key = args(
    '--ssh-key', action='append', default=[], metavar='FILE',
    dest='ssh_keys',
    help='an SSH public key file (.pub; one key a line) whose keys go to '
         "the config drive's public_keys (repeatable)")
_user_data = args(
    '--user-data', metavar='FILE',
    help='user data for cloud-init (text, up to 64 MiB with the rest of '
         'the config drive); a secret: shown only as its size and digest')


def create_options(func):
    """--ssh-key, --user-data, --meta, --network-data and --hostname (the
    config drive of instance create). Returns ``func``, decorated."""
    for option in reversed((
            _ssh_key, _user_data,
            args('--meta', action='append', default=[], metavar='KEY=VALUE',
                 help="metadata for the config drive's meta_data meta "
                      '(repeatable)'),
            args('--network-data', metavar='FILE',
                 help='network_data.json for cloud-init: a JSON object'),
            args('--hostname', metavar='NAME',
                 help="the instance's host name (RFC 1123)"))):
        func = option(func)
    return func


def rebuild_options(func):
    """--user-data and --ssh-key of instance rebuild. Returns ``func``,
    decorated."""
    return _user_data(_ssh_key(func))


def _read(path, option):
    """The bytes of ``path``, given as ``option``; CommandError when it
    cannot be read or is larger than a config drive may be."""
    try:
        with open(path, 'rb') as source:
            raw = source.read(configdrive.MAX_BYTES + 1)
    except OSError as exc:
        raise exception.CommandError(
            f'cannot read {option} {path}: '
            f'{exc.strerror or type(exc).__name__}') from None
    if len(raw) > configdrive.MAX_BYTES:
        raise exception.CommandError(
            f'{option} {path} is larger than Ironic takes a config drive '
            f'({configdrive.MAX_TEXT})')
    return raw


def _text(path, option):
    try:
        return _read(path, option).decode('utf-8')
    except UnicodeDecodeError:
        raise exception.CommandError(
            f'{option} {path} is not UTF-8 text') from None


def ssh_keys(paths):
    """The public keys of the --ssh-key files ``paths``, in order."""
    keys = []
    for path in paths:
        try:
            keys += configdrive.public_keys(_text(path, '--ssh-key'),
                                            f'--ssh-key {path}')
        except exception.InvalidRequest as exc:
            raise exception.CommandError(str(exc)) from None
    return keys


def user_data(path):
    """The text of the --user-data file ``path`` ('' for an empty file)."""
    try:
        return configdrive.user_data(_read(path, '--user-data'),
                                     f'--user-data {path}') or ''
    except exception.InvalidRequest as exc:
        raise exception.CommandError(str(exc)) from None


def config_drive(ssh_key_files=(), user_data_file=None, meta=(),
                 network_data_file=None, hostname=None):
    """The configdrive.ConfigDrive of instance create's options;
    CommandError (one line) for a file that cannot be read or is not what
    its option takes, a bad --meta or --hostname."""
    try:
        network = None
        if network_data_file is not None:
            network = configdrive.network_data(
                _text(network_data_file, '--network-data'),
                f'--network-data {network_data_file}')
        return configdrive.ConfigDrive(
            ssh_keys=tuple(ssh_keys(ssh_key_files)),
            user_data=(user_data(user_data_file) or None
                       if user_data_file is not None else None),
            meta=tuple(sorted(configdrive.parse_meta(meta).items())),
            network_data=network,
            hostname=(configdrive.check_hostname(hostname.strip())
                      if hostname and hostname.strip() else None))
    except exception.InvalidRequest as exc:
        raise exception.CommandError(str(exc)) from None


def check_size(drive, uuid, name):
    """CommandError when ``drive`` is larger than Ironic takes."""
    try:
        drive.check_size(uuid, name)
    except exception.InvalidRequest as exc:
        raise exception.CommandError(str(exc)) from None


def rebuild_request(row, user_data_file=None, ssh_key_files=()):
    """The task_args of a rebuild of ``row`` (None: no such instance,
    which the request itself refuses) with the --user-data and --ssh-key
    files given (configdrive.rebuild_request); CommandError when one is
    bad or the config drive would be larger than Ironic takes."""
    replacing = configdrive.rebuild_request(
        user_data(user_data_file) if user_data_file is not None else None,
        ssh_keys(ssh_key_files) if ssh_key_files else None)
    if row is not None and replacing:
        check_size(dataclasses.replace(
            row, **configdrive.rebuild_columns(replacing)).config_drive(),
            row.uuid, row.name)
    return replacing
