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

"""A MariaDB Galera cluster of its own on loopback, for tests and tools.

No pytest here. :class:`GaleraCluster` starts ``size`` ``mariadbd``
processes, each with its own data directory, configuration file, socket,
pid file and ports (picked free at run time, so nothing collides with a
system MariaDB on 3306), joined into one cluster by Galera 4
(``galera-4``: ``libgalera_smm.so``) with rsync state transfers. The
first node bootstraps the cluster (``--wsrep-new-cluster``); the others
join it and receive its state. ``stop()`` ends every process it started
(SIGTERM, then SIGKILL) and leaves the directory to its caller.

Root logs in over TCP without a password (``mariadb-install-db
--auth-root-authentication-method=normal``), as on the CI's own server.
:meth:`GaleraCluster.url` names a database on one node;
:meth:`GaleraCluster.sync_wait_url` the same with ``wsrep_sync_wait = 1``
in every session, so each read first waits until that node has applied
every write the cluster committed before it: a causal read.
"""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse

import sqlalchemy as sa

MARIADBD = os.environ.get('IC_TEST_MARIADBD', '/usr/sbin/mariadbd')
INSTALL_DB = os.environ.get('IC_TEST_MARIADB_INSTALL_DB', '/usr/bin/mariadb-install-db')
PROVIDER = os.environ.get('IC_TEST_GALERA_PROVIDER', '/usr/lib/galera/libgalera_smm.so')


class Unavailable(Exception):
    """What a Galera cluster needs is not installed; the message says what."""


def missing():
    """What is missing to run a cluster here, as one line, or None."""
    needed = {'mariadbd': MARIADBD, 'mariadb-install-db': INSTALL_DB,
              'the Galera library (galera-4)': PROVIDER}
    absent = [f'{what} ({path})' for what, path in needed.items()
              if not os.path.exists(path)]
    absent += [f'{tool} (on PATH)' for tool in ('rsync', 'wsrep_sst_rsync')
               if shutil.which(tool) is None]
    if not absent:
        return None
    return ('missing ' + ', '.join(absent)
            + '; tools/test-setup.sh installs galera-4 and rsync')


def free_ports(count):
    """``count`` distinct TCP ports free on loopback now."""
    sockets = [socket.create_server(('127.0.0.1', 0)) for _ in range(count)]
    try:
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Node:
    """One mariadbd of the cluster: its ports, files and process."""

    def __init__(self, index, root, ports):
        self.index = index
        self.name = f'galera-{index}'
        self.dir = os.path.join(root, self.name)
        self.datadir = os.path.join(self.dir, 'data')
        self.port, self.gcomm_port, self.ist_port, self.sst_port = ports
        self.config = os.path.join(self.dir, 'my.cnf')
        self.log_path = os.path.join(self.dir, 'error.log')
        self.process = None

    @property
    def socket(self):
        return os.path.join(self.dir, 'mysqld.sock')

    def write_config(self, cluster_address, user):
        options = {
            'datadir': self.datadir,
            'port': self.port,
            'bind-address': '127.0.0.1',
            'socket': self.socket,
            'pid-file': os.path.join(self.dir, 'mysqld.pid'),
            'log-error': self.log_path,
            'innodb_buffer_pool_size': '32M',
            'innodb_log_file_size': '16M',
            'innodb_flush_log_at_trx_commit': 2,
            'max_connections': 300,
            'performance_schema': 'OFF',
            'binlog_format': 'ROW',
            'default_storage_engine': 'InnoDB',
            'innodb_autoinc_lock_mode': 2,
            'wsrep_on': 'ON',
            'wsrep_provider': PROVIDER,
            'wsrep_cluster_name': 'ictest',
            'wsrep_cluster_address': cluster_address,
            'wsrep_node_name': self.name,
            'wsrep_node_address': f'127.0.0.1:{self.gcomm_port}',
            'wsrep_provider_options': (
                f'"gmcast.listen_addr=tcp://127.0.0.1:{self.gcomm_port};'
                f'ist.recv_addr=127.0.0.1:{self.ist_port};'
                'gcache.size=32M;evs.suspect_timeout=PT5S;'
                'evs.inactive_timeout=PT10S;evs.install_timeout=PT10S"'),
            'wsrep_sst_method': 'rsync',
            'wsrep_sst_receive_address': f'127.0.0.1:{self.sst_port}',
            'wsrep_slave_threads': 2,
        }
        if user:
            options['user'] = user
        with open(self.config, 'w') as f:
            f.write('[mysqld]\n' + ''.join(f'{k} = {v}\n' for k, v in options.items()))

    def log(self):
        try:
            with open(self.log_path, errors='replace') as f:
                return f.read()
        except FileNotFoundError:
            return ''

    @property
    def alive(self):
        return self.process is not None and self.process.poll() is None


