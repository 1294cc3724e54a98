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

"""The harness's HttpProxy, between requests and a small HTTP/1.1 server:
what the functional tests use to lose Ironic's answer to one request."""

import http.server
import json
import threading
import time

import pytest
import requests

from ironic_compute.harness import fleet


class Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'  # keep-alive, as Ironic's server

    def _answer(self, status):
        length = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(length) if length else b''
        if self.headers.get('Transfer-Encoding') == 'chunked':
            body = b''
            while (size := int(self.rfile.readline(), 16)):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        self.server.received.append((self.command, self.path, body))
        answer = json.dumps({'path': self.path}).encode()
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self):
        self._answer(200)

    def do_PUT(self):
        self._answer(202)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Recorder)
    httpd.daemon_threads = True
    httpd.received = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def proxy(server):
    proxy = fleet.HttpProxy(*server.server_address)
    proxy.start()
    yield proxy
    proxy.close()


def url(proxy, path):
    return f'http://127.0.0.1:{proxy.port}{path}'


def is_power(method, target, body):
    return method == 'PUT' and target.endswith('/states/power')


def causes(error):
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__ or next(
            (a for a in getattr(error, 'args', ()) if isinstance(a, BaseException)), None)
    return seen


def test_forwards_and_counts_the_requests_of_a_kept_alive_connection(server, proxy):
    with requests.Session() as session:
        assert session.get(url(proxy, '/v1/nodes?fields=uuid')).json() == {
            'path': '/v1/nodes?fields=uuid'}
        answer = session.put(url(proxy, '/v1/nodes/n1/states/power'),
                             json={'target': 'rebooting'})
        assert answer.status_code == 202
        assert session.get(url(proxy, '/v1/nodes/n1')).status_code == 200
    assert [(m, p) for m, p, _ in server.received] == [
        ('GET', '/v1/nodes?fields=uuid'), ('PUT', '/v1/nodes/n1/states/power'),
        ('GET', '/v1/nodes/n1')]
    assert json.loads(server.received[1][2]) == {'target': 'rebooting'}
    assert proxy.forwarded == {('GET', '/v1/nodes'): 1, ('GET', '/v1/nodes/n1'): 1,
                               ('PUT', '/v1/nodes/n1/states/power'): 1}
    assert proxy.count('PUT', '/v1/nodes/n1/states/power') == 1
    assert proxy.lost == []


def test_loses_the_answer_to_one_matching_request_with_a_reset(server, proxy):
    seen = []
    proxy.lose_answer(lambda method, target, body: (
        seen.append((method, target)) or is_power(method, target, body)
        and json.loads(body)['target'] == 'rebooting'))
    with requests.Session() as session:
        # Not matching: answered, on the connection the next request uses too.
        assert session.get(url(proxy, '/v1/nodes/n1')).status_code == 200
        assert session.put(url(proxy, '/v1/nodes/n1/states/power'),
                           json={'target': 'power off'}).status_code == 202
        with pytest.raises(requests.ConnectionError) as raised:
            session.put(url(proxy, '/v1/nodes/n1/states/power'), json={'target': 'rebooting'})
        # Once: the same request again is answered.
        assert session.put(url(proxy, '/v1/nodes/n1/states/power'),
                           json={'target': 'rebooting'}).status_code == 202
    # After the server received it: a reset, not a refused connection.
    assert any(isinstance(e, ConnectionResetError) for e in causes(raised.value)), raised.value
    assert [(m, json.loads(b)['target']) for m, p, b in server.received if m == 'PUT'] == [
        ('PUT', 'power off'), ('PUT', 'rebooting'), ('PUT', 'rebooting')]
    assert proxy.lost == [('PUT', '/v1/nodes/n1/states/power', 'HTTP/1.1 202 Accepted')]
    assert proxy.count('PUT', '/v1/nodes/n1/states/power') == 3
    assert seen == [('GET', '/v1/nodes/n1'), ('PUT', '/v1/nodes/n1/states/power'),
                    ('PUT', '/v1/nodes/n1/states/power')]


def test_holds_the_answer_past_the_clients_read_timeout(server, proxy):
    proxy.lose_answer(is_power, hold=2.0)
    with pytest.raises(requests.ReadTimeout):
        requests.put(url(proxy, '/v1/nodes/n2/states/power'), json={'target': 'rebooting'},
                     timeout=0.5)
    fleet.wait_until(lambda: proxy.lost, 5, 0.05, 'the answer to be lost')
    assert [(m, p) for m, p, _ in server.received] == [('PUT', '/v1/nodes/n2/states/power')]
    assert proxy.lost == [('PUT', '/v1/nodes/n2/states/power', 'HTTP/1.1 202 Accepted')]


def test_a_chunked_body_is_forwarded_as_it_is(server, proxy):
    proxy.lose_answer(is_power)
    with requests.Session() as session:
        answer = session.put(url(proxy, '/v1/nodes/n3/states/power'),
                             data=iter([b'{"target": ', b'"rebooting"}']))
        assert answer.status_code == 202
        assert session.get(url(proxy, '/v1/nodes/n3')).status_code == 200
    assert [(m, p, b) for m, p, b in server.received] == [
        ('PUT', '/v1/nodes/n3/states/power', b'{"target": "rebooting"}'),
        ('GET', '/v1/nodes/n3', b'')]
    # Not read, so neither counted nor lost.
    assert proxy.forwarded == {} and proxy.lost == []


def test_holds_the_answers_to_the_matching_requests_for_a_while(server, proxy):
    proxy.delay_answers(lambda method, target, body: 'slow=1' in target, 0.6)
    with requests.Session() as session:
        def timed(path):
            started = time.monotonic()
            assert session.get(url(proxy, path)).json() == {'path': path}
            return time.monotonic() - started

        assert timed('/v1/nodes?slow=1') >= 0.6
        assert timed('/v1/nodes?slow=0') < 0.5
        assert timed('/v1/nodes?slow=1') >= 0.6
        proxy.clear()
        assert timed('/v1/nodes?slow=1') < 0.5
    assert proxy.delayed == 2
    assert proxy.forwarded == {('GET', '/v1/nodes'): 4} and proxy.lost == []
