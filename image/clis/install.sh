#!/bin/sh
# Installs one AI CLI exactly as its lock pins it, for scripts/setup --test (into .cache/clis/)
# and for image/Dockerfile (into the image): one installer, so the tests run what the image runs.
#
#   install.sh CLI PREFIX BINDIR [NPM_CACHE]
#
# image/clis/CLI/ holds a package.json with exact versions and its package-lock.json (lockfile
# v3, sha512 integrity per package): `npm ci` installs exactly that tree into PREFIX and fails on
# any tarball whose checksum differs. No install scripts run: the CLIs ship their binaries as
# (optional) per-platform packages, which the lock names. The package.json's `sleeveBin` says
# which files become commands: each is linked (relatively) into BINDIR.
# A stamp in PREFIX holds the hash of what was installed: an unchanged lock installs nothing.
set -eu

if [ "$#" -lt 3 ]; then
    echo "usage: $0 CLI PREFIX BINDIR [NPM_CACHE]" >&2
    exit 2
fi
cli=$1 prefix=$2 bindir=$3 npm_cache=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
src=$here/$cli
if [ ! -f "$src/package-lock.json" ]; then
    known=$(cd "$here" && for d in */package-lock.json; do printf ' %s' "${d%/*}"; done)
    echo "install.sh: no CLI '$cli' in image/clis/ (known:$known)" >&2
    exit 2
fi

stamp=$prefix/.sleeve-stamp
want=$(cat "$0" "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
    exit 0
fi

mkdir -p "$prefix" "$bindir"
prefix=$(cd "$prefix" && pwd) bindir=$(cd "$bindir" && pwd)
rm -f "$stamp"
echo "install.sh: $cli: npm ci from image/clis/$cli/package-lock.json into $prefix" >&2
cp "$src/package.json" "$src/package-lock.json" "$prefix/"
# npm's registry and CA settings come from the caller (npmrc, NPM_CONFIG_*, NODE_EXTRA_CA_CERTS).
npm ci --prefix "$prefix" ${npm_cache:+--cache "$npm_cache"} --ignore-scripts \
    --no-audit --no-fund --no-update-notifier --loglevel=error

# `sleeveBin`: command name -> file in PREFIX (an assignment, so that a failure stops the script)
links=$(node -e '
const bin = require(process.argv[1]).sleeveBin || {};
for (const [name, file] of Object.entries(bin)) console.log(name + " " + file);
' "$prefix/package.json")
echo "$links" | while read -r name file; do
    [ -f "$prefix/$file" ] || { echo "install.sh: $cli: $file is missing after npm ci" >&2; exit 1; }
    ln -sfn "$(realpath -m --relative-to="$bindir" "$prefix/$file")" "$bindir/$name"
done
# Every command must start: each prints its version (`node` is only there to run another).
echo "$links" | while read -r name file; do
    [ "$name" = node ] && continue
    version=$(PATH="$bindir:$PATH" "$bindir/$name" --version 2>&1) || {
        echo "install.sh: $cli: $name --version failed: $version" >&2
        exit 1
    }
    echo "install.sh: $cli: $name $version" >&2
done
echo "$want" > "$stamp"
