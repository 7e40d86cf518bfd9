"""Which events of the bus become markers in a recording, and how each reads: what the agent
was doing, what it asked and who answered, what the egress proxy refused, the sleeve's own
moves (resleeves, heals, restarts, the budget)."""

from __future__ import annotations

from sidecar.core import event_shapes as ev


def label(event: ev.Event) -> str | None:  # noqa: C901 - one flat case per kind of event
    """The marker for `event`, None for events a recording does not mark."""
    if isinstance(event, ev.AgentStateEvent):
        return f"{event.state}: {event.reason}" if event.reason else event.state
    if isinstance(event, ev.ApprovalRequested):
        return f"approval {event.id} requested: {event.tool}: {event.summary}"
    if isinstance(event, ev.ApprovalResolved):
        if event.decision is None:
            return f"approval {event.id} withdrawn: {event.reason or 'unanswered'}"
        return f"approval {event.id}: {event.decision} by {event.by}"
    if isinstance(event, ev.EgressDenied):
        return f"egress denied: {event.host}:{event.port} ({event.how})"
    if isinstance(event, ev.Resleeve):
        if event.phase == "started":
            return f"resleeve: {event.previous} -> {event.cli}"
        return f"resleeved: {event.previous} -> {event.cli}"
    if isinstance(event, ev.CliExit):
        return f"CLI exited with {event.exit_code}"
    if isinstance(event, ev.ErrorEvent):
        return f"error: {event.message}"  # a heal: the tmux server died, the session recreated
    if isinstance(event, ev.InboxNotified):
        return f"inbox notice: {', '.join(event.ids)}"
    if isinstance(event, ev.BudgetEvent):
        return f"budget {event.level}: {event.message}"
    if isinstance(event, ev.Completion):
        return f"task done: {event.task}" if event.task else "task done"
    return None
