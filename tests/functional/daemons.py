"""Real ironic-compute processes, a DB ownership sampler and a TCP proxy."""

import collections
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import sqlalchemy as sa

BIN_DIR = os.path.dirname(sys.executable)


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
        self.expected_down = True

    def write_config(self, text=None):
        if text is None:
            text = ''.join(
                f'[{section}]\n' + ''.join(f'{k} = {v}\n' for k, v in values.items())
                for section, values in self.options.items())
        with open(self.config_path, 'w') as f:
            f.write(text)

    def start(self):
        self.write_config()
        env = dict(os.environ, **self.env)
        log = open(self.log_path, 'a')
        self.process = subprocess.Popen(
            [os.path.join(BIN_DIR, 'ironic-compute'), '--config-file', self.config_path],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
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

    def kill(self):
        self.expected_down = True
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout=30):
        self.expected_down = True
        if self.alive:
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


class OwnershipSampler(threading.Thread):
    """Reads compute_nodes every few tenths of a second, keeping violations.

    A violation is any sample where a node has more than one live row, or a
    node that had a row has none (a lost row) while it still exists.
    """

    def __init__(self, url, interval=0.1):
        super().__init__(daemon=True)
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.interval = interval
        self.latest = {}
        self.samples = 0
        self.duplicates = []
        self.errors = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._table = sa.table('compute_nodes', sa.column('uuid'), sa.column('host'),
                               sa.column('deleted'), sa.column('id'))

    def run(self):
        while not self._halt.is_set():
            try:
                with self.engine.connect() as conn:
                    rows = conn.execute(sa.select(self._table.c.uuid, self._table.c.host)
                                        .where(self._table.c.deleted == 0)).all()
            except sa.exc.SQLAlchemyError:
                self.errors += 1
            else:
                counts = collections.Counter(uuid for uuid, _ in rows)
                twice = [u for u, n in counts.items() if n > 1]
                with self._lock:
                    if twice:
                        self.duplicates.append(twice)
                    self.latest = dict(rows)
                    self.samples += 1
            self._halt.wait(self.interval)

    def snapshot(self):
        with self._lock:
            return dict(self.latest)

    def fresh_snapshot(self):
        """A sample taken after this call."""
        start = self.samples
        wait_until(lambda: self.samples > start + 1, 10, 0.05, 'a new sample')
        return self.snapshot()

    def close(self):
        self._halt.set()
        self.join(5)
        self.engine.dispose()


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

    def run(self):
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.enabled.is_set():
                client.close()
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
