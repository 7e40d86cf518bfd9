"""The toy CLI's hooks: the settings file its program reads (a relay command per event, and the
route the relay posts to), the argv that resumes its conversation by id, and what each event
means for the agent's state."""

from __future__ import annotations

from typing import Any

from sidecar.agent import hook_relay
from sidecar.agent.hooks import SECRET_HEADER, HookEffect, HookLaunch, Hooks, Launched

EVENTS = ("Start", "Prompt", "Ask", "Done")


def launch(start: HookLaunch) -> Launched:
    """Our hooks in a settings file of ours; the pinned conversation resumed by id, else the
    registry's argv (the conversation is learnt from the Start hook)."""
    settings = {
        "hooks": {event: hook_relay.command(start.settings_path, event) for event in EVENTS},
        # Where the relay posts each event, with the launch's secret (never on an argv).
        "sidecar": {"url": start.base_url, "headers": {SECRET_HEADER: start.secret}},
    }
    ours = ("--hooks", str(start.settings_path))
    if start.session_id is not None:
        return Launched(
            (*start.command, "--resume", start.session_id, *ours), settings, start.session_id
        )
    return Launched((*start.argv, *ours), settings, None)


def interpret(event: str, payload: dict[str, Any]) -> HookEffect:
    """What an event says about the agent (pure: the hook source applies it)."""
    raw = payload.get("session_id")
    session = raw if isinstance(raw, str) and raw else None
    if event == "Start":
        return HookEffect("idle", session_id=session)
    if event == "Prompt":
        return HookEffect("working", session_id=session)
    if event == "Ask":
        command = payload.get("command")
        return HookEffect("waiting", f"run: {command}" if isinstance(command, str) else "run")
    if event == "Done":
        return HookEffect("idle")
    return HookEffect(None)


# No hook of the toy's can answer its dialog: it is answered by keys on screen.
HOOKS = Hooks(EVENTS, launch, interpret, reports_at_start=True)
