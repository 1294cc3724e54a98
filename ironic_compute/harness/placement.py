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

"""A real, standalone OpenStack Placement on this machine.

PyPI's ``openstack-placement`` in its own virtualenv (default
``<repo>/.placement/venv``, with gunicorn and the MariaDB and PostgreSQL
drivers beside it: Placement's pins are not the project's), served by
gunicorn (``placement.wsgi.api:application``, two sync workers,
``--no-control-socket`` so that two servers on one machine do not collide)
on a port picked at start, in ``noauth2`` mode: the token ``admin`` is an
admin, and a policy file lets an admin use the reshaper too. Its
configuration (``placement.conf``, which the application reads from
``$OS_PLACEMENT_CONFIG_DIR``) and its log are in a state directory;
its database is the caller's (an empty MariaDB or PostgreSQL one), set up
by ``placement-manage db sync``.

For the functional tests and the benchmarks; it needs only the standard
library (the process helpers are ``harness.ironic``'s).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ironic_compute.harness import ironic as standalone

DEFAULT_VENV = standalone.REPO_ROOT / '.placement' / 'venv'
DEFAULT_PIP_SPEC = 'openstack-placement'
# Beside Placement: the WSGI server and the database drivers it lacks.
EXTRA_PACKAGES = ('gunicorn', 'PyMySQL', 'psycopg2-binary')
TOKEN = 'admin'
HOST = standalone.API_HOST
RESHAPER_RULE = 'role:admin or role:service'
ENV_VARS = {'venv': 'PLACEMENT_VENV', 'pip_spec': 'PLACEMENT_PIP_SPEC',
            'python': 'PLACEMENT_PYTHON'}


class PlacementError(RuntimeError):
    """Installing, starting or stopping the standalone Placement failed."""


def _print(msg):
    print(f'[placement] {msg}', flush=True)


class PlacementServer:
    """One standalone Placement on ``database_url`` (see the module)."""

    def __init__(self, state_dir, database_url, venv=None, pip_spec=None,
                 python=None, workers=2, log: Callable[[str], None] | None = _print):
        env = os.environ
        self.state_dir = Path(state_dir).absolute()
        self.database_url = database_url
        self.venv = Path(venv or env.get(ENV_VARS['venv']) or DEFAULT_VENV).absolute()
        self.pip_spec = pip_spec or env.get(ENV_VARS['pip_spec']) or DEFAULT_PIP_SPEC
        self.python = python or env.get(ENV_VARS['python']) or sys.executable
        self.workers = workers
        self.bin_dir = self.venv / 'bin'
        self.log_path = self.state_dir / 'placement.log'
        self.port = None
        self._popen = None
        self._log = log or (lambda msg: None)

    @property
    def url(self):
        return f'http://{HOST}:{self.port}'

    @property
    def pid(self):
        return self._popen.pid if self._popen is not None else None

    def config(self):
        """The [placement] options of an ironic-compute reaching it."""
        return {'auth_type': 'admin_token', 'endpoint': self.url, 'token': TOKEN}

    # -- install

    def is_installed(self):
        return all(os.access(self.bin_dir / exe, os.X_OK)
                   for exe in ('placement-manage', 'gunicorn'))

    def install(self):
        """pip install Placement and its companions into the venv, unless
        there; safe to call concurrently. False when it was there."""
        with standalone.venv_lock(self.venv):
            if self.is_installed():
                return False
            started = time.monotonic()
            standalone.pip_install(self.venv, [self.pip_spec, *EXTRA_PACKAGES],
                                   self._log, self.python,
                                   ' (about 30 s and 150 MB the first time)')
            if not self.is_installed():
                raise PlacementError(f'pip finished but {self.bin_dir} has no '
                                     'placement-manage or gunicorn')
            self._log(f'installed Placement in {time.monotonic() - started:.1f} s')
            return True

    # -- start, stop

    def _env(self):
        env = dict(os.environ, OS_PLACEMENT_CONFIG_DIR=str(self.state_dir))
        for var in ('PYTHONPATH', 'VIRTUAL_ENV'):
            env.pop(var, None)
        return env

    def write_config(self):
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The admin token has the admin role only, and the reshaper's
        # default policy wants the service role (placement audit --fix
        # claims through it): allowed to admin here, as doc/operations.md
        # tells a standalone Placement's operator.
        policy = self.state_dir / 'policy.yaml'
        policy.write_text(f"'placement:reshaper:reshape': '{RESHAPER_RULE}'\n")
        (self.state_dir / 'placement.conf').write_text(
            '# Generated by ironic_compute/harness/placement.py\n'
            + standalone.render_config({
                'DEFAULT': {'debug': False, 'use_stderr': True},
                'api': {'auth_strategy': 'noauth2'},
                'placement_database': {'connection': self.database_url},
                'oslo_policy': {'policy_file': str(policy)},
            }))

    def start(self, timeout=120.0):
        """Install when needed, set the database up, serve; wait until it
        answers. Returns self."""
        self.install()
        started = time.monotonic()
        self.write_config()
        sync = [str(self.bin_dir / 'placement-manage'), '--config-file',
                str(self.state_dir / 'placement.conf'), 'db', 'sync']
        with open(self.log_path, 'a') as out:
            rc = subprocess.run(
                sync, stdout=out, stderr=subprocess.STDOUT,
                env=self._env(), timeout=300).returncode
        if rc:
            raise PlacementError(f'placement-manage db sync failed ({rc}):\n'
                                 + standalone.tail_file(self.log_path))
        self.port = standalone.free_port(HOST)
        self._popen = standalone.spawn(
            [str(self.bin_dir / 'gunicorn'), '--no-control-socket',
             '--workers', str(self.workers), '--bind', f'{HOST}:{self.port}',
             'placement.wsgi.api:application'],
            self.log_path, env=self._env(), cwd=str(self.state_dir),
            die_with_parent=True)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError):
                if self.get('/resource_providers') is not None:
                    break
            if self._popen.poll() is not None:
                raise PlacementError(f'gunicorn exited ({self._popen.returncode}):\n'
                                     + standalone.tail_file(self.log_path))
            if time.monotonic() > deadline:
                self.stop()
                raise PlacementError(f'Placement did not answer in {timeout:.0f} s:\n'
                                     + standalone.tail_file(self.log_path))
            time.sleep(0.2)
        self._log(f'Placement ready at {self.url} in {time.monotonic() - started:.1f} s '
                  f'(log {self.log_path})')
        return self

    def stop(self):
        if self._popen is not None and self._popen.poll() is None:
            standalone.terminate(self._popen.pid)
            with contextlib.suppress(Exception):
                self._popen.wait(5)

    # -- requests, for the tests' eyes

    def request(self, method, path, body=None, version='1.38'):
        """(status, decoded body) of one request, as an admin."""
        request = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={'X-Auth-Token': TOKEN, 'Accept': 'application/json',
                     'Content-Type': 'application/json',
                     'OpenStack-API-Version': f'placement {version}'})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
                text = answer.read()
                return answer.status, json.loads(text) if text else None
        except urllib.error.HTTPError as exc:
            text = exc.read()
            return exc.code, json.loads(text) if text else None

    def get(self, path):
        status, body = self.request('GET', path)
        if status != 200:
            raise PlacementError(f'GET {path}: {status} {body}')
        return body

    def providers(self, member_of=None):
        """{uuid: generation}."""
        path = '/resource_providers'
        if member_of:
            path += f'?member_of=in:{",".join(member_of)}'
        return {p['uuid']: p['generation']
                for p in self.get(path)['resource_providers']}

    def provider(self, uuid):
        """{'inventories', 'traits', 'aggregates'} of a provider (None: none)."""
        found = {}
        for what in ('inventories', 'traits', 'aggregates'):
            status, body = self.request('GET', f'/resource_providers/{uuid}/{what}')
            if status == 404:  # none, or deleted between two reads
                return None
            if status != 200:
                raise PlacementError(f'GET {uuid}/{what}: {status} {body}')
            found[what] = body[what] if what == 'inventories' else set(body[what])
        return found

    def delete_providers(self, uuids):
        """Delete the providers ``uuids`` and, first, every allocation held
        on them (a consumer's allocations go whole): what a test leaves
        must not stay in an aggregate a later test counts. PlacementError
        when Placement refuses a delete; a provider already gone is fine."""
        for uuid in uuids:
            status, body = self.request('GET', f'/resource_providers/{uuid}/allocations')
            if status == 404:
                continue
            if status != 200:
                raise PlacementError(f'GET {uuid}/allocations: {status} {body}')
            for consumer in body['allocations']:
                status, body = self.request('DELETE', f'/allocations/{consumer}')
                if status not in (204, 404):
                    raise PlacementError(f'DELETE /allocations/{consumer}: {status} {body}')
            status, body = self.request('DELETE', f'/resource_providers/{uuid}')
            if status not in (204, 404):
                raise PlacementError(f'DELETE provider {uuid}: {status} {body}')