class GaleraCluster:
    """``size`` MariaDB Galera nodes on loopback under ``root`` (a directory)."""

    def __init__(self, root=None, size=3, start_timeout=120):
        self.size = size
        self.start_timeout = start_timeout
        # mariadbd refuses to run as root unless told to. As root it runs
        # as mysql: the rsync daemon of a state transfer, started by root,
        # would write as nobody. A caller that is not root runs it as itself.
        self.user = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam('mysql')
                self.user = 'mysql'
            except KeyError:
                self.user = 'root'
        # A directory of its own that the server's user can reach (a
        # pytest temporary directory is private to its owner), removed by
        # stop() unless ``root`` was given.
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix='ictest-galera-')
        if self.user and self.user != 'root':
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, self.user, self.user)
        ports = free_ports(4 * size)
        self.nodes = [Node(i + 1, self.root, ports[4 * i:4 * i + 4]) for i in range(size)]
        self.cluster_address = 'gcomm://' + ','.join(
            f'127.0.0.1:{n.gcomm_port}' for n in self.nodes)
        self._engines = {}

    # --- starting and stopping ---------------------------------------------

    def start(self):
        """Start every node, one after the other; return once all are Synced
        and the cluster has ``size`` members."""
        why = missing()
        if why:
            raise Unavailable(why)
        try:
            for node in self.nodes:
                self._start_node(node, bootstrap=node is self.nodes[0])
            self.wait_synced()
        except BaseException:
            self.stop()
            raise
        return self

    def _install(self, node):
        command = [INSTALL_DB, f'--defaults-file={node.config}', f'--datadir={node.datadir}',
                   '--auth-root-authentication-method=normal', '--skip-test-db']
        if self.user:
            command.append(f'--user={self.user}')
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f'{node.name}: mariadb-install-db failed: '
                               f'{(done.stdout + done.stderr)[-2000:]}')

    def _start_node(self, node, bootstrap):
        os.makedirs(node.datadir, exist_ok=True)
        if self.user and self.user != 'root':
            for path in (node.dir, node.datadir):
                shutil.chown(path, self.user, self.user)
        node.write_config(self.cluster_address, self.user)
        if bootstrap:
            # The joiners receive the whole data directory by rsync.
            self._install(node)
        command = [MARIADBD, f'--defaults-file={node.config}']
        if bootstrap:
            command.append('--wsrep-new-cluster')
        with open(os.path.join(node.dir, 'stdout.log'), 'a') as out:
            node.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        self._wait(lambda: self._status(node).get('wsrep_local_state_comment') == 'Synced',
                   f'{node.name} Synced')

    def wait_synced(self):
        def all_synced():
            for node in self.nodes:
                status = self._status(node)
                if (status.get('wsrep_local_state_comment') != 'Synced'
                        or status.get('wsrep_cluster_size') != str(self.size)):
                    return False
            return True

        self._wait(all_synced, f'{self.size} nodes Synced in one cluster')

    def _wait(self, predicate, what):
        deadline = time.monotonic() + self.start_timeout
        while not predicate():
            for node in self.nodes:
                if node.process is not None and not node.alive:
                    raise RuntimeError(f'{node.name} exited with {node.process.returncode} '
                                       f'waiting for {what}:\n{node.log()[-3000:]}')
            if time.monotonic() > deadline:
                tails = '\n'.join(f'--- {n.name}\n{n.log()[-1500:]}' for n in self.nodes)
                raise RuntimeError(f'timed out after {self.start_timeout} s waiting for '
                                   f'{what}:\n{tails}')
            time.sleep(0.5)

    def _status(self, node):
        """The node's wsrep status, {} while it does not answer."""
        try:
            with self.engine(node.index).connect() as conn:
                rows = conn.execute(sa.text("SHOW STATUS LIKE 'wsrep_%'")).all()
        except sa.exc.SQLAlchemyError:
            return {}
        return dict(rows)

    def stop(self, timeout=30):
        for engine in self._engines.values():
            engine.dispose()
        self._engines.clear()
        for node in reversed(self.nodes):
            if node.alive:
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            if node.process is None:
                continue
            try:
                node.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(node.process.pid, signal.SIGKILL)
                node.process.wait(10)
            # The rsync daemon of a state transfer, if one was under way.
            try:
                os.killpg(node.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self):
        """stop(), then remove the directory if this cluster made it."""
        self.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    # --- reaching it -------------------------------------------------------

    def url(self, index, database='', sync_wait=False):
        """A SQLAlchemy URL of ``database`` on node ``index`` (1-based)."""
        node = self.nodes[index - 1]
        url = f'mysql+pymysql://root@127.0.0.1:{node.port}/{database}'
        if sync_wait:
            url += '?' + urllib.parse.urlencode(
                {'init_command': 'SET SESSION wsrep_sync_wait = 1'})
        return url

    def urls(self, database='', sync_wait=False):
        return [self.url(n.index, database, sync_wait) for n in self.nodes]

    def sync_wait_url(self, index, database):
        return self.url(index, database, sync_wait=True)

    def engine(self, index, database='', sync_wait=False):
        """An engine (no pool, autocommit) on node ``index``, kept until stop()."""
        key = (index, database, sync_wait)
        if key not in self._engines:
            self._engines[key] = sa.create_engine(
                self.url(index, database, sync_wait), poolclass=sa.pool.NullPool,
                isolation_level='AUTOCOMMIT', connect_args={'connect_timeout': 5})
        return self._engines[key]

    def create_database(self, name):
        with self.engine(1).connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE {name}'))

    def drop_database(self, name):
        with self.engine(1).connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS {name}'))

    def logs(self, chars=2000):
        return '\n'.join(f'---- {n.name} error log (last {chars} chars) ----\n'
                         f'{n.log()[-chars:]}' for n in self.nodes)
