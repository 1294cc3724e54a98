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
