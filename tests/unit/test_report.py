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

"""The Guru Meditation Report: the service's own section, secrets masked."""

import types

from oslo_reports import guru_meditation_report as gmr

from ironic_compute import conf as ic_conf
from ironic_compute.daemon import report
from ironic_compute.nodes import tracker as resource_tracker


def fake_service(stats=None):
    return types.SimpleNamespace(
        host='cmp-1', service_id=7, interval=60, last_stats=stats,
        settings=resource_tracker.Settings(partition_key='rack-1',
                                           peer_list=('cmp-1', 'cmp-2')),
        instances=types.SimpleNamespace(busy=2))


def text_of(model):
    model.set_current_view_type('text')
    return str(model)


def test_the_section_shows_the_last_cycle_and_the_workers():
    text = text_of(report.service_section(fake_service(
        resource_tracker.CycleStats(peers=3, owned=12, seconds=0.25))))
    assert 'host = cmp-1' in text
    assert 'peer_list = cmp-1,cmp-2' in text
    assert 'peers=3 owned=12' in text and 'seconds=0.25' in text
    assert 'instance workers busy = 2' in text
    assert 'last cycle = none yet' in text_of(report.service_section(fake_service()))


def test_a_whole_report_masks_secrets(monkeypatch):
    # The report shows the process-wide cfg.CONF, as the daemon uses it.
    conf = ic_conf.CONF
    ic_conf.register_opts(conf)
    conf.set_override('connection', 'mysql+pymysql://u:s3cret@db/ic',
                      group='database')
    conf.set_override('update_resources_interval', 42)
    monkeypatch.setattr(gmr.TextGuruMeditation, 'persistent_sections', [],
                        raising=False)
    try:
        report.setup(conf, fake_service())
        text = gmr.TextGuruMeditation(report._Version).run()
    finally:
        conf.clear_override('connection', group='database')
        conf.clear_override('update_resources_interval')
    assert 'product = ironic-compute' in text
    assert 'host = cmp-1' in text
    assert '  update_resources_interval = 42' in text
    assert 's3cret' not in text and '  connection = ***' in text
