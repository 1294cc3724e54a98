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

"""[oslo_reports] options: where the Guru Meditation Report is written.

The options are oslo.reports' own; they are listed here, with the other
groups, so that the sample configuration shows them. daemon/report.py sets
their defaults and installs the report when the service starts.
"""

from oslo_reports import opts as gmr_opts


def list_opts():
    """Return {group: options} of oslo.reports (copies, as it gives them)."""
    return dict(gmr_opts.list_opts())
