"""What the agent tries against the files it must not read or change, and in its own places:
argv[1] is a JSON list of [op, path]; prints a JSON object "op path" -> "ok" or the errno's
name (or, as a sidecar's CLI, writes it to the file argv[2]). Each op leaves things as they
were when it succeeds (a rename is renamed back), but `unlink`."""

import errno
import json
import os
import sys
from collections.abc import Callable


def append(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"")
    os.close(fd)


def read(path: str) -> None:
    with open(path, "rb") as fh:
        fh.read(1)


def create(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def rename_away(path: str) -> None:
    os.rename(path, path + ".away")
    os.rename(path + ".away", path)


OPS: dict[str, Callable[[str], None]] = {
    "append": append,
    "create": create,
    "mkdir": os.mkdir,
    "read": read,
    "rename": rename_away,
    "unlink": os.unlink,
}
results: dict[str, str] = {}
for op, path in json.loads(sys.argv[1]):
    try:
        OPS[op](path)
    except OSError as exc:
        results[f"{op} {path}"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    else:
        results[f"{op} {path}"] = "ok"
if len(sys.argv) > 2:
    with open(sys.argv[2] + ".part", "w") as out:
        json.dump(results, out)
    os.rename(sys.argv[2] + ".part", sys.argv[2])
else:
    print(json.dumps(results))
