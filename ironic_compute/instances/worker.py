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

"""What every flow function gets as its first argument.

The instance side is split the way Ironic splits its conductor:
instances/manager.py runs the threads and hands each queued request to a
flow function, and each flow lives in a module of its own (build.py,
power.py, power_sync.py, teardown.py). A flow function is a plain function
``flow(worker, ...)``: the Worker below carries what the flows of one
service share, and nothing else. A flow returns True when the request is
finished (done, failed for good, or no longer this worker's), and False
when the manager should try it again later.
"""

import dataclasses
import threading

from ironic_compute.cluster import lease as lease_mod
from ironic_compute.instances import fencing
from ironic_compute.instances import provision


@dataclasses.dataclass
class Worker:
    """The service a flow works for.

    ``conf`` is the service's configuration (read at each use: options
    change on SIGHUP). ``ironic`` is the adapter (ironic.py); the flows
    send their requests through ``provisioner`` and list nodes through
    ``ironic``. ``fence`` says whether the worker may act now
    (fencing.py). ``stopping`` is set when the service stops.
    ``partition_key`` is the conductor group of this service's nodes; the
    manager updates it on SIGHUP.
    """

    conf: object
    host: str
    ironic: object
    provisioner: provision.Provisioner
    fence: fencing.Fence
    stopping: threading.Event
    partition_key: str | None = None
    # placement.claims.Claims: releases an instance's claim once its node
    # is free; None without [placement].
    claims: object = None

    @classmethod
    def of_service(cls, conf, host, ironic_client, partition_key, lease,
                   stopping, claims=None):
        """Return the Worker of a service: its Provisioner, and its Fence on
        ``lease`` (when None, a lease of ``service_down_time / 2`` that no
        heartbeat renews: without heartbeats nothing is ever sent)."""
        provisioner = provision.Provisioner(
            ironic_client, stopping=stopping, conductor_group=partition_key,
            max_requests=conf.max_concurrent_ironic_requests)
        lease = lease or lease_mod.Lease(lambda: conf.service_down_time / 2)
        fence = fencing.Fence(host, provisioner, lease, stopping)
        return cls(conf, host, ironic_client, provisioner, fence, stopping,
                   partition_key, claims)
