"""The API tokens: from the environment or from files (the Docker/Kubernetes secrets
convention), and handed across init's re-exec (with where notifications go) so that no readable
environment keeps them.

`os.environ.pop` changes nothing the kernel shows: /proc/<pid>/environ is the block the process
was started with. So a sidecar given a token in its environment starts itself again at once
(same pid, so PID 1 stays PID 1) with that variable gone, the values passed through an
inherited memfd that the new image reads and closes before anything is forked.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Collection, Mapping
from typing import NoReturn

#: The admin token's variable and the read-only (view) token's; each may name a file instead
#: (`<var>_FILE`).
TOKEN_VARS = ("SIDECAR_TOKEN", "SIDECAR_VIEW_TOKEN")
TOKEN_VAR, VIEW_TOKEN_VAR = TOKEN_VARS
#: Kept out of every environment block the CLI could read, like the tokens: where notifications
#: go (an ntfy topic's URL, or a webhook's, is often the only key to it).
HIDDEN_VARS = (*TOKEN_VARS, "SIDECAR_NOTIFY_WEBHOOK", "SIDECAR_NOTIFY_NTFY")
#: Internal: the descriptor of the memfd holding the tokens across the re-exec.
HANDOVER_VAR = "SIDECAR_TOKENS_FD"
MEMFD_NAME = "sidecar-tokens"
MAX_TOKEN_BYTES = 4096


class TokenError(ValueError):
    """A token or token file is unusable; the message names the variable."""


def check_token(var: str, value: str, limit: int = MAX_TOKEN_BYTES) -> str:
    """`value` when it has no control character (a CR, LF or NUL would split a header line)
    and is at most `limit` bytes."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        msg = f"{var} must not contain control characters or line breaks"
        raise TokenError(msg)
    if len(value.encode("utf-8", "surrogateescape")) > limit:
        msg = f"{var} is longer than {limit} bytes"
        raise TokenError(msg)
    return value


def read_token_file(var: str, path: str, limit: int = MAX_TOKEN_BYTES) -> str:
    """The token in `path` (at most `limit` bytes), one trailing newline stripped. Never blocks:
    a FIFO or a device is refused after an O_NONBLOCK open, not read. Symlinks are followed
    (Kubernetes mounts each secret key as a symlink into a timestamped directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        msg = f"{var}: {path} does not exist"
        raise TokenError(msg) from None
    except OSError as exc:
        msg = f"{var}: cannot read {path}: {exc.strerror}"
        raise TokenError(msg) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            msg = f"{var}: {path} is a directory, not a file holding the token"
            raise TokenError(msg)
        if not stat.S_ISREG(mode):
            msg = f"{var}: {path} is not a regular file (a FIFO, a socket or a device)"
            raise TokenError(msg)
        data = os.read(fd, limit + 3)
    except OSError as exc:
        msg = f"{var}: cannot read {path}: {exc.strerror}"
        raise TokenError(msg) from None
    finally:
        os.close(fd)
    if len(data) > limit + 2:  # room for a CRLF
        msg = f"{var}: {path} is larger than {limit} bytes; it must hold one value"
        raise TokenError(msg)
    data = data.removesuffix(b"\n").removesuffix(b"\r")
    if not data.strip():
        msg = f"{var}: {path} is empty"
        raise TokenError(msg)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        msg = f"{var}: {path} is not UTF-8 text"
        raise TokenError(msg) from None
    return check_token(var, text, limit)


def token_file(env: Mapping[str, str], var: str) -> tuple[str, str] | None:
    """The variable `<var>_FILE` and the file it names, when it names one."""
    path = env.get(f"{var}_FILE")
    return None if path is None or path.strip() == "" else (f"{var}_FILE", path)


def resolve(env: Mapping[str, str], var: str) -> str | None:
    """`var` from the environment, or from the file `<var>_FILE` names; never both."""
    value = env.get(var)
    value = None if value is None or value.strip() == "" else value
    named = token_file(env, var)
    if value is not None and named is not None:
        msg = f"{var} and {var}_FILE are both set; set one of them"
        raise TokenError(msg)
    if named is not None:
        return read_token_file(*named)
    return None if value is None else check_token(var, value)


# ---- the handover across exec -----------------------------------------------------------------


def in_environment(env: Mapping[str, str], extra: Collection[str] = ()) -> bool:
    """Whether `env` holds a hidden variable, or one of `extra` (the secrets' `from_env`)."""
    return any(var in env for var in (*HIDDEN_VARS, *extra))


def reexec_without_tokens(env: Mapping[str, str], extra: Collection[str] = ()) -> NoReturn:
    """Start this program again in this process, the hidden variables (and `extra`) moved
    into a memfd."""
    hidden = (*HIDDEN_VARS, *extra)
    payload = json.dumps({var: env[var] for var in hidden if var in env}).encode()
    fd = os.memfd_create(MEMFD_NAME, 0)  # no MFD_CLOEXEC: the new image must inherit it
    os.write(fd, payload)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    clean = {k: v for k, v in env.items() if k not in hidden}
    clean[HANDOVER_VAR] = str(fd)
    # sys.orig_argv is exactly how this interpreter was started (`sidecar`, `python -m ...`).
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], clean)  # noqa: S606


def take_over(env: dict[str, str], extra: Collection[str] = ()) -> dict[str, str]:
    """The tokens (and the variables of `extra`) a previous image of this process handed over
    (removing the descriptor's variable from `env` and os.environ); {} when there are none."""
    raw = env.pop(HANDOVER_VAR, None)
    os.environ.pop(HANDOVER_VAR, None)
    if raw is None or not raw.isdigit():
        return {}
    fd = int(raw)
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return {}
    # Only a memfd of ours: a stray variable must not make us read stdin or a socket.
    if not target.startswith(f"/memfd:{MEMFD_NAME}"):
        return {}
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = json.loads(b"".join(chunks) or b"{}")
    wanted = {*HIDDEN_VARS, *extra}
    return {k: v for k, v in data.items() if k in wanted and isinstance(v, str)}
