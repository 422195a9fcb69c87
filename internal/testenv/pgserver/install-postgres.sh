#!/usr/bin/env bash
# Installs PostgreSQL server binaries (Debian/Ubuntu, apt-get) when initdb is
# found neither on PATH nor under /usr/lib/postgresql/*/bin. Idempotent: does
# nothing when the binaries are already there. Used by .ci/run; the Go package
# internal/testenv/pgserver does the same when it runs as root.
set -euo pipefail

have_initdb() {
	if command -v initdb >/dev/null 2>&1; then
		return 0
	fi
	local d
	for d in /usr/lib/postgresql/*/bin; do
		if [ -x "$d/initdb" ]; then
			return 0
		fi
	done
	return 1
}

if have_initdb; then
	echo "install-postgres: PostgreSQL binaries already present; nothing to do"
	exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		sudo=(sudo)
	else
		echo "install-postgres: initdb not found and not root; run as root: apt-get install postgresql" >&2
		exit 1
	fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-postgres: initdb not found and apt-get unavailable; install the PostgreSQL server binaries (initdb, pg_ctl, postgres) by hand" >&2
	exit 1
fi

echo "install-postgres: installing postgresql with apt-get"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y --no-install-recommends postgresql

if ! have_initdb; then
	echo "install-postgres: apt-get install postgresql finished but initdb is still missing" >&2
	exit 1
fi
echo "install-postgres: done"
