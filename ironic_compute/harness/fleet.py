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

"""Real ironic-compute processes on one database, and what watches them.

:class:`Daemon` (one process, its config and log), :class:`Fleet` (the daemons
of one database, its ``db sync``, the CLI on it, its rows), the samplers that
read that database every few tenths of a second and keep what must never
happen (:class:`OwnershipSampler`, :class:`InstanceSampler`), :class:`TcpProxy`
(cut a daemon off its database or Ironic), :class:`HttpProxy` (count a daemon's
requests to Ironic, lose the answer to one) and :func:`wait_until`. The
functional tests' clusters, the demo and the instance benchmark build on
:class:`Fleet`. Failures raise ``AssertionError`` with what went wrong.
"""

import collections
import copy
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse

import sqlalchemy as sa

_NODES = sa.table('compute_nodes', sa.column('uuid'), sa.column('host'), sa.column('stats'),
                  sa.column('deleted'))
BIN_DIR = os.path.dirname(sys.executable)
# The checkout the project is installed from (editable): the daemons' working
# directory, where ``python -m tests...`` entry points are found.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_until(predicate, timeout, interval=0.2, message='condition'):
    """Poll ``predicate`` until it returns a true value; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out after {timeout} s waiting for {message}')
        time.sleep(interval)


def config_text(options):
    """The text of a config file with ``options`` ({section: {key: value}})."""
    return ''.join(f'[{section}]\n' + ''.join(f'{k} = {v}\n' for k, v in values.items())
                   for section, values in options.items())


class Daemon:
    """One ironic-compute process with its own config file and log."""

    def __init__(self, host, workdir, options):
        self.host = host
        self.workdir = workdir
        self.options = options  # {section: {key: value}}
        self.config_path = os.path.join(workdir, f'{host.lower()}.conf')
        self.log_path = os.path.join(workdir, f'{host.lower()}.log')
        self.process = None
        self.env = {}
        self.command = [os.path.join(BIN_DIR, 'ironic-compute')]
        self.expected_down = True
        self.paused = False

    def write_config(self, text=None):
        if text is None:
            text = config_text(self.options)
        with open(self.config_path, 'w') as f:
            f.write(text)

    def start(self):
        self.write_config()
        env = dict(os.environ, **self.env)
        log = open(self.log_path, 'a')
        self.process = subprocess.Popen(
            [*self.command, '--config-file', self.config_path],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            cwd=REPO_ROOT)
        log.close()
        self.expected_down = False
        return self

    def check(self):
        """Raise with the end of the log if the process died unexpectedly."""
        if not self.expected_down and not self.alive:
            raise AssertionError(
                f'{self.host} exited with {self.process.returncode}:\n{self.log()[-2000:]}')

    @property
    def alive(self):
        return self.process is not None and self.process.poll() is None

    def signal(self, signo):
        if signo in (signal.SIGTERM, signal.SIGINT):
            self.expected_down = True
        self.process.send_signal(signo)

    def pause(self):
        """SIGSTOP: the process is frozen (a stuck VM) until :meth:`resume`."""
        self.paused = True
        self.process.send_signal(signal.SIGSTOP)

    def resume(self):
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self):
        self.expected_down = True
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout=30):
        self.expected_down = True
        if self.alive:
            if self.paused:  # a frozen process would never see the SIGTERM
                self.resume()
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode if self.process else None

    def log(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except FileNotFoundError:
            return ''

    def count_in_log(self, text):
        return self.log().count(text)


class Fleet:
    """The daemons of one database, a sampler of it, and the CLI on it.

    ``workdir`` holds the daemons' configs and logs and ``manage.conf``, the
    config of the CLI (``[database]connection = db_url`` and ``manage_options``
    in ``[DEFAULT]``), unless ``manage_config`` names another one. ``sampler``:
    an :class:`OwnershipSampler` to start with the daemons (None: none). A
    subclass adds the daemons (:meth:`add`) and what its users ask of them.
    """

    def __init__(self, workdir, db_url, sampler=None, manage_options=None,
                 manage_config=None):
        self.workdir = str(workdir)
        self.db_url = db_url
        self.daemons = {}
        self.sampler = sampler
        self.engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
        self.manage_config = manage_config
        if manage_config is None:
            self.manage_config = os.path.join(self.workdir, 'manage.conf')
            self.write_manage_config(manage_options or {})

    def write_manage_config(self, defaults):
        with open(self.manage_config, 'w') as f:
            f.write(config_text({**({'DEFAULT': defaults} if defaults else {}),
                                 'database': {'connection': self.db_url}}))

    def add(self, host, options):
        """A :class:`Daemon` ``host`` with ``options``, not started yet."""
        daemon = self.daemons[host.lower()] = Daemon(host, self.workdir, options)
        return daemon

    def manage(self, *args, timeout=120):
        """``ironic-compute-manage args`` on this fleet's database."""
        return manage(self.manage_config, *args, timeout=timeout)

    def start(self):
        """``db sync``, then every daemon, then the sampler."""
        sync = self.manage('db', 'sync')
        assert sync.returncode == 0, sync.stderr
        self._first_options = {host: copy.deepcopy(daemon.options)
                               for host, daemon in self.daemons.items()}
        for daemon in self.daemons.values():
            daemon.start()
        if self.sampler is not None:
            self.sampler.start()

    def restore(self):
        """Every daemon running again, unfrozen, with the options it first
        started with; the hosts it had to (re)start.

        What a test that stopped, froze or reconfigured a daemon calls at
        its start so that it does not depend on the test before it.
        """
        started = []
        for host, daemon in self.daemons.items():
            if daemon.paused:
                daemon.resume()
            first = self._first_options.get(host, daemon.options)
            if daemon.options != first:
                daemon.options = copy.deepcopy(first)
                daemon.stop()
            if not daemon.alive:
                daemon.start()
                started.append(host)
        return started

    def check_daemons(self):
        """AssertionError with the end of its log when a daemon died."""
        for daemon in self.daemons.values():
            daemon.check()

    def node_rows(self):
        """{node uuid: (host, available)} of the live compute_nodes rows."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(_NODES.c.uuid, _NODES.c.host, _NODES.c.stats)
                                .where(_NODES.c.deleted == 0)).all()
        return {uuid: (host, bool(json.loads(stats or '{}').get('available')))
                for uuid, host, stats in rows}

    def close(self, *closeables):
        """The reverse of :meth:`start`: stop every daemon, then close the
        sampler and ``closeables`` (proxies, sockets, threads)."""
        for daemon in self.daemons.values():
            daemon.stop()
        for closeable in (self.sampler, *closeables):
            if closeable is not None:
                closeable.close()
        self.engine.dispose()


def _append(history, read_at, sample):
    """Append ``(read_at, sample)`` to ``history``; the sample kept (the previous
    one's when equal: memory stays small)."""
    if history and history[-1][1] == sample:
        sample = history[-1][1]
    history.append((read_at, sample))
    return sample


def _keep(read_at, *found):
    """Append ``(read_at, value)`` to each ``(list, value)`` of ``found`` whose value
    is not empty: what a check found in the sample read at ``read_at``."""
    for kept, value in found:
        if value:
            kept.append((read_at, value))


class OwnershipSampler(threading.Thread):
    """Reads who owns which node every ``interval`` seconds and keeps what is wrong.

    Each sample is one SELECT of the live ``compute_nodes`` rows (a consistent
    snapshot on MariaDB and PostgreSQL), then one of the ``services`` rows.
    Every sample is kept in ``history`` as ``(read_at, owners)``: the monotonic
    time the rows were read and ``{uuid: host}`` (host None: held by nobody),
    so a test can tell when ownership reached a state (:meth:`first_sample`).
    What each check guards:

    ``lost``: a node that had a live row and still exists in Ironic seen without
        one. Moving a node is one conditional UPDATE of the row's host, so a
        reader never sees a moving node without its row; the only legitimate
        way to lose a row is a soft delete after Ironic answered 404. This is
        the check for Nova's rows deleted in rebalance races and for a failed
        Ironic or DB call read as "no nodes". The sampler cannot ask Ironic on
        every sample: a test that deletes a node in Ironic announces it with
        :meth:`expect_gone` first, and :meth:`expect_back` once the node exists
        again. A loss that is undone within one sampling period can go unseen.
    ``unknown_owners``: a live row whose host is neither NULL nor the host of
        a live ``services`` row: held by no service its peers could know of.
    ``duplicates``: more than one live row for a uuid. The unique constraint
        on (uuid, deleted) makes this impossible while the schema has it; the
        check is cheap insurance that the constraint exists and holds on this
        backend, not a test of the services' logic. A row has a single host
        column, so this is also the only way "a node owned twice" could show
        in the database.

    ``cycles`` lists, per resource-tracker cycle a service recorded, ``(seen_at,
    host, seconds)``: how long the cycles took, for the failover bound.
    """

    def __init__(self, url, interval=0.1):
        super().__init__(daemon=True)
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.interval = interval
        self.history = []  # (read_at, {uuid: host}), one per sample
        self.lost = []  # (read_at, [uuid, ...])
        self.unknown_owners = []  # (read_at, {uuid: host})
        self.duplicates = []  # (read_at, [uuid, ...])
        self.cycles = []  # (seen_at, host, seconds)
        self.errors = 0
        self._had_row = set()  # uuids seen with a live row
        self._expected_gone = set()  # uuids the test deleted in Ironic
        self._last_cycle_at = {}  # host -> services.last_cycle_at last seen
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._nodes = sa.table('compute_nodes', sa.column('uuid'), sa.column('host'),
                               sa.column('deleted'))
        self._services = sa.table('services', sa.column('host'), sa.column('deleted'),
                                  sa.column('last_cycle_at'),
                                  sa.column('last_cycle_seconds'))

    def run(self):
        while not self._halt.is_set():
            try:
                with self.engine.connect() as conn:
                    rows = conn.execute(sa.select(self._nodes.c.uuid, self._nodes.c.host)
                                        .where(self._nodes.c.deleted == 0)).all()
                    read_at = time.monotonic()
                    services = conn.execute(
                        sa.select(self._services.c.host, self._services.c.last_cycle_at,
                                  self._services.c.last_cycle_seconds)
                        .where(self._services.c.deleted == 0)).all()
                    more = self._read_more(conn)
            except sa.exc.SQLAlchemyError:
                self.errors += 1
            else:
                self._check(read_at, rows, services)
                self._check_more(read_at, services, more)
            self._halt.wait(self.interval)

    def _read_more(self, conn):
        """A subclass reads more tables here, in the sample's connection."""

    def _check_more(self, read_at, services, more):
        """A subclass checks what :meth:`_read_more` returned."""

    def _check(self, read_at, rows, services):
        owners = dict(rows)
        twice = [u for u, n in collections.Counter(u for u, _ in rows).items() if n > 1]
        known_hosts = {host for host, _, _ in services}
        unknown = {u: h for u, h in owners.items() if h is not None and h not in known_hosts}
        with self._lock:
            owners = _append(self.history, read_at, owners)
            self._had_row |= owners.keys()
            lost = sorted(self._had_row - owners.keys() - self._expected_gone)
            _keep(read_at, (self.lost, lost), (self.unknown_owners, unknown),
                  (self.duplicates, twice))
            for host, cycle_at, seconds in services:
                if cycle_at is not None and self._last_cycle_at.get(host) != cycle_at:
                    self._last_cycle_at[host] = cycle_at
                    self.cycles.append((read_at, host, seconds))

    def expect_gone(self, uuids):
        """These nodes are being deleted in Ironic: losing their rows is right."""
        with self._lock:
            self._expected_gone.update(uuids)

    def expect_back(self, uuids):
        """These nodes exist in Ironic again: watch them afresh once they have a row."""
        with self._lock:
            self._expected_gone.difference_update(uuids)
            self._had_row.difference_update(uuids)

    def violations(self):
        """What the checks found so far, {} when all is well.

        Per check: how many samples showed a violation and the first three.
        """
        with self._lock:
            found = {name: f'{len(value)} samples, first: {value[:3]}' for name, value in (
                ('lost', self.lost), ('unknown_owners', self.unknown_owners),
                ('duplicates', self.duplicates)) if value}
        if not self.is_alive() and not self._halt.is_set():
            found['sampler'] = 'the sampler thread died'
        return found

    @property
    def samples(self):
        return len(self.history)

    def snapshot(self):
        with self._lock:
            return dict(self.history[-1][1]) if self.history else {}

    def fresh_snapshot(self):
        """A sample taken after this call."""
        start = self.samples
        wait_until(lambda: self.samples > start + 1, 10, 0.05, 'a new sample')
        return self.snapshot()

    def first_sample(self, predicate, since):
        """``(read_at, previous_read_at)`` of the first sample read after ``since``
        whose owners satisfy ``predicate``, or None.

        The state was reached between the two times: ``read_at - previous_read_at``
        (about one sampling period) is how precisely the sampler dates it.
        """
        with self._lock:
            history = list(self.history)
        previous = since
        for read_at, owners in history:
            if read_at <= since:
                continue
            if predicate(owners):
                return read_at, previous
            previous = read_at
        return None

    def cycle_seconds(self, hosts, start, end):
        """Durations of the cycles of ``hosts`` recorded between ``start`` and ``end``."""
        with self._lock:
            return [seconds for seen_at, host, seconds in self.cycles
                    if host in hosts and start < seen_at <= end]

    def close(self):
        self._halt.set()
        if self.ident is not None:  # started
            self.join(5)
        self.engine.dispose()


class InstanceSampler(OwnershipSampler):
    """An OwnershipSampler that also reads the live ``instances`` rows.

    One more SELECT per sample (a consistent snapshot of that table); each
    sample is kept in ``instance_history`` as ``(read_at, {uuid: (host, node,
    vm_state, task_state)})``. What each check guards:

    ``homeless``: a live instance whose host is NULL or no service's: every
        instance has exactly one host its peers know, at every instant.
    ``shared_nodes``: a node with two live instances (two builds that won
        the same node, or a takeover that left a copy behind).
    ``doubled``: two live rows for one instance uuid.
    ``lost_instances``: an instance seen live, then without a live row,
        that the test did not delete (:meth:`expect_gone` first).
    """

    def __init__(self, url, interval=0.1):
        super().__init__(url, interval)
        self.instance_history = []  # (read_at, {uuid: (host, node, vm, task)})
        self.homeless = []
        self.shared_nodes = []
        self.doubled = []
        self.lost_instances = []
        self._had_instance = set()
        self._instances_gone = set()
        self._instances = sa.table(
            'instances', sa.column('uuid'), sa.column('host'), sa.column('node'),
            sa.column('vm_state'), sa.column('task_state'), sa.column('deleted'))

    def _read_more(self, conn):
        table = self._instances
        return conn.execute(sa.select(table.c.uuid, table.c.host, table.c.node,
                                      table.c.vm_state, table.c.task_state)
                            .where(table.c.deleted == 0)).all()

    def _check_more(self, read_at, services, rows):
        known_hosts = {host for host, _, _ in services}
        instances = {uuid: tuple(rest) for uuid, *rest in rows}
        twice = [u for u, n in collections.Counter(r[0] for r in rows).items() if n > 1]
        on_node = collections.Counter(r[2] for r in rows if r[2] is not None)
        shared = sorted(node for node, n in on_node.items() if n > 1)
        homeless = {u: v[0] for u, v in instances.items() if v[0] not in known_hosts}
        with self._lock:
            instances = _append(self.instance_history, read_at, instances)
            self._had_instance |= instances.keys()
            lost = sorted(self._had_instance - instances.keys() - self._instances_gone)
            _keep(read_at, (self.lost_instances, lost), (self.homeless, homeless),
                  (self.shared_nodes, shared), (self.doubled, twice))

    def expect_instances_gone(self, uuids):
        """These instances are being deleted: their rows may leave."""
        with self._lock:
            self._instances_gone.update(uuids)

    def violations(self):
        found = super().violations()
        with self._lock:
            found.update({name: f'{len(value)} samples, first: {value[:3]}' for name, value in (
                ('homeless', self.homeless), ('shared_nodes', self.shared_nodes),
                ('doubled', self.doubled), ('lost_instances', self.lost_instances))
                if value})
        return found

    def instances(self):
        """The instances of a sample taken after this call."""
        start = self.samples
        wait_until(lambda: self.samples > start + 1, 10, 0.05, 'a new sample')
        with self._lock:
            return dict(self.instance_history[-1][1])


def manage(config_path, *args, timeout=120):
    """Run ``ironic-compute-manage --config-file config_path args...``."""
    return subprocess.run(
        [os.path.join(BIN_DIR, 'ironic-compute-manage'), '--config-file', config_path,
         *args], capture_output=True, text=True, timeout=timeout)


class TcpProxy(threading.Thread):
    """Forwards a local port to a target; ``down()`` refuses and cuts traffic.

    Lets a test make a database or Ironic unreachable for some services
    without stopping the shared server.
    """

    def __init__(self, target_host, target_port):
        super().__init__(daemon=True)
        self.target = (target_host, target_port)
        self.listener = socket.create_server(('127.0.0.1', 0))
        self.port = self.listener.getsockname()[1]
        self.enabled = threading.Event()
        self.enabled.set()
        self._conns = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def to(cls, url):
        """A started proxy to the host and port of ``url`` (a database's or Ironic's)."""
        parts = urllib.parse.urlsplit(url)
        proxy = cls(parts.hostname, parts.port)
        proxy.start()
        return proxy

    def reach(self, url):
        """``url`` (of the proxy's target) through the proxy."""
        parts = urllib.parse.urlsplit(url)
        user = parts.netloc.rpartition('@')[0]
        netloc = (f'{user}@' if user else '') + f'127.0.0.1:{self.port}'
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def refuse(self, client):
        """Whether to refuse a new connection (closed here when refused)."""
        if self.enabled.is_set():
            return False
        client.close()
        return True

    def run(self):
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refuse(client):
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a, b):
        sockets = [a, b]
        try:
            while self.enabled.is_set():
                readable, _, _ = select.select(sockets, [], [], 0.2)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (b if sock is a else a).sendall(data)
        except OSError:
            pass
        finally:
            for sock in sockets:
                try:
                    sock.close()
                except OSError:
                    pass

    def down(self):
        self.enabled.clear()
        with self._lock:
            conns, self._conns = self._conns, []
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def up(self):
        self.enabled.set()

    def close(self):
        self._closed = True
        self.down()
        self.listener.close()


