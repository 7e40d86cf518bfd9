"""The agent's permission requests (approvals): each is listed under a stable id while it waits,
answered exactly once — through the API, by the timeout policy, or by a person in the CLI's own
terminal, whichever comes first — and then remembered (bounded) so that a late answer is told
who decided. How an answer reaches the CLI is its source's business: a held hook returns it, a
dialog on screen gets keys, the egress proxy lets a held request through; all wait on
`decision()`, which returns only once the decision's audit record is on disk.

The policy (`SIDECAR_POLICY_FILE`) is asked here, where a request becomes an approval, for every
CLI and for egress alike: an `allow` or `deny` rule answers it at once (`by: "policy"`), through
the same channel a person's answer takes, and it is never listed. One exception: a dialog read
off the screen is never allowed by a rule (its text may be cut short, and the keys would go into
a dialog a person may be reading); it is listed for a person instead, and a `deny` rule still
answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import unicodedata
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.contract import ApprovalSource, DecidedBy, Decision, rfc3339
from sidecar.core.text import MAX_REASON
from sidecar.policy.rules import Facts, Kind, Policy, Verdict, tool_facts

log = logging.getLogger(__name__)

REMEMBERED = 256  # resolved requests kept to tell a late answer who decided
# Keys of a tool's input that say what it acts on, most telling first.
SUMMARY_KEYS = ("command", "cmd", "file_path", "filePath", "notebook_path", "path", "url", "dialog")
# Characters that can make a line lie about what it says: bidi embeddings, overrides and
# isolates, marks, zero-width joiners and spaces, the BOM (all of category Cf), and controls.
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})


def clean(text: str, limit: int = MAX_REASON) -> str:
    """`text` as one line a person can trust: control, format (bidi, zero-width) and unassigned
    characters removed, whitespace runs made one space, at most `limit` characters."""
    kept = "".join(
        " " if c.isspace() else c
        for c in text[: limit * 4]
        if c.isspace() or unicodedata.category(c) not in _INVISIBLE
    )
    flat = " ".join(kept.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def summary_of(tool: str, tool_input: Any) -> str:
    """The one line that says what a request would do: the command, the path, the URL."""
    if isinstance(tool_input, dict):
        for key in SUMMARY_KEYS:
            value = tool_input.get(key)
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                value = " ".join(value)  # an argv (Codex's `command`)
            if isinstance(value, str) and value.strip():
                return clean(value)
    if isinstance(tool_input, str) and tool_input.strip():
        return clean(tool_input)
    return clean(tool)


@dataclass(frozen=True)
class Answer:
    decision: Decision
    by: DecidedBy
    message: str | None = None  # told to the agent on deny
    remember: bool = False  # "don't ask again for this" where the CLI offers it
    rule: str | None = None  # the policy rule that decided (`by: "policy"`)


@dataclass
class Approval:
    id: str
    tool: str
    summary: str
    input: Any
    since: str  # RFC 3339
    source: ApprovalSource
    key: str | None = None  # the CLI's own id for the request, where it has one
    kind: Kind = "tool"
    facts: Facts | None = None  # what the policy saw
    rule: str | None = None  # the policy rule that said `ask` (or that was not applied)
    started: float = field(default_factory=time.monotonic)
    answer: Answer | None = None
    withdrawn: str | None = None  # why it went away unanswered
    done: asyncio.Future[Answer] | None = None


class NotFound(LookupError):
    """No request of that id (404)."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(f"no permission request {approval_id!r} is waiting")


class AlreadyAnswered(Exception):
    """The request was answered already (409): `answer` says how, `withdrawn` why it went."""

    def __init__(self, approval_id: str, answer: Answer | None, withdrawn: str | None) -> None:
        self.id = approval_id
        self.answer = answer
        self.withdrawn = withdrawn
        if answer is not None:
            super().__init__(f"approval {approval_id} was answered already: {answer.decision}")
        else:
            super().__init__(f"approval {approval_id} was withdrawn: {withdrawn}")


class Withdrawn(Exception):
    """The request went away unanswered (the turn was interrupted, the CLI exited)."""


Listener = Callable[[Approval, Answer | None], None]  # (request, None) opened; (request, answer)


