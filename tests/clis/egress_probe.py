"""A CLI that uses the network the way most tools do: through the proxy its environment names.

`egress_probe.py REPORT URL...`: writes REPORT (JSON) with its proxy variables and, for each
URL, what urllib (which honours HTTP_PROXY and NO_PROXY) got back; then waits for a signal.
Standard library only.
"""

import json
import os
import signal
import sys
import urllib.error
import urllib.request

report_path, *urls = sys.argv[1:]
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
tmp = report_path + ".tmp"
with open(tmp, "w") as fh:
    json.dump({"env": env, "results": results}, fh)
os.replace(tmp, report_path)
signal.pause()
