"""At start, before the CLI: none of `Config.trusted_paths` may be a place the CLI can change,
and none of `Config.credential_files` one it can read.

One-uid mode (and a root CLI): the egress fence keeps them, but Landlock denies a path by
granting all around it, so one in the workspace or the CLI's HOME would take from the CLI the
right to make entries there: refused. With SIDECAR_USER the kernel's ownership keeps them, so
that user must neither own nor be let write them or a directory above them, nor read a
credential file by its mode.
"""

from __future__ import annotations

import os
from pathlib import Path

from sidecar.config import Config
from sidecar.config.read import ConfigError
from sidecar.security.reach import changeable_by, readable_by
from sidecar.security.users import User


def _agent_places(config: Config) -> list[tuple[str, Path]]:
    """The workspace and the CLI's HOME, as the kernel resolves them (a HOME of / is left out:
    the fence splits / in any case, and a CLI makes nothing there)."""
    home = config.cli_home or config.child_env.get("HOME")
    places = [("the workspace", config.workspace)]
    if home:
        places.append(("the CLI's HOME", Path(home)))
    resolved = [(what, Path(os.path.realpath(place))) for what, place in places]
    return [(what, place) for what, place in resolved if place != Path("/")]


def check(config: Config) -> None:
    """ConfigError naming the variable, the path and who can change it, for the first trusted
    path the CLI could change."""
    places = _agent_places(config)
    for name, path in config.trusted_paths:
        real = Path(os.path.realpath(path))
        for what, place in places:
            if real.is_relative_to(place) or place.is_relative_to(real):
                msg = (
                    f"{name}: {path} overlaps {what} {place}; the agent can write there. "
                    "Keep the sidecar's files out of the CLI's places"
                )
                raise ConfigError(msg)
        if config.user is not None:
            _out_of_reach(config.user, name, path, (name, path) in config.credential_files)


def _out_of_reach(user: User, name: str, path: Path, private: bool) -> None:
    """ConfigError when `user` can change `path`, or read it when it is `private`."""
    why = changeable_by(user, path)
    if why is not None:
        msg = (
            f"{name}: {path} can be changed by the CLI's user {user.spec}: {why}. "
            "Make it and every directory above it root's, not writable by that user"
        )
        raise ConfigError(msg)
    why = readable_by(user, path) if private else None
    if why is not None:
        msg = f"{name}: {path} holds a credential the CLI's user {user.spec} can read: {why}. "
        msg += "Make it root's and 0600 (or 0400)"
        raise ConfigError(msg)
