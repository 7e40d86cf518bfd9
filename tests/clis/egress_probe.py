"""A CLI that uses the network the way most tools do: through the proxy its environment names.

`egress_probe.py REPORT URL...`: writes REPORT (JSON) with its proxy variables and, for each
URL, what urllib (which honours HTTP_PROXY and NO_PROXY) got back, and what a program ignoring
the variables gets: a direct TCP connection to the first URL's address, UDP (a DNS query) and
IPv6; then waits for a signal. `$API_KEY` in a URL is that variable's value (a secret's
placeholder). Standard library only.
"""

import errno
import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request

report_path, *urls = sys.argv[1:]
# `$API_KEY` in a URL: what the CLI's environment holds there (a secret's placeholder).
urls = [url.replace("$API_KEY", os.environ.get("API_KEY", "")) for url in urls]
NAMES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "NODE_USE_ENV_PROXY")
env = {n: os.environ.get(n) for n in (*NAMES, *(n.lower() for n in NAMES[:4]))}
results = []
for url in urls:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            results.append([answer.status, answer.read().decode()])
    except urllib.error.HTTPError as exc:
        results.append([exc.code, exc.read().decode()])
    except OSError as exc:
        results.append([0, str(exc)])


def attempt(action):
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


first = urllib.parse.urlsplit(urls[0])
direct = {
    "tcp": attempt(lambda: socket.create_connection((first.hostname, first.port), 5).close()),
    "udp": attempt(
        lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"\0", ("127.0.0.1", 53))
    ),
    "ipv6": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()),
}
tmp = report_path + ".tmp"
with open(tmp, "w") as fh:
    json.dump({"env": env, "results": results, "direct": direct}, fh)
os.replace(tmp, report_path)
signal.pause()
