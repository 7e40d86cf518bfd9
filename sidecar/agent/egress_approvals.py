"""Egress approvals: a proxied request for a host off the allowlist, held by the proxy while an
approval of kind `egress` waits (`SIDECAR_EGRESS_ASK` seconds at most). Requests for the same
host and port while one waits share it; the approvals waiting at once are capped (the rest are
refused at once, saying so); an allow with `remember` adds `host:port` to the list; a request
whose every client went away is withdrawn.
"""

from __future__ import annotations

import asyncio
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
        # (host, port) -> the approval being made or waiting for it; the requests on each.
        self._open: dict[tuple[str, int], asyncio.Task[str]] = {}
        self._waiting: dict[tuple[str, int], int] = {}

    async def ask(self, asked: Asked) -> AskAnswer:
        """The answer to one held request (waits while a person decides)."""
        host = normalise_host(asked.host) or asked.host
        key = (host, asked.port)
        made = self._open.get(key)
        if made is None:
            if len(self._open) >= self.max_pending:
                return AskAnswer(
                    False,
                    reason=f"{len(self._open)} requests for other hosts already wait for a "
                    "person's answer; nothing more is asked until they are answered",
                )
            # A task of its own: a client that goes away must not stop it for the others.
            made = asyncio.get_running_loop().create_task(self._request(asked, host))
            self._open[key] = made
        self.asked += 1
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            approval_id = await asyncio.shield(made)
            answer = await self.approvals.decision(approval_id)
        except Withdrawn as exc:
            return AskAnswer(False, reason=f"the request was withdrawn: {exc}")
        finally:
            self._left(key, made)
        if answer.decision == "deny":
            return AskAnswer(False, reason=answer.message or "a person denied it")
        if answer.remember:
            self.remember(pattern_of(host, asked.port))
        rule = f"policy:{answer.rule}" if answer.by == "policy" else f"approval:{approval_id}"
        return AskAnswer(True, rule=rule)

    async def _request(self, asked: Asked, host: str) -> str:
        peer = await asked.peer()
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
        facts = Facts(kind="egress", tool="egress", cli=self.approvals.cli, host=host,
                      port=asked.port)  # fmt: skip
        approval = self.approvals.request(
            "egress",
            details,
            source="proxy",
            kind="egress",
            facts=facts,
            summary=asked.summary,
            timeout=self.seconds,
        )
        if not self._waiting.get((host, asked.port)):
            self._withdraw(approval.id)  # every request went away while it was made
        return approval.id

    def _left(self, key: tuple[str, int], made: asyncio.Task[str]) -> None:
        """One request stopped waiting (answered, or its client went away); the last one out
        withdraws an approval still waiting: nobody is left to let through."""
        left = self._waiting.get(key, 1) - 1
        if left > 0:
            self._waiting[key] = left
            return
        self._waiting.pop(key, None)
        if self._open.get(key) is made:
            del self._open[key]
        if made.done() and not made.cancelled() and made.exception() is None:
            self._withdraw(made.result())

    def _withdraw(self, approval_id: str) -> None:
        if self.approvals.get(approval_id) is not None:
            self.approvals.withdraw(approval_id, "the client that asked went away")

    @property
    def pending(self) -> int:
        return len(self._open)