def _take_request(buffer):
    """The first whole HTTP/1.1 request in ``buffer``: ((its bytes, method, target,
    body), the bytes after it), or None while it is incomplete. ValueError when its
    length is not given by Content-Length (a chunked body) or its head cannot be
    read."""
    end = buffer.find(b'\r\n\r\n')
    if end < 0:
        return None
    line, *fields = buffer[:end].decode('latin-1').split('\r\n')
    method, target, _version = line.split(' ', 2)
    headers = {}
    for field in fields:
        name, _, value = field.partition(':')
        headers[name.strip().lower()] = value.strip()
    if 'transfer-encoding' in headers:
        raise ValueError('a body without Content-Length')
    total = end + 4 + int(headers.get('content-length', 0))
    if len(buffer) < total:
        return None
    return (buffer[:total], method, target, buffer[end + 4:total]), buffer[total:]


class HttpProxy(TcpProxy):
    """A :class:`TcpProxy` to an HTTP server that reads the requests it forwards:
    it counts them (``forwarded``: {(method, path): how many}, the path without
    its query), can lose the answer to one of them (:meth:`lose_answer`) and
    hold the answers to some (:meth:`delay_answers`).

    The rules are given a predicate ``matches(method, target, body)``: the
    request's method, its target as sent (the path and the query) and its body
    (bytes). A client such as requests sends one request at a time on a
    connection, the next only once it has read the answer, so what the server
    sends after a request is that request's answer. A request whose body has no
    Content-Length (chunked) ends the reading: the rest of that connection is
    forwarded as is, uncounted.
    """

    def __init__(self, target_host, target_port):
        super().__init__(target_host, target_port)
        self.forwarded = collections.Counter()
        self.lost = []  # (method, path, the answer's status line), one per lost answer
        self.delayed = 0  # answers held by delay_answers
        self._lose = None  # (matches, hold) while armed
        self._delay = None  # (matches, seconds) while set

    def lose_answer(self, matches, hold=0.0):
        """Lose the answer to the next request that ``matches``, once: the request
        is forwarded, and when the server's answer begins (the server has received
        it and answered), the answer is thrown away and the client's connection
        reset, at once (``hold`` 0: the client sees a reset after sending) or
        ``hold`` seconds after the request was forwarded (a client with a shorter
        read timeout sees a read timeout). ``lost`` records it."""
        with self._lock:
            self._lose = (matches, hold)

    def delay_answers(self, matches, seconds):
        """From now on, hold the answer to every request that ``matches`` until
        ``seconds`` after the request was forwarded (a slow server); ``delayed``
        counts them."""
        with self._lock:
            self._delay = (matches, seconds)

    def clear(self):
        """No answer lost or held any more (what is under way goes on)."""
        with self._lock:
            self._lose = self._delay = None

    def count(self, method, path):
        with self._lock:
            return self.forwarded[(method, path)]

    def _forward(self, method, target, body):
        """Count the request; what to do with its answer: ('lose', hold),
        ('delay', seconds) or None (forward it)."""
        with self._lock:
            self.forwarded[(method, urllib.parse.urlsplit(target).path)] += 1
            if self._lose is not None and self._lose[0](method, target, body):
                (_, hold), self._lose = self._lose, None
                return 'lose', hold
            if self._delay is not None and self._delay[0](method, target, body):
                self.delayed += 1
                return 'delay', self._delay[1]
        return None

    def _pump(self, client, upstream):
        buffer, reading = b'', True
        # The answer now expected: (what, seconds, forwarded at, method, path),
        # what is 'lose' or 'delay'; and the bytes of a held answer.
        special, held = None, b''
        try:
            while self.enabled.is_set():
                readable, _, _ = select.select([client, upstream], [], [], 0.05)
                if special and special[0] == 'delay' and (
                        time.monotonic() >= special[2] + special[1]):
                    client.sendall(held)
                    special, held = None, b''
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is upstream:
                        if special is None:
                            client.sendall(data)
                        elif special[0] == 'delay':
                            held += data
                        else:
                            self._lose_now(client, data, *special[1:])
                            return
                        continue
                    if not reading:
                        upstream.sendall(data)
                        continue
                    buffer += data
                    while buffer:
                        try:
                            taken = _take_request(buffer)
                        except ValueError:
                            reading, data, buffer = False, buffer, b''
                            upstream.sendall(data)
                            break
                        if taken is None:
                            break
                        (request, method, target, body), buffer = taken
                        rule = self._forward(method, target, body)
                        upstream.sendall(request)
                        if rule is not None:
                            special = (*rule, time.monotonic(), method,
                                       urllib.parse.urlsplit(target).path)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                try:
                    sock.close()
                except OSError:
                    pass

    def _lose_now(self, client, answer, hold, forwarded_at, method, path):
        """Record the answer that begins with ``answer`` as lost, keep silent
        until ``hold`` seconds after its request was forwarded, then reset the
        client's connection (not a clean close: the client reads ECONNRESET)."""
        with self._lock:
            self.lost.append((method, path, answer.split(b'\r\n', 1)[0].decode('latin-1')))
        time.sleep(max(0.0, forwarded_at + hold - time.monotonic()))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
