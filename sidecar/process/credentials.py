"""The secrets of SIDECAR_SECRETS_FILE as a supervisor uses them: the placeholders kept in the
state dir (the CLI's variables), the proxy's substitution of the real values, and the masks
that keep those values out of everything the sidecar says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.config import Config
from sidecar.core import masks
from sidecar.egress import placeholders
from sidecar.egress.substitute import Substitution, Swap


@dataclass(frozen=True)
class Credentials:
    """`env`: each secret's variable set to its placeholder; `substitution`: the proxy's
    Secrets (None without secrets)."""

    env: Mapping[str, str] = field(default_factory=dict)
    substitution: Substitution | None = None


def credentials(config: Config) -> Credentials:
    """The secrets' placeholders (made the first time, then the same ones), and the masks of
    their values installed for this process."""
    if not config.secrets:
        return Credentials()
    kept = placeholders.load(config.paths.placeholders, [s.name for s in config.secrets])
    swaps = [Swap(s.name, kept[s.name].encode(), s.value.encode(), s.hosts) for s in config.secrets]
    masks.install({s.value: s.name for s in config.secrets})
    return Credentials({s.env: kept[s.name] for s in config.secrets}, Substitution(swaps))
