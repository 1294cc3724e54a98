#!/usr/bin/env bash
# Prepare the local MariaDB/MySQL and PostgreSQL servers for the DB tests,
# the way OpenStack projects do: a user "openstack_citest" (password the
# same) that may create and drop databases. The tests create a randomly
# named database per run and drop it afterwards.
#
# Also installs Debian's galera-4 and rsync when missing: the Galera test
# (tests/functional/test_galera.py) starts a three-node cluster of its own
# on loopback, with mariadbd, libgalera_smm.so and rsync state transfers.
#
# Idempotent. Starts a server that is installed but not running.
# Environment: DB_ROOT_USER (root), DB_ROOT_PW (empty), PG_SUPERUSER
# (postgres), DB_HOST (127.0.0.1).
set -euo pipefail

DB_ROOT_USER=${DB_ROOT_USER:-root}
DB_ROOT_PW=${DB_ROOT_PW:-}
PG_SUPERUSER=${PG_SUPERUSER:-postgres}
DB_HOST=${DB_HOST:-127.0.0.1}
CITEST=openstack_citest

on_ci() { [[ "${CI:-}" =~ ^(1|true|yes|TRUE|True)$ ]]; }

# A server we cannot administer: on CI a failure; elsewhere a warning, and
# the DB tests of that backend skip, saying how to enable them.
unusable() {  # unusable NAME
    if on_ci; then
        echo "test-setup: cannot log in to $1 as its administrator (CI=true)" >&2
        exit 1
    fi
    echo "test-setup: cannot log in to $1 as its administrator; its tests will skip" >&2
}

wait_for() {  # wait_for NAME COMMAND...
    local name=$1; shift
    for _ in $(seq 1 30); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    echo "test-setup: $name did not come up" >&2
    return 1
}

mysql_root() {
    mysql -u"$DB_ROOT_USER" ${DB_ROOT_PW:+-p"$DB_ROOT_PW"} -h "$DB_HOST" "$@"
}

setup_mysql() {
    if ! command -v mysql >/dev/null; then
        echo "test-setup: no mysql client; skipping MariaDB/MySQL" >&2
        return 0
    fi
    if ! mysql_root -e 'SELECT 1' >/dev/null 2>&1 && [ -x /usr/sbin/mariadbd ]; then
        echo "test-setup: starting MariaDB"
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
        wait_for MariaDB mysql_root -e 'SELECT 1' || true
    fi
    if ! mysql_root -e 'SELECT 1' >/dev/null 2>&1; then
        unusable MariaDB/MySQL
        return 0
    fi
    mysql_root <<SQL
CREATE USER IF NOT EXISTS '$CITEST'@'%' IDENTIFIED BY '$CITEST';
CREATE USER IF NOT EXISTS '$CITEST'@'localhost' IDENTIFIED BY '$CITEST';
GRANT ALL PRIVILEGES ON *.* TO '$CITEST'@'%';
GRANT ALL PRIVILEGES ON *.* TO '$CITEST'@'localhost';
FLUSH PRIVILEGES;
SQL
    echo "test-setup: MariaDB/MySQL user $CITEST ready"
}

psql_super() {
    psql -h "$DB_HOST" -U "$PG_SUPERUSER" -v ON_ERROR_STOP=1 -q "$@"
}

setup_postgresql() {
    if ! command -v psql >/dev/null; then
        echo "test-setup: no psql client; skipping PostgreSQL" >&2
        return 0
    fi
    if ! psql_super -c 'SELECT 1' >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
        echo "test-setup: starting PostgreSQL"
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
        wait_for PostgreSQL psql_super -c 'SELECT 1' || true
    fi
    if ! psql_super -c 'SELECT 1' >/dev/null 2>&1; then
        unusable PostgreSQL
        return 0
    fi
    psql_super <<SQL
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$CITEST') THEN
    CREATE ROLE $CITEST LOGIN CREATEDB PASSWORD '$CITEST';
  ELSE
    ALTER ROLE $CITEST LOGIN CREATEDB PASSWORD '$CITEST';
  END IF;
END
\$\$;
SQL
    if ! psql_super -tAc "SELECT 1 FROM pg_database WHERE datname = '$CITEST'" | grep -q 1; then
        psql_super -c "CREATE DATABASE $CITEST OWNER $CITEST"
    fi
    echo "test-setup: PostgreSQL role $CITEST ready"
}

GALERA_LIBRARY=${GALERA_LIBRARY:-/usr/lib/galera/libgalera_smm.so}

setup_galera() {
    local missing=()
    [ -e "$GALERA_LIBRARY" ] || missing+=(galera-4)
    command -v rsync >/dev/null || missing+=(rsync)
    if [ ${#missing[@]} -eq 0 ]; then
        echo "test-setup: galera-4 and rsync present"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        if on_ci; then
            echo "test-setup: missing ${missing[*]} and cannot install them (CI=true)" >&2
            exit 1
        fi
        echo "test-setup: missing ${missing[*]} (apt-get install galera-4 rsync);" \
             "the Galera test will skip" >&2
        return 0
    fi
    echo "test-setup: installing ${missing[*]}"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y galera-4 rsync
}

setup_mysql
setup_postgresql
setup_galera
