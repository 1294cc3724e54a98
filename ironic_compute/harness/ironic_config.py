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

"""The configuration of a standalone Ironic: its ports, its addresses, its files.

:func:`plan` chooses the API port and, per conductor group, a loopback address and a
JSON-RPC port; :func:`write` writes ``etc/ironic.conf`` (shared) and one override file
per extra conductor from that plan. Ironic then runs with SQLite (or a MariaDB
database), no Keystone (``noauth``), JSON-RPC between its processes and the
``fake-hardware`` driver.
"""

from __future__ import annotations

from pathlib import Path

from ironic_compute.harness.ironic_layout import CLI
from ironic_compute.harness.ironic_layout import MAIN_PROCESS
from ironic_compute.harness.ironic_layout import StateDir
from ironic_compute.harness.ironic_layout import process_name
from ironic_compute.harness.processes import API_HOST
from ironic_compute.harness.processes import IronicError
from ironic_compute.harness.processes import free_port
from ironic_compute.harness.processes import port_in_use


def render_config(values: dict[str, dict[str, object]]) -> str:
    """Return the text of an INI file with ``values`` ({section: {key: value}}): booleans
    as true/false, lists and tuples joined with commas."""
    lines: list[str] = []
    for section, options in values.items():
        lines.append(f"[{section}]")
        for key, value in options.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            lines.append(f"{key} = {value}")
        lines.append("")
    return "\n".join(lines)


# The interfaces enabled for fake-hardware (which then uses them by default): every action
# (power, manage, provide, deploy...) succeeds at once without a machine.
FAKE_INTERFACES = {
    "bios": "fake",
    "boot": "fake",
    "console": "fake",
    "deploy": "fake",
    "firmware": "fake",
    "inspect": "fake",
    "management": "fake",
    "network": "noop",
    "power": "fake",
    "raid": "fake",
    "rescue": "fake",
    "storage": "noop",
    "vendor": "fake",
}


def plan(files: StateDir, requested_port: int, groups: tuple[str, ...], max_limit: int,
         venv: Path, keep_ports: bool) -> dict:
    """Return the state of a start: the API port, and per process its group, loopback
    address and JSON-RPC port (the previous ones when ``keep_ports`` and still free).

    Raises IronicError when the requested API port is taken.
    """
    old = files.state if keep_ports else {}
    old_procs = old.get("processes", {})
    port = requested_port
    if port == 0 and keep_ports and old.get("port"):
        port = old["port"]  # same URL as before when restarting with the same database
    if port == 0:
        port = free_port(API_HOST)
    elif port_in_use(API_HOST, port):
        raise IronicError(
            f"port {port} on {API_HOST} is already in use (another Ironic? "
            f"`{CLI} status`); choose another with --port, or --port 0")
    procs: dict[str, dict] = {}
    used = {port}
    for index, group in enumerate(groups):
        name = process_name(group)
        # every process gets its own loopback address, so [DEFAULT]host (node reservations,
        # logs) is distinct and resolvable for the JSON-RPC client
        host = f"127.0.0.{index + 1}"
        rpc_port = old_procs.get(name, {}).get("rpc_port")
        if not rpc_port or (rpc_port in used) or port_in_use(host, rpc_port):
            rpc_port = free_port(host, avoid=used)
        used.add(rpc_port)
        procs[name] = {"group": group, "host": host, "rpc_port": rpc_port,
                       "hostname": f"{host}:{rpc_port}",
                       "log": str(files.log_path(name)), "pid_file": str(files.pid_file(name))}
    return {
        "url": f"http://{API_HOST}:{port}", "port": port, "groups": list(groups),
        "max_limit": max_limit, "venv": str(venv), "state_dir": str(files.path),
        "processes": procs,
    }


def write(files: StateDir, max_limit: int, debug: bool, database_url: str | None) -> None:
    """Write ``etc/ironic.conf`` (shared) and one override file per extra conductor, from
    ``files.state`` (see :func:`plan`)."""
    procs = files.state["processes"]
    main = procs[MAIN_PROCESS]
    enabled = {f"enabled_{iface}_interfaces": name for iface, name in FAKE_INTERFACES.items()}
    base = {
        "DEFAULT": {
            "host": main["host"],
            "auth_strategy": "noauth",
            "rpc_transport": "json-rpc",
            "enabled_hardware_types": "fake-hardware",
            **enabled,
            "debug": debug,
            "use_stderr": True,  # stderr goes to log/<name>.log
        },
        "api": {
            "host_ip": API_HOST,
            "port": files.state["port"],
            "max_limit": max_limit,
            # under noauth every request is a project-scoped admin: let nodes carry an
            # arbitrary owner
            "project_admin_can_manage_own_nodes": False,
        },
        "conductor": {"conductor_group": ""},
        # Several processes share one SQLite file: wait for its lock
        # (pysqlite's timeout, 5 s by default) instead of crashing.
        "database": {"connection": database_url
                     or f"sqlite:///{files.db_path}?timeout=60"},
        "json_rpc": {
            "auth_strategy": "noauth",
            "host_ip": main["host"],
            "port": main["rpc_port"],
        },
        # not needed by what the tests do, but keeps Ironic off Neutron and /var/lib
        "oslo_concurrency": {"lock_path": str(files.path / "locks")},
        "dhcp": {"dhcp_provider": "none"},
    }
    files.etc_dir.mkdir(parents=True, exist_ok=True)
    (files.etc_dir / "ironic.conf").write_text(
        "# Generated by tools/ironic_standalone.py; rewritten on every start.\n"
        + render_config(base))
    for name, proc in procs.items():
        if name == MAIN_PROCESS:
            continue
        override = {
            "DEFAULT": {"host": proc["host"]},
            "conductor": {"conductor_group": proc["group"]},
            "json_rpc": {"host_ip": proc["host"], "port": proc["rpc_port"]},
        }
        (files.etc_dir / f"{name}.conf").write_text(
            f"# conductor group {proc['group']!r}; loaded after ironic.conf\n"
            + render_config(override))
