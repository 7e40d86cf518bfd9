"""Egress approvals: a proxied request for a host off the allowlist, held by the proxy while an
approval of kind `egress` waits (`SIDECAR_EGRESS_ASK` seconds at most). Requests for the same
host and port while one waits share it; the approvals waiting at once are capped (the rest are
refused at once, saying so); an allow with `remember` adds `host:port` to the list; a request
whose every client went away is withdrawn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sidecar.agent.approvals import Approvals, Withdrawn
from sidecar.egress.allowlist import normalise_host
from sidecar.egress.proxy import AskAnswer, Asked
from sidecar.policy.rules import Facts

MAX_PENDING = 32  # egress approvals waiting at once; more hosts asked for are refused at once


def pattern_of(host: str, port: int) -> str:
    """The allowlist pattern for exactly this host and port."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class EgressApprovals:
    """`remember(pattern)`: add a pattern to the allowlist (an allow with `remember`)."""

    def __init__(
        self,
        approvals: Approvals,
        seconds: float,
        remember: Callable[[str], None],
        *,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.approvals = approvals
        self.seconds = seconds
        self.remember = remember
        self.max_pending = max_pending
        self.asked = 0  # requests held, for GET /egress
        self._open: dict[tuple[str, int], str] = {}  # (host, port) -> the approval waiting
        self._clients: dict[str, int] = {}  # approval -> requests waiting on it

    async def ask(self, asked: Asked) -> AskAnswer:
        """The answer to one held request (waits while a person decides)."""
        host = normalise_host(asked.host) or asked.host
        key = (host, asked.port)
        approval_id = self._open.get(key)
        if approval_id is None:
            if len(self._open) >= self.max_pending:
                return AskAnswer(
                    False,
                    reason=f"{len(self._open)} requests for other hosts already wait for a "
                    "person's answer; nothing more is asked until they are answered",
                )
            approval_id = self._request(asked, host)
        self.asked += 1
        self._clients[approval_id] = self._clients.get(approval_id, 0) + 1
        try:
            answer = await self.approvals.decision(approval_id)
        except Withdrawn as exc:
            return AskAnswer(False, reason=f"the request was withdrawn: {exc}")
        finally:
            self._done(key, approval_id)
        if answer.decision == "deny":
            return AskAnswer(False, reason=answer.message or "a person denied it")
        if answer.remember:
            self.remember(pattern_of(host, asked.port))
        rule = f"policy:{answer.rule}" if answer.by == "policy" else f"approval:{approval_id}"
        return AskAnswer(True, rule=rule)

    def _request(self, asked: Asked, host: str) -> str:
        peer = asked.peer
        details: dict[str, Any] = {
            "host": asked.host,
            "port": asked.port,
            "how": "proxy",
            "method": asked.method,
            "pid": peer.pid if peer else None,
            "exe": peer.exe if peer else None,
            "argv": list(peer.argv) if peer else None,
            "uid": peer.uid if peer else None,
        }
        approval = self.approvals.request(
            "egress",
            details,
            source="proxy",
            kind="egress",
            facts=Facts(
                kind="egress", tool="egress", cli=self.approvals.cli, host=host, port=asked.port
            ),
            summary=asked.summary,
            timeout=self.seconds,
        )
        if self.approvals.get(approval.id) is not None:  # listed: later asks share it
            self._open[(host, asked.port)] = approval.id
        return approval.id

    def _done(self, key: tuple[str, int], approval_id: str) -> None:
        """One request stopped waiting (answered, or its client went away)."""
        left = self._clients.get(approval_id, 1) - 1
        if left > 0:
            self._clients[approval_id] = left
            return
        self._clients.pop(approval_id, None)
        if self._open.get(key) == approval_id:
            del self._open[key]
        if self.approvals.get(approval_id) is not None:
            # Every client that asked went away: nobody is left to let through.
            self.approvals.withdraw(approval_id, "the client that asked went away")

    @property
    def pending(self) -> int:
        return len(self._open)
