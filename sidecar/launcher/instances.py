"""Instances: per-project CLI history under `$SLEEVE_HOME/instances/<sha16>/` (claudebox-bwrap).

The canonical root (the dir holding a repo's main `.git`) keys an instance, so every worktree
of a repo shares one history; `gc` removes instances whose recorded root is gone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.launcher import homes
from sidecar.launcher.fsutil import LauncherError, private_dir, touch_private

logger = logging.getLogger(__name__)

ROOT_FILE = "project-root"


def project_path(raw: str) -> Path:
    """Validate a `--project` argument: it must exist and be a directory. Returns it resolved."""
    path = Path(raw).expanduser()
    if not path.exists():
        msg = f"project path does not exist: {raw!r}"
        raise LauncherError(msg)
    if not path.is_dir():
        msg = f"project path is not a directory: {raw!r}"
        raise LauncherError(msg)
    return path.resolve()


def canonical_root(path: Path) -> Path:
    """The directory holding the main `.git` of the repo at `path`, else `path` resolved."""
    common = git_common_dir(path)
    if common is None:
        return path.resolve()
    # A non-bare repo keeps its common dir in `<root>/.git`; a bare repo *is* its common dir.
    return common.parent if common.name == ".git" else common


def git_common_dir(path: Path) -> Path | None:
    """The git dir shared by every worktree of the repo at `path` (None: not in a repo)."""
    # GIT_DIR and friends in our environment would point git at some other repo.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            env=env,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("git rev-parse failed for %s: %s", path, exc)
        return None
    if out.returncode != 0:
        return None
    # Only the one trailing newline is git's; a path may itself end in a newline.
    raw = out.stdout[:-1] if out.stdout.endswith(b"\n") else out.stdout
    return Path(os.fsdecode(raw)).resolve()


def sha16(root: Path) -> str:
    return hashlib.sha256(os.fsencode(str(root))).hexdigest()[:16]


def instance_dir(home: Path, root: Path) -> Path:
    return home / "instances" / sha16(root)


def ensure_instance(home: Path, root: Path) -> Path:
    """Create the instance for `root` if missing; `project-root` is written once, on creation."""
    path = private_dir(instance_dir(home, root))
    touch_private(path / ROOT_FILE, os.fsencode(str(root)))
    homes.make_instance(path)
    return path


@dataclass(frozen=True)
class Instance:
    sha: str
    path: Path
    root: Path | None  # None: no readable project-root
    root_exists: bool | None  # None: the OS would not say
    size: int
    last_used: float | None


def _read_root(path: Path) -> Path | None:
    """The recorded root; a trailing newline is `echo`'s (claudebox-bwrap writes it so), but
    only the newline: a path may end in spaces."""
    try:
        raw = (path / ROOT_FILE).read_bytes()
    except OSError:
        return None
    raw = raw.removesuffix(b"\n").removesuffix(b"\r") if raw.endswith(b"\n") else raw
    return Path(os.fsdecode(raw)) if raw else None


def _exists(root: Path) -> bool | None:
    """Whether `root` exists; None when the OS will not say (EACCES, ...): unknown is not gone."""
    try:
        os.stat(root)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        logger.debug("cannot stat %s: %s", root, exc)
        return None
    return True


def _usage(path: Path) -> tuple[int, float | None]:
    size, last = 0, None
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            size += st.st_size
            last = st.st_mtime if last is None else max(last, st.st_mtime)
    return size, last


def list_instances(home: Path) -> list[Instance]:
    base = home / "instances"
    if not base.is_dir():
        return []
    found = []
    for entry in sorted(base.iterdir()):
        if entry.is_symlink() or not entry.is_dir():
            continue
        root = _read_root(entry)
        size, last = _usage(entry)
        exists = False if root is None else _exists(root)
        found.append(Instance(entry.name, entry, root, exists, size, last))
    return found


def gc(home: Path, *, dry_run: bool = False) -> list[Path]:
    """Remove instances whose recorded root no longer exists; returns the roots removed.

    Never touches anything outside `$SLEEVE_HOME/instances/`: symlinked entries are refused
    and dirs without a readable `project-root` are skipped with a warning.
    """
    base = home / "instances"
    if not base.is_dir():
        return []
    real_base = base.resolve()
    removed = []
    for entry in sorted(base.iterdir()):
        if entry.is_symlink():
            logger.warning("gc: refusing symlinked instance %s", entry)
            continue
        if not entry.is_dir():
            continue
        if entry.resolve().parent != real_base:
            logger.warning("gc: refusing %s: it resolves outside %s", entry, real_base)
            continue
        root = _read_root(entry)
        if root is None:
            logger.warning("gc: skipping %s: no readable %s", entry, ROOT_FILE)
            continue
        exists = _exists(root)
        if exists is None:
            logger.warning("gc: skipping %s: cannot tell whether %s exists", entry, root)
            continue
        if exists:
            continue
        if not dry_run:
            try:
                shutil.rmtree(entry)
            except OSError as exc:
                msg = f"gc: cannot remove {entry}: {exc.strerror or exc}"
                raise LauncherError(msg) from exc
        removed.append(root)
    return removed


def age(seconds_since_epoch: float | None) -> str:
    """`3m ago` style text for listings."""
    if seconds_since_epoch is None:
        return "never"
    delta = max(0, int(time.time() - seconds_since_epoch))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{delta // size}{unit} ago"
    return f"{delta}s ago"
