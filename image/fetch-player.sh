#!/bin/sh
# fetch-player.sh DEST: the asciinema web player (npm package `asciinema-player`, pinned), whose
# bundle the sidecar serves at /player/ for the dashboard's replays. Its tarball comes from the
# build context (image/vendor/asciinema-player-<version>.tgz) when one is there, else from the
# npm registry with curl (no npm needed); it is checked against the registry's pinned sha512
# integrity, and each file taken from it against its own pinned sha256. Only the two bundle files
# and the licence go into DEST. Used by scripts/setup and image/Dockerfile; idempotent.
set -eu
dest=${1:?usage: fetch-player.sh DEST}
here=$(cd "$(dirname "$0")" && pwd)
PLAYER_VERSION=3.18.0
# The registry's integrity (sha512-5gpt2ipFcy4NKmgkv+c/QXnJ9zMicxqWROCOuJqgwwtiYKM8Qe9hnDOvfqke5bW6M2DW/seO3uQYkQ0xeUUVtw==)
# in hex, for sha512sum
PLAYER_SHA512=e60a6dda2a45732e0d2a6824bfe73f4179c9f73322731a9644e08eb89aa0c30b6260a33c41ef619c33af7ea91ee5b5ba3360d6fec78edee418910d31794515b7
FILES="dist/bundle/asciinema-player.min.js 752c9b528b664f5b16f27c68ba22fc7973d1d6063a1c3e4795a4c8015943acf6
dist/bundle/asciinema-player.css 981fe7bc6042048b2a373b6da297f747e324e90a8b6264e833e3a92cec22dfb9
LICENSE 63422284ed65be54ab38d8a94e7518d27e222fbb26c9ae4cd984c63926e91c12"

installed() {
    echo "$FILES" | while read -r path sum; do
        echo "$sum  $dest/$(basename "$path")" | sha256sum --check --status || exit 1
    done
}
if [ -d "$dest" ] && installed; then
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
vendored="$here/vendor/asciinema-player-$PLAYER_VERSION.tgz"
if [ -f "$vendored" ]; then
    cp "$vendored" "$tmp/player.tgz"
else
    registry=${npm_config_registry:-${NPM_CONFIG_REGISTRY:-https://registry.npmjs.org/}}
    url="${registry%/}/asciinema-player/-/asciinema-player-$PLAYER_VERSION.tgz"
    echo "asciinema-player $PLAYER_VERSION from $url" >&2
    curl --fail --silent --show-error --location --retry 3 --connect-timeout 15 --max-time 300 \
        --output "$tmp/player.tgz" "$url"
fi
echo "$PLAYER_SHA512  $tmp/player.tgz" | sha512sum --check --status || {
    echo "ERROR: asciinema-player $PLAYER_VERSION: the tarball's sha512 is not the pinned one" >&2
    exit 1
}
tar -xzf "$tmp/player.tgz" -C "$tmp"
mkdir -p "$tmp/out"
echo "$FILES" | while read -r path sum; do
    name=$(basename "$path")
    echo "$sum  $tmp/package/$path" | sha256sum --check --status || {
        echo "ERROR: asciinema-player: package/$path is not the pinned file" >&2
        exit 1
    }
    cp "$tmp/package/$path" "$tmp/out/$name"
    chmod 0644 "$tmp/out/$name"
done
mkdir -p "$dest"
cp "$tmp/out/"* "$dest/"
installed
