"""What the guarded CLI may read and change in the filesystem: the Landlock rules the egress
guard applies in its child, and the one place that lists the paths behind them.

The trusted side (the sidecar, tmux, ttyd, the pane's waiter, the broker) reads and connects to
things in the state dir; the CLI may change none of them, in any mode: with SIDECAR_USER the
kernel's ownership checks keep the sidecar's own files, but the session dir is the CLI user's
(its tmux and ttyd make their sockets there), and in the one-uid mode (the restricted pod)
everything is one user's. The same holds for the files and dirs it trusts outside the state
dir (`Config.trusted_paths`), and in one-uid mode the CLI reads none of those that hold
credentials (`Config.credential_files`). A root CLI changes nothing outside its own places.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sidecar.core.layout import Layout
from sidecar.security import landlock

#: The files the resolver reads: the proxy resolves the CLI's names, so they are out of reach.
RESOLVER_FILES = tuple(
    Path("/etc", name)
    for name in ("hosts", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf")
)
#: Where a root CLI may change things besides its workspace and HOME: what a user could.
ROOT_WRITABLE = (Path("/tmp"), Path("/var/tmp"), Path("/dev"))  # noqa: S108 - as any user's


@dataclass(frozen=True)
class Fence:
    """`no_access`: neither read nor changed; `no_write`: read, never changed; `write_only`
    (a root CLI): nothing changed but beneath these (None: wherever the kernel lets its uid)."""

    no_access: tuple[Path, ...] = ()
    no_write: tuple[Path, ...] = ()
    write_only: tuple[Path, ...] | None = None

    def argv(self) -> list[str]:
        """The guard's options that carry this fence."""
        out: list[str] = []
        for flag, paths in (
            ("--no-access", self.no_access),
            ("--no-write", self.no_write),
            ("--write-only", self.write_only or ()),
        ):
            for path in paths:
                out += [flag, str(path)]
        return out

    @classmethod
    def of_args(
        cls, no_access: Sequence[str], no_write: Sequence[str], write_only: Sequence[str]
    ) -> Fence:
        return cls(
            tuple(map(Path, no_access)),
            tuple(map(Path, no_write)),
            tuple(map(Path, write_only)) or None,
        )

    def apply(self) -> None:
        """Confine this process (and all it starts), no_new_privs set: one Landlock layer for
        changes, one for reads when something is private. OSError when Landlock refuses."""
        roots = self.write_only if self.write_only is not None else (Path("/"),)
        kept = [*self.no_access, *self.no_write]
        landlock.restrict_files(landlock.FS_CHANGE, landlock.grant_beneath(roots, kept))
        if self.no_access:
            readable = landlock.grant_beneath([Path("/")], self.no_access)
            landlock.restrict_files(landlock.FS_READ_FILE, readable)


def fence_of(
    layout: Layout,
    *,
    one_uid: bool,
    root_cli: bool,
    writable: Iterable[Path] = (),
    trusted: Iterable[Path] = (),
    private: Iterable[Path] = (),
) -> Fence:
    """The fence around a CLI whose state dir is `layout`: `one_uid`, the sidecar and the CLI
    are one user (its private files, and the `private` ones outside the state dir that hold
    credentials, need Landlock: ownership cannot keep them); `root_cli`, the CLI is root and
    changes nothing but beneath `writable` and `ROOT_WRITABLE`. Never changed either: the
    `trusted` files and dirs the sidecar reads and writes outside the state dir (in one-uid
    mode only this keeps them; with SIDECAR_USER ownership does too)."""
    return Fence(
        no_access=(*layout.private_files, *private) if one_uid else (),
        no_write=(layout.state_dir, *RESOLVER_FILES, *trusted),
        write_only=(*writable, *ROOT_WRITABLE) if root_cli else None,
    )


def crowded_temp(kept: Iterable[tuple[str, Path]]) -> list[str]:
    """One warning for each kept path (variable, path) beneath a place every CLI makes its
    temporary files in (`ROOT_WRITABLE`): Landlock keeps a path by granting everything around
    it, so the guarded CLI can make no new entry directly in the directories above it, /tmp
    among them (a CLI that makes its own dir there at its first start fails: Claude Code
    exits 1)."""
    places = [(place, Path(os.path.realpath(place))) for place in ROOT_WRITABLE]
    out = []
    for name, path in kept:
        real = Path(os.path.realpath(path))
        for place, place_real in places:
            if real != place_real and real.is_relative_to(place_real):
                out.append(
                    f"{name} {path} is beneath {place}: the guarded CLI can make no new entry "
                    f"directly in {place}; keep it outside {place}"
                )
    return out
