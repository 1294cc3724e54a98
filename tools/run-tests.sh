#!/usr/bin/env bash
# Run every test: what a fresh machine needs, then tox.
#   tools/run-tests.sh            # all envs: py3, functional, pep8, releasenotes
#   tools/run-tests.sh -e py3     # arguments go to tox
# Needs Python 3.11+ and pip; as root it also prepares the local MariaDB and
# PostgreSQL servers (tools/test-setup.sh). The functional tests install a
# real Ironic into .ironic/venv by themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

# tox from the system if it has one; else in a private virtualenv, which also
# works where the system Python refuses pip installs (PEP 668).
if python3 -m tox --version >/dev/null 2>&1; then
    tox=(python3 -m tox)
else
    if ! .tox-venv/bin/tox --version >/dev/null 2>&1; then
        echo "run-tests: installing tox into .tox-venv"
        rm -rf .tox-venv
        python3 -m venv .tox-venv
        .tox-venv/bin/pip install --quiet --disable-pip-version-check 'tox>=4'
    fi
    tox=(.tox-venv/bin/tox)
fi
bash tools/test-setup.sh
exec "${tox[@]}" "$@"
