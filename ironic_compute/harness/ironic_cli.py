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

"""The command line of the standalone Ironic: ``tools/ironic_standalone.py``.

``install``, ``start``, ``stop`` and ``status`` of one :class:`IronicServer`; every
option has an environment fallback (``--help``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ironic_compute.harness.ironic import IronicServer
from ironic_compute.harness.ironic_layout import DEFAULT_MAX_LIMIT
from ironic_compute.harness.ironic_layout import DEFAULT_PIP_SPEC
from ironic_compute.harness.ironic_layout import DEFAULT_PORT
from ironic_compute.harness.ironic_layout import DEFAULT_STATE_DIR
from ironic_compute.harness.ironic_layout import DEFAULT_VENV
from ironic_compute.harness.ironic_layout import ENV_VARS
from ironic_compute.harness.processes import DEFAULT_STOP_TIMEOUT
from ironic_compute.harness.processes import IronicError


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--venv", default=os.environ.get(ENV_VARS["venv"]) or str(DEFAULT_VENV),
                        help="Ironic's own virtualenv [$IRONIC_VENV, default %(default)s]")
    common.add_argument("--state-dir",
                        default=os.environ.get(ENV_VARS["state_dir"]) or str(DEFAULT_STATE_DIR),
                        help="config, SQLite DB, logs, pid files "
                             "[$IRONIC_STATE_DIR, default %(default)s]")
    common.add_argument("--pip-spec",
                        default=os.environ.get(ENV_VARS["pip_spec"]) or DEFAULT_PIP_SPEC,
                        help="what to pip install, e.g. 'ironic==39.0.0' "
                             "[$IRONIC_PIP_SPEC, default %(default)s]")
    common.add_argument("--python", default=os.environ.get(ENV_VARS["python"]) or sys.executable,
                        help="interpreter for the venv [$IRONIC_PYTHON, default %(default)s]")
    common.add_argument("--port", type=int, default=_env_int(ENV_VARS["port"], DEFAULT_PORT),
                        help="API port on 127.0.0.1, 0 = pick a free one "
                             "[$IRONIC_PORT, default %(default)s]")
    common.add_argument("--groups", default=os.environ.get(ENV_VARS["groups"]),
                        help="conductor groups, comma separated, '' = default group "
                             "[$IRONIC_GROUPS, default ',group-a']")
    common.add_argument("--max-limit", type=int,
                        default=_env_int(ENV_VARS["max_limit"], DEFAULT_MAX_LIMIT),
                        help="[api]max_limit, the page size "
                             "[$IRONIC_MAX_LIMIT, default %(default)s]")

    parser = argparse.ArgumentParser(
        description="Run a standalone Ironic (SQLite, noauth, fake-hardware) for tests/demos.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("install", parents=[common], help="create the venv and pip install ironic")
    p.add_argument("--force", action="store_true", help="pip install even when present")
    p = sub.add_parser("start", parents=[common],
                       help="(re)start Ironic, wait until every conductor group is served")
    p.add_argument("--keep-db", action="store_true",
                   help="keep the SQLite database (and ports) of the previous run")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for readiness [$IRONIC_START_TIMEOUT, default 120]")
    p.add_argument("--debug", action="store_true", help="[DEFAULT]debug = true")
    p.add_argument("--no-install", action="store_true", help="fail instead of installing")
    p = sub.add_parser("stop", parents=[common], help="stop the processes (idempotent)")
    p.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT,
                   help="seconds between SIGTERM and SIGKILL [default %(default)s]")
    p = sub.add_parser("status", parents=[common], help="show processes and API health")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    server = None
    try:
        server = IronicServer(
            venv=args.venv, state_dir=args.state_dir, port=args.port, groups=args.groups,
            max_limit=args.max_limit, pip_spec=args.pip_spec, python=args.python,
            debug=getattr(args, "debug", False))
        if args.command == "install":
            server.install(force=args.force)
        elif args.command == "start":
            server.start(keep_db=args.keep_db, timeout=args.timeout, install=not args.no_install)
            print(f"IRONIC_URL={server.url}")
        elif args.command == "stop":
            server.stop(timeout=args.timeout)
        elif args.command == "status":
            status = server.status()
            if args.json:
                print(json.dumps(status, indent=2, sort_keys=True))
            else:
                _print_status(status)
            running = any(p["running"] for p in status["processes"].values())
            return 0 if running and status["api"] == "up" else 3
    except IronicError as exc:
        print(f"ironic-standalone: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if server is not None and args.command == "start":
            server.stop(quiet=True)
        return 130
    return 0


def _print_status(status: dict) -> None:
    print(f"url:       {status.get('url')}")
    print(f"api:       {status.get('api')}")
    print(f"installed: {status.get('installed_version') or 'no'}")
    for name, proc in status["processes"].items():
        state = f"running, pid {proc['pid']}" if proc["running"] else "stopped"
        print(f"  {name:<24} group={proc.get('group', '?')!r:<12} "
              f"rpc={proc.get('hostname', '?'):<22} {state}")
    for cond in status.get("conductors", []):
        print(f"  conductor {cond['hostname']:<22} group={cond['conductor_group']!r:<12} "
              f"alive={cond['alive']}")


if __name__ == "__main__":
    sys.exit(main())