class Approvals:
    """One per supervisor. `timeout`: SIDECAR_APPROVAL_TIMEOUT (None: wait for a person).
    `policy` decides before a person is asked (None: a person always decides); `cli` is the
    running CLI's name and `resolve(path)` a tool's path relative to the workspace (None:
    outside it), for the policy's facts; `durable()` returns once every decision so far is on
    the audit trail's disk."""

    def __init__(
        self, timeout: float | None, on_change: Listener, *, policy: Policy | None = None
    ) -> None:
        self.timeout = timeout
        self.on_change = on_change  # events, metrics, the audit trail
        self.policy = policy
        self.cli: str | None = None
        self.resolve: Callable[[str], str | None] | None = None
        self.durable: Callable[[], Awaitable[bool]] | None = None
        # Answers every request at once when it says so (the budget is spent); None: no gate.
        self.gate: Callable[[], Answer | None] | None = None
        self._pending: dict[str, Approval] = {}
        self._closed: OrderedDict[str, tuple[Answer | None, str | None]] = OrderedDict()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # For /metrics: requests so far, answers by (decision, by), seconds to an answer, and
        # the policy's decisions by (rule, decision).
        self.requested = 0
        self.decided: Counter[tuple[Decision, DecidedBy]] = Counter()
        self.by_rule: Counter[tuple[str, Decision]] = Counter()
        self.wait_seconds = 0.0

    # ---- what is waiting -------------------------------------------------------------------

    def pending(self) -> list[Approval]:
        return sorted(self._pending.values(), key=lambda a: a.started)

    def get(self, approval_id: str) -> Approval | None:
        return self._pending.get(approval_id)

    def by_key(self, key: str) -> Approval | None:
        return next((a for a in self._pending.values() if a.key == key), None)

    def outcome(self, approval_id: str) -> tuple[Answer | None, str | None] | None:
        """How a request that is no longer waiting went: (its answer, or None and why it was
        withdrawn); None when no such request is remembered."""
        return self._closed.get(approval_id)

    # ---- a source's side ---------------------------------------------------------------------

    def facts(self, tool: str, tool_input: Any, source: ApprovalSource) -> Facts:
        """What the policy sees of a tool's request."""
        return tool_facts(
            tool, tool_input, cli=self.cli, screen=source == "screen", resolve=self.resolve
        )

    def verdict(self, facts: Facts) -> Verdict | None:
        """The policy's verdict on a request (None without a policy)."""
        return self.policy.decide(facts) if self.policy is not None else None

    @staticmethod
    def applies(verdict: Verdict | None, source: ApprovalSource) -> bool:
        """Whether the policy answers (else a person decides: no policy, `ask`, or an `allow`
        of a dialog read off the screen)."""
        if verdict is None or verdict.action == "ask":
            return False
        return not (verdict.action == "allow" and source == "screen")

    def request(
        self,
        tool: str,
        tool_input: Any,
        *,
        source: ApprovalSource,
        key: str | None = None,
        kind: Kind = "tool",
        facts: Facts | None = None,
        summary: str | None = None,
        timeout: float | None = None,
    ) -> Approval:
        """A new permission request (`key`: the CLI's own id for it, if any), decided at once
        by the policy or listed for a person (`timeout`: instead of SIDECAR_APPROVAL_TIMEOUT).
        """
        approval_id = secrets.token_hex(6)
        while approval_id in self._pending or approval_id in self._closed:
            approval_id = secrets.token_hex(6)
        facts = facts or self.facts(tool, tool_input, source)
        approval = Approval(
            id=approval_id,
            tool=clean(tool, 100) or "tool",
            summary=clean(summary) if summary else summary_of(tool, tool_input),
            input=tool_input,
            since=rfc3339(),
            source=source,
            key=key,
            kind=kind,
            facts=facts,
            done=asyncio.get_running_loop().create_future(),
        )
        self.requested += 1
        refusal = self.gate() if self.gate is not None else None
        # A spent budget refuses whatever the rules say.
        verdict = self.verdict(facts) if refusal is None else None
        self._pending[approval_id] = approval
        if verdict is not None and self.applies(verdict, source):
            if verdict.action == "allow":
                self.answer(approval_id, Answer("allow", "policy", rule=verdict.rule))
            else:
                message = (
                    verdict.message or f"Denied by the sidecar's policy (rule {verdict.rule})."
                )
                self.answer(approval_id, Answer("deny", "policy", message, rule=verdict.rule))
            return approval
        approval.rule = verdict.rule if verdict is not None else None
        seconds = timeout if timeout is not None else self.timeout
        if seconds is not None:
            variable = "SIDECAR_APPROVAL_TIMEOUT" if timeout is None else "SIDECAR_EGRESS_ASK"
            self._timers[approval_id] = asyncio.get_running_loop().call_later(
                seconds, self._expired, approval_id, seconds, variable
            )
        log.info("approval %s requested: %s %s", approval_id, approval.tool, approval.summary)
        self.on_change(approval, None)
        if refusal is not None:  # listed and answered: the trail shows what was refused, and why
            self.answer(approval_id, refusal)
        return approval

    async def decision(self, approval_id: str) -> Answer:
        """Wait until it is answered, and its record is on the audit trail's disk. Raises
        Withdrawn if it goes away first."""
        approval = self._pending.get(approval_id)
        if approval is not None and approval.done is not None:
            answer = await asyncio.shield(approval.done)
        elif approval_id not in self._closed:
            raise NotFound(approval_id)
        else:
            first, withdrawn = self._closed[approval_id]
            if first is None:
                raise Withdrawn(withdrawn or "withdrawn")
            answer = first
        if self.durable is not None:
            await self.durable()
        return answer

    def answered_by_terminal(self, approval_id: str, decision: Decision) -> Answer | None:
        """A person answered in the CLI's own UI first. None: it was answered already."""
        with contextlib.suppress(NotFound, AlreadyAnswered):
            return self.answer(approval_id, Answer(decision, "terminal"))
        return None

    def withdraw(self, approval_id: str, why: str) -> None:
        """It went away unanswered (the turn was interrupted, the CLI exited, a resleeve)."""
        approval = self._pending.pop(approval_id, None)
        if approval is None:
            return
        approval.withdrawn = why
        self._forget(approval_id, None, why)
        if approval.done is not None and not approval.done.done():
            approval.done.set_exception(Withdrawn(why))
            approval.done.exception()  # retrieved: nobody may be waiting on it
        log.info("approval %s withdrawn: %s", approval_id, why)
        self.on_change(approval, None)

    def withdraw_all(self, why: str) -> None:
        for approval_id in list(self._pending):
            self.withdraw(approval_id, why)

    # ---- answers -----------------------------------------------------------------------------

    def answer(self, approval_id: str, answer: Answer) -> Answer:
        """Answer a request once. Raises NotFound, or AlreadyAnswered naming the first answer."""
        approval = self._pending.pop(approval_id, None)
        if approval is None:
            if approval_id in self._closed:
                first, withdrawn = self._closed[approval_id]
                raise AlreadyAnswered(approval_id, first, withdrawn)
            raise NotFound(approval_id)
        approval.answer = answer
        self._forget(approval_id, answer, None)
        if approval.done is not None and not approval.done.done():
            approval.done.set_result(answer)
        latency = time.monotonic() - approval.started
        self.decided[answer.decision, answer.by] += 1
        if answer.rule is not None:
            self.by_rule[answer.rule, answer.decision] += 1
        self.wait_seconds += latency
        log.info(
            "approval %s %s by %s after %.3fs: %s %s",
            approval_id,
            answer.decision,
            answer.by,
            latency,
            approval.tool,
            approval.summary,
        )
        self.on_change(approval, answer)
        return answer

    def _expired(self, approval_id: str, seconds: float, variable: str) -> None:
        self._timers.pop(approval_id, None)
        message = (
            f"Nobody answered this permission request within {seconds:g} s ({variable}), "
            "so it was denied."
        )
        with contextlib.suppress(NotFound, AlreadyAnswered):
            self.answer(approval_id, Answer("deny", "timeout", message))

    def _forget(self, approval_id: str, answer: Answer | None, withdrawn: str | None) -> None:
        timer = self._timers.pop(approval_id, None)
        if timer is not None:
            timer.cancel()
        self._closed[approval_id] = (answer, withdrawn)
        while len(self._closed) > REMEMBERED:
            self._closed.popitem(last=False)
