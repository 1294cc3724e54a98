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

"""Guru Meditation Report on SIGUSR2 (oslo.reports).

What every OpenStack service prints when an operator sends SIGUSR2: the
package, every thread's stack, the configuration (options marked secret
are masked), plus this service's own section: the last cycle's figures and
the instance workers. Written to stderr (the journal), or to a file in
``[oslo_reports]log_dir`` when set.
"""

import dataclasses

from oslo_reports import guru_meditation_report as gmr
from oslo_reports import opts as gmr_opts
from oslo_reports.models import with_default_views

import ironic_compute

SERVICE_NAME = 'ironic-compute'


class _Version:
    """What oslo.reports asks of a version object."""

    vendor_string = staticmethod(lambda: 'OpenStack')
    product_string = staticmethod(lambda: SERVICE_NAME)

    @staticmethod
    def version_string_with_package():
        return ironic_compute.version_string()


def service_section(service):
    """The section of ``service``: its state and its last cycle."""
    stats = service.last_stats
    data = {
        'host': service.host,
        'service id': service.service_id,
        'partition_key': service.settings.partition_key,
        'peer_list': ','.join(service.settings.peer_list) or '-',
        'update_resources_interval': service.interval,
        'last cycle': ('none yet' if stats is None else ' '.join(
            f'{key}={value}' for key, value
            in dataclasses.asdict(stats).items())),
    }
    if service.instances is not None:
        data['instance workers busy'] = service.instances.busy
    return with_default_views.ModelWithDefaultViews(data)


def setup(conf, service):
    """Print the report on SIGUSR2 from now on."""
    gmr_opts.set_defaults(conf)
    gmr.TextGuruMeditation.register_section(
        'ironic-compute', lambda: service_section(service))
    gmr.TextGuruMeditation.setup_autorun(_Version, service_name=SERVICE_NAME,
                                         conf=conf)

