"""A sidecar started as one unprivileged uid (the restricted pod's shape, `setpriv --reuid`) on
a host whose venv interpreter lives under root's 0700 home: the wrapper argv for it."""

from __future__ import annotations

UID = GID = 23456  # no passwd entry on purpose
# The venv's interpreter lives under root's 0700 home, which another uid cannot enter: in a
# private mount namespace of the sidecar's, /root is an empty 0755 tmpfs with the interpreter's
# tree bound back in (an OS seam: the image has its Python in /usr).
MOUNTS = (
    'd=$(mktemp -d); mount --bind /root "$d"; mount -t tmpfs -o mode=0755 tmpfs /root; '
    'mkdir /root/.pyenv; mount --bind "$d/.pyenv" /root/.pyenv; exec "$@"'
)
OPEN_PYTHON = ("unshare", "--mount", "--propagation", "private", "--", "sh", "-ec", MOUNTS, "sh")
ONE_UID = ("setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups",
           "--inh-caps=-all", "--bounding-set=-all", "--")  # fmt: skip
