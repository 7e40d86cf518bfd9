#!/bin/sh
# Puts ttyd at /usr/local/bin/ttyd, verified by SHA-256. Runs inside `docker build`.
# The binary comes from the build context (image/vendor/ttyd.<arch>) when one is there - offline
# builds and networks without GitHub - and is downloaded from upstream's release otherwise.
set -eu
: "${TTYD_VERSION:?}" "${TTYD_SHA256:?}"
case "$(dpkg --print-architecture)" in
    amd64) arch=x86_64 ;;
    arm64) arch=aarch64 ;;
    *) echo "ERROR: no ttyd build for $(dpkg --print-architecture)" >&2; exit 1 ;;
esac
vendored="/tmp/vendor/ttyd.$arch"
url="${TTYD_URL:-https://github.com/tsl0922/ttyd/releases/download/$TTYD_VERSION/ttyd.$arch}"
explain() {
    cat >&2 <<MSG
ERROR: ttyd $TTYD_VERSION: $1
  Either put upstream's binary into the build context at image/vendor/ttyd.$arch
  (sha256 $TTYD_SHA256 for ttyd.x86_64 $TTYD_VERSION),
  or set --build-arg TTYD_URL=<a mirror of ttyd.$arch> (with --build-arg TTYD_SHA256=<its sha256>
  when it is another version or architecture).
MSG
    exit 1
}
if [ -f "$vendored" ]; then
    echo "ttyd: using image/vendor/ttyd.$arch from the build context"
    cp "$vendored" /usr/local/bin/ttyd
else
    echo "ttyd: no image/vendor/ttyd.$arch in the build context; downloading $url"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl ca-certificates >/dev/null
    curl --fail --silent --show-error --location --connect-timeout 15 --max-time 300 \
        --output /usr/local/bin/ttyd "$url" || explain "could not download $url"
fi
echo "$TTYD_SHA256  /usr/local/bin/ttyd" | sha256sum --check --status \
    || explain "sha256 of the binary is $(sha256sum /usr/local/bin/ttyd | cut -d' ' -f1), expected $TTYD_SHA256 (ARG TTYD_SHA256)"
chmod 0755 /usr/local/bin/ttyd
/usr/local/bin/ttyd --version
