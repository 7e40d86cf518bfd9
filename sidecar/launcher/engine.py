"""The Docker side of the launcher: engine check, one labelled `docker ps` per listing, build.

Only argv lists are run. The build-input checksum and the skip decision are pure so they can
be tested without an engine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sidecar.launcher.fsutil import LauncherError

logger = logging.getLogger(__name__)

INPUTS_LABEL = "sleeve.inputs"
# Seconds a docker call may take: most answer at once, `docker run` may pull, `docker stop`
# waits its grace period first.
_TIMEOUT = 20
_RUN_TIMEOUT = 120
_STOP_MARGIN = 30
_TRY_BWRAP = "; try `--runtime bwrap`"


def _docker(args: list[str], timeout: float = _TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=False, timeout=timeout
    )


def _answered(
    argv: list[str],
    timeout: float,
    hint: str = "",
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a docker `argv`; one that does not answer in `timeout` s is a LauncherError."""
    try:
        done = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            check=False,
            timeout=timeout,
            env=None if env is None else dict(env),
        )
        text = (done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
        return subprocess.CompletedProcess(argv, done.returncode, *text)
    except subprocess.TimeoutExpired as exc:
        what = " ".join(argv[1:3] if argv[1] == "image" else argv[1:2])
        msg = f"runtime docker: `docker {what}` did not answer in {timeout:g} s{hint}"
        raise LauncherError(msg) from exc


def engine_problem() -> str | None:
    """None when a Docker engine answers, else one line saying what is wrong (one call)."""
    if shutil.which("docker") is None:
        return "runtime docker: the docker client is not installed; try `--runtime bwrap`"
    try:
        out = _docker(["version", "--format", "{{.Server.Version}}"], timeout=10)
    except subprocess.TimeoutExpired:
        return f"runtime docker: the Docker engine did not answer in 10 s{_TRY_BWRAP}"
    if out.returncode != 0 or not out.stdout.strip():
        detail = (out.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"runtime docker: the Docker engine is not answering ({detail}){_TRY_BWRAP}"
    return None


def require_engine() -> None:
    problem = engine_problem()
    if problem is not None:
        raise LauncherError(problem)


@dataclass(frozen=True)
class Container:
    name: str
    state: str  # docker's State: created, running, exited, dead, ...
    exit_code: int | None
    labels: Mapping[str, str]


# The labels on a sleeve's container: `docker create` writes them, `docker ps` lists one
# `$SLEEVE_HOME`'s containers by the first and reads the others back to adopt one no record names.
HOME_LABEL = "sleeve.home"
PROJECT_LABEL = "sleeve.project"
SLOT_LABEL = "sleeve.slot"
SLOT_ID_LABEL = "sleeve.slot-id"
PORT_LABEL = "sleeve.port"
CLI_LABEL = "sleeve.cli"
# Only labels whose values we choose are read back; `{{.Labels}}` joins with `,` ambiguously.
LABEL_KEYS = (PROJECT_LABEL, SLOT_LABEL, SLOT_ID_LABEL, PORT_LABEL, CLI_LABEL)
_FORMAT = "\t".join(
    ["{{.Names}}", "{{.State}}", "{{.Status}}", *(f'{{{{.Label "{k}"}}}}' for k in LABEL_KEYS)]
)


def parse_ps(text: str) -> list[Container]:
    """Parse `docker ps -a --format` lines made with `_FORMAT` (pure)."""
    found = []
    width = 3 + len(LABEL_KEYS)
    for line in text.splitlines():
        parts = line.split("\t", width - 1)
        if len(parts) != width:
            continue
        name, state, status, *values = parts
        match = re.match(r"Exited \((-?\d+)\)", status)
        labels = dict(zip(LABEL_KEYS, values, strict=True))
        found.append(Container(name, state, int(match.group(1)) if match else None, labels))
    return found


def home_label(home: Path) -> str:
    """The HOME_LABEL value that tells this `$SLEEVE_HOME`'s containers from others."""
    return hashlib.sha256(os.fsencode(str(home.resolve()))).hexdigest()[:12]


def list_containers(home: Path) -> list[Container] | None:
    """Every container of this `$SLEEVE_HOME`, in one query; None when docker cannot tell."""
    if shutil.which("docker") is None:
        return None
    try:
        out = _docker(
            [
                "ps",
                "--all",
                "--no-trunc",
                "--filter",
                f"label={HOME_LABEL}={home_label(home)}",
                "--format",
                _FORMAT,
            ]
        )
    except subprocess.TimeoutExpired:
        logger.warning("docker ps did not answer; docker sleeves are shown as recorded")
        return None
    if out.returncode != 0:
        logger.debug("docker ps failed: %s", out.stderr.strip())
        return None
    return parse_ps(out.stdout)


def run(argv: list[str], env: Mapping[str, str], stdin: bytes | None = None) -> None:
    """One step of starting a sleeve (`docker create`, `docker cp -`, `docker start`)."""
    out = _answered(argv, _RUN_TIMEOUT, _TRY_BWRAP, env, stdin)
    if out.returncode != 0:
        msg = f"runtime docker: `docker {argv[1]}` failed: {out.stderr.strip()}"
        raise LauncherError(msg)


def stop(name: str, grace: int) -> None:
    out = _answered(["docker", "stop", "--time", str(grace), name], grace + _STOP_MARGIN)
    if out.returncode != 0:
        msg = f"runtime docker: cannot stop {name}: {out.stderr.strip()}"
        raise LauncherError(msg)


def container_state(name: str) -> str | None:
    """docker's State.Status of one container (`running`, `exited`, ...), None if unknown."""
    out = _answered(["docker", "inspect", "--format", "{{.State.Status}}", name], _TIMEOUT)
    return out.stdout.strip() if out.returncode == 0 else None


def remove_stopped(name: str) -> None:
    """Free the name of a finished container; a running one is left alone (no --force)."""
    _answered(["docker", "rm", name], _TIMEOUT, _TRY_BWRAP)


# -- build -----------------------------------------------------------------------------

_SKIP_PARTS = frozenset({"__pycache__", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache"})


def copy_sources(dockerfile_text: str) -> list[str]:
    """Context paths named by COPY/ADD (not `--from=` stage copies), the image's inputs (pure)."""
    sources: list[str] = []
    joined = re.sub(r"\\\n", " ", dockerfile_text)
    for line in joined.splitlines():
        words = line.split()
        if len(words) < 3 or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = words[1:]
        if any(a.startswith("--from") for a in args):
            continue
        args = [a for a in args if not a.startswith("--")]
        sources += args[:-1]  # the last word is the destination
    return sources


def _wanted(path: Path, context: Path) -> bool:
    # Caches never change what the image does; leaving them out keeps the checksum stable.
    return path.suffix != ".pyc" and not _SKIP_PARTS.intersection(path.relative_to(context).parts)


def _files(context: Path, pattern: str) -> Iterable[Path]:
    """The files a COPY source names: a glob relative to the context, dirs taken whole."""
    pattern = pattern.strip("/") or "."
    matches = [context] if pattern in (".", "./") else sorted(context.glob(pattern))
    for match in matches:
        if match.is_dir():
            yield from (p for p in sorted(match.rglob("*")) if p.is_file() and _wanted(p, context))
        elif match.is_file() and _wanted(match, context):
            yield match


def inputs_checksum(context: Path, dockerfile: Path, build_args: Mapping[str, str]) -> str:
    """sha256 over the Dockerfile, every file its COPY/ADD lines take from the context, and
    the build args: equal checksums mean an equal image."""
    digest = hashlib.sha256()
    text = dockerfile.read_text()
    digest.update(b"Dockerfile\0" + hashlib.sha256(text.encode()).digest())
    seen: set[Path] = set()
    for pattern in copy_sources(text):
        for path in _files(context, pattern):
            if path in seen:
                continue
            seen.add(path)
            rel = str(path.relative_to(context)).encode()
            digest.update(rel + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    for key in sorted(build_args):
        digest.update(f"arg:{key}={build_args[key]}\0".encode())
    return digest.hexdigest()


def needs_build(current: str, existing: str | None, *, force: bool) -> bool:
    """Build unless the image already carries this exact inputs checksum (pure)."""
    return force or existing != current


def image_checksum(image: str) -> str | None:
    label = f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}'
    out = _answered(["docker", "image", "inspect", "--format", label, image], _TIMEOUT)
    if out.returncode != 0:
        return None
    value = out.stdout.strip()
    return value if value and value != "<no value>" else None


def build_argv(
    image: str, context: Path, dockerfile: Path, checksum: str, build_args: Mapping[str, str]
) -> list[str]:
    argv = ["docker", "build", "--file", str(dockerfile), "--tag", image]
    argv += ["--label", f"{INPUTS_LABEL}={checksum}", "--network", "host"]
    for key in sorted(build_args):
        argv += ["--build-arg", f"{key}={build_args[key]}"]
    return [*argv, str(context)]
