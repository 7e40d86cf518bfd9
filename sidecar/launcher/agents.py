"""What each running sleeve's agent is doing, for `sleeve ps`: the `agent` part of its `/status`
and, while it waits, the permission requests its `/approvals` lists, asked with the sleeve's own
token, every sleeve at once under one short deadline, so a sleeve that does not answer shows `?`
(and why) and never holds `ps` up or fails it. urllib only.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.launcher.state import Run

UNKNOWN = "?"  # the agent's state when the sleeve does not tell it
DEADLINE = 1.5  # seconds for all sleeves together: a sleeve answers /status in milliseconds
MAX_BODY = 1 << 20  # bytes of a /status answer read (it is a few hundred)
MAX_STATE = 16  # characters of a state name shown (the contract's longest is 8)
MAX_REASON = 300  # characters of a reason kept before the table cuts it to the terminal
MAX_FIELD = 64  # characters of a request's id, tool or time kept (the sidecar's ids are 12)


@dataclass(frozen=True)
class Pending:
    """A permission request the agent waits on (`sleeve approve RUN ID` answers it)."""

    id: str
    tool: str
    summary: str
    since: str


@dataclass(frozen=True)
class Agent:
    state: str  # the contract's state name, or UNKNOWN
    reason: str | None  # what it waits for; for UNKNOWN, why it is not known
    approvals: tuple[Pending, ...] = ()


def printable(text: str, limit: int) -> str:
    """One line a terminal shows as it is: the sleeve's text may carry escapes or bidi controls
    (a reason quotes the agent's own command), so everything not printable becomes a space."""
    cleaned = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def parse(body: object) -> Agent:
    agent = body.get("agent") if isinstance(body, dict) else None
    state = agent.get("state") if isinstance(agent, dict) else None
    if not isinstance(agent, dict) or not isinstance(state, str) or not state:
        return Agent(UNKNOWN, "no agent in its /status")
    reason = agent.get("reason")
    shown = printable(reason, MAX_REASON) if isinstance(reason, str) else ""
    return Agent(printable(state, MAX_STATE), shown or None)


def _text(item: dict[str, object], key: str, limit: int) -> str:
    value = item.get(key)
    return printable(value, limit) if isinstance(value, str) else ""


def _pending(body: object) -> tuple[Pending, ...]:
    listed = body.get("approvals") if isinstance(body, dict) else None
    return tuple(
        Pending(
            _text(item, "id", MAX_FIELD),
            _text(item, "tool", MAX_FIELD),
            _text(item, "summary", MAX_REASON),
            _text(item, "since", MAX_FIELD),
        )
        for item in (listed if isinstance(listed, list) else [])
        if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]
    )


def get_json(port: int, token: str | None, path: str, timeout: float) -> object:
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - fixed http://127.0.0.1 URL
        return json.loads(resp.read(MAX_BODY))


def ask(port: int, token: str | None, timeout: float) -> Agent:
    """One sleeve's agent, from http://127.0.0.1:PORT/status (never raises)."""
    try:
        body = get_json(port, token, "/status", timeout)
    except urllib.error.HTTPError as exc:
        why = " (no token recorded for it)" if exc.code == 401 and not token else ""
        return Agent(UNKNOWN, f"/status answered {exc.code}{why}")
    except urllib.error.URLError as exc:  # refused, unreachable, timed out while connecting
        return Agent(UNKNOWN, f"no answer: {printable(str(exc.reason), 80)}")
    except (OSError, ValueError) as exc:  # timed out or cut off while answering; not JSON
        return Agent(UNKNOWN, f"no answer: {printable(str(exc) or type(exc).__name__, 80)}")
    return parse(body)


def with_approvals(agent: Agent, port: int, token: str | None, timeout: float) -> Agent:
    """`agent` with the requests its sleeve's /approvals lists, when it waits (never raises:
    a sleeve that does not tell, an older one without /approvals among them, keeps its state)."""
    if agent.state != "waiting":
        return agent
    try:
        listed = _pending(get_json(port, token, "/approvals", timeout))
    except (OSError, ValueError):  # HTTP errors and timeouts are OSErrors; not JSON
        return agent
    return dataclasses.replace(agent, approvals=listed)


def agents(runs: Sequence[Run], deadline: float = DEADLINE) -> dict[str, Agent]:
    """The agent of every active run with a port, by run id, asked in parallel: those that
    have not answered by the deadline are UNKNOWN. The threads are daemons: one still waiting
    on a sleeve that does not answer ends with the process, never holding it up."""
    asked = [r for r in runs if r.active and r.port]
    found: dict[str, Agent] = {}

    def one(run: Run) -> None:
        assert run.port is not None
        end = time.monotonic() + deadline
        found[run.id] = agent = ask(run.port, run.token, deadline)
        left = end - time.monotonic()
        if left > 0:
            found[run.id] = with_approvals(agent, run.port, run.token, left)

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in asked]
    for thread in threads:
        thread.start()
    end = time.monotonic() + deadline
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    late = Agent(UNKNOWN, f"no answer within {deadline:g} s")
    return {r.id: found.get(r.id, late) for r in asked}
