#!/usr/bin/env bash
# Run every test: what a fresh machine needs, then tox.
#   tools/run-tests.sh            # all envs: py3, functional, pep8, releasenotes
#   tools/run-tests.sh -e py3     # arguments go to tox
# Needs Python 3.11+ and pip; as root it also prepares the local MariaDB and
# PostgreSQL servers (tools/test-setup.sh). The functional tests install a
# real Ironic into .ironic/venv by themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -m tox --version >/dev/null 2>&1; then
    echo "run-tests: installing tox"
    python3 -m pip install --quiet --disable-pip-version-check 'tox>=4'
fi
bash tools/test-setup.sh
exec python3 -m tox "$@"
