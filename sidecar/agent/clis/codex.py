"""What the sidecar knows about Codex CLI (0.169): the hooks it installs for the Codex it starts
(`-c` overrides on the argv, never the user's files), what each hook event means, how a
conversation is resumed by id, and how its screen reads (captured in tests/screens/codex/).
All of the sidecar's knowledge of Codex belongs in this module.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.agent import hook_relay
from sidecar.agent.approvals import Answer
from sidecar.agent.hooks import SECRET_HEADER, HookEffect, HookLaunch, Launched, PermissionAsk
from sidecar.agent.screens import Reading, Seen, dialog, nonblank, text_of
from sidecar.core.contract import AgentStateName, InputKey
from sidecar.core.text import one_line
from sidecar.pane.screen import Screen

# ---- on disk -----------------------------------------------------------------------------------


def codex_home(env: Mapping[str, str]) -> Path:
    """Codex's home in the CLI's environment: CODEX_HOME, else ~/.codex."""
    if env.get("CODEX_HOME"):
        return Path(env["CODEX_HOME"])
    return Path(env.get("HOME", "/root")) / ".codex"


def has_session(home: Path, session_id: str) -> bool:
    """Whether Codex keeps the conversation `session_id` (sessions/YYYY/MM/DD/rollout-*-<id>)."""
    try:
        return any((home / "sessions").rglob(f"rollout-*-{session_id}.jsonl"))
    except OSError:
        return False


# ---- hooks -------------------------------------------------------------------------------------
# Codex's hooks are commands (no HTTP hooks), so each event runs `sidecar.agent.hook_relay`, which
# POSTs it to `/hooks/codex/<event>` with the per-launch secret read from our settings file and
# prints the reply. They are added as `-c hooks.<Event>=[...]` overrides (the session-flags
# layer: Codex runs them beside the user's own hooks, which it loads from their own layers), so
# the argv carries the settings file's path, never the secret. Codex runs a hook only once it is
# trusted: the trust goes in the same layer (`-c hooks.state=...`), keyed by the hook's place
# and the hash of its definition, computed as Codex does (sha256 of its canonical JSON). A
# Codex that computes it otherwise shows its "Hooks need review" dialog: `waiting`, on screen.
# SessionStart runs when a conversation starts (the first prompt, or a resume), not at launch.

EVENTS = (
    "SessionStart",
    "UserPromptSubmit",
    "PermissionRequest",
    "PostToolUse",
    "Stop",
    "Interrupt",
)
HOOK_TIMEOUT = 3  # seconds Codex waits for a hook (at most 3 for Interrupt); the relay: 1
# The PermissionRequest hook is held until the request is answered. Codex draws its own
# approval dialog only once the hook returned no decision: until then its screen shows the turn
# at work ("Running hook"). The sidecar releases the hook unanswered a little before Codex's own
# timeout, and the dialog appears for a person.
PERMISSION_TIMEOUT = 600
MAX_HOLD = PERMISSION_TIMEOUT - 10
_SESSION_LAYER = "/<session-flags>/config.toml"  # where Codex files hooks from `-c`
_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def _timeout(event: str) -> int:
    return PERMISSION_TIMEOUT if event == "PermissionRequest" else HOOK_TIMEOUT


def settings(base_url: str, secret: str) -> dict[str, Any]:
    """Our settings file, read by the relay only: an HTTP hook per event (URL, secret, timeout)."""
    return {
        "hooks": {
            event: [
                {
                    "hooks": [
                        {
                            "type": "http",
                            "url": base_url + event,
                            "headers": {SECRET_HEADER: secret},
                            "timeout": _timeout(event),
                        }
                    ]
                }
            ]
            for event in EVENTS
        }
    }


def trust_hash(event: str, handler: Mapping[str, Any]) -> str:
    """The hash Codex trusts a command hook by: its normalized definition as canonical JSON."""
    identity = {"event_name": _SNAKE.sub("_", event).lower(), "hooks": [handler]}
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def toml(value: Any) -> str:
    """`value` as a TOML inline value (a `-c` override's value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string takes JSON's escapes
    if isinstance(value, list):
        return "[" + ",".join(toml(v) for v in value) + "]"
    return "{" + ",".join(f"{json.dumps(str(k))}={toml(v)}" for k, v in value.items()) + "}"


def overrides(settings_path: Path) -> tuple[str, ...]:
    """The `-c` arguments that install our hooks, trusted, for this launch."""
    args: list[str] = []
    state: dict[str, Any] = {}
    for event in EVENTS:
        handler = {
            "type": "command",
            "command": hook_relay.command(settings_path, event),
            "timeout": _timeout(event),
            "async": False,
        }
        args += ["-c", f"hooks.{event}={toml([{'hooks': [handler]}])}"]
        key = f"{_SESSION_LAYER}:{_SNAKE.sub('_', event).lower()}:0:0"
        state[key] = {"trusted_hash": trust_hash(event, handler)}
    return (*args, "-c", f"hooks.state={toml(state)}")


# ---- what an event means ---------------------------------------------------------------------


def interpret(event: str, payload: dict[str, Any]) -> HookEffect:
    """What a hook event says about the agent (pure: the caller applies it)."""
    raw = payload.get("session_id")
    session = raw if isinstance(raw, str) and raw.strip() else None
    if event == "SessionStart":
        return HookEffect(None, session_id=session)  # the prompt that started it says more
    if event in ("UserPromptSubmit", "PostToolUse"):
        return HookEffect("working", session_id=session)
    if event == "PermissionRequest":
        tool = payload.get("tool_name")
        tool = tool if isinstance(tool, str) else "a tool"
        tool_input = payload.get("tool_input")
        command = tool_input.get("command") if isinstance(tool_input, dict) else None
        detail = f": {command}" if isinstance(command, str) and command.strip() else ""
        state: AgentStateName = "waiting"
        return HookEffect(state, one_line(f"permission for {tool}{detail}"), session)
    if event in ("Stop", "Interrupt"):
        return HookEffect("idle", session_id=session)
    return HookEffect(None)


def permission_answer(answer: Answer) -> dict[str, Any]:
    """The held PermissionRequest hook's reply. Codex's hook takes no "remember" (it fails
    closed on `updatedPermissions`): an allow is for this request only."""
    decision: dict[str, Any] = {"behavior": answer.decision}
    if answer.decision == "deny" and answer.message:
        decision["message"] = answer.message
    return {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}}


def approval_keys(decision: str, remember: bool) -> tuple[InputKey, ...]:
    """Keys that answer its approval dialog on screen ("1. Yes, proceed (y)", "2. Yes, and don't
    ask again for commands that start with ...", "3. No, and tell Codex what to do differently
    (esc)"): for a dialog the hook no longer holds (a released hook, a supervisor crash)."""
    if decision == "deny":
        return ("Escape",)
    return ("Down", "Enter") if remember else ("y",)


class CodexHooks:
    """Codex CLI as a `sidecar.agent.hooks.HookCLI`."""

    name = "codex"
    events: tuple[str, ...] = EVENTS
    max_hold = float(MAX_HOLD)
    decides = True
    root_settings = False
    reports_at_start = False

    def launch(self, launch: HookLaunch) -> Launched:
        """Our hooks, no shared background server (it would outlive the CLI and run hooks from
        another launch's config), and the pinned conversation resumed when Codex has it; else
        the registry's argv, the conversation learnt from SessionStart."""
        ours = (*overrides(launch.settings_path), "--no-daemon")
        pinned = launch.session_id
        if pinned is not None and has_session(codex_home(launch.env), pinned):
            argv = (*launch.cli.command, "resume", pinned, *ours)
        else:
            argv, pinned = (*launch.argv, *ours), None
        document = settings(launch.base_url, launch.secret)
        return Launched(argv, document, pinned)

    def interpret(self, event: str, payload: dict[str, Any]) -> HookEffect:
        return interpret(event, payload)

    def permission(self, event: str, payload: dict[str, Any]) -> PermissionAsk | None:
        if event != "PermissionRequest":
            return None
        tool = payload.get("tool_name")
        return PermissionAsk(tool if isinstance(tool, str) else "tool", payload.get("tool_input"))

    def answer(self, answer: Answer, payload: dict[str, Any]) -> dict[str, Any]:
        return permission_answer(answer)


# ---- what its screen shows --------------------------------------------------------------------
# The composer (its input prompt) is a "› " line at the foot of the screen, wrapped or typed
# lines below it indented by two spaces, the cursor in it and at most a few footer lines under
# it ("model · cwd", "? for shortcuts"). The transcript repeats each prompt as a "› " line and
# menus mark their choice with "› 1.", so neither the mark alone nor the footer says "prompt":
# the cursor does (dialogs park it elsewhere). While a turn runs, a status line
# "• Working (3s • esc to interrupt)" stands above the composer, which still takes typing.
# An approval replaces the composer: one of the questions below over "› 1. Yes, proceed (y)".

_COMPOSER = re.compile(r"^› (?!\d+\. )")
_CONTINUED = re.compile(r"^ {2}|^$")
_COMPOSER_ROWS = 12  # the composer grows with typed text; beyond this it scrolls
_FOOTER_ROWS = 4  # lines under the composer: status line, hints
_STATUS = re.compile(r"^\S \S.*\(\d[^)]*esc to interrupt\)\s*$")
_APPROVAL = re.compile(
    r"^\s*(Would you like to (run the following command|make the following edits"
    r"|grant these permissions|send input to the existing terminal)\?"
    r"|Do you want to approve network access to .*\?)\s*$"
)
# Approvals other than a command are taken from the binary's strings, not seen on screen.
_YES = re.compile(r"^›?\s*1\. Yes\b")
_COMMAND = re.compile(r"^\s*\$ (.+)$")
_OPTION = re.compile(r"^[›>]?\s*1\. \S")
_LOGO = re.compile(r"^[\s\u2800-\u28ff]*$")  # its animated logo is drawn in braille
_BANNER = re.compile(r"^\s*Welcome to Codex\b")  # heads every sign-in screen: names none
_SELECTED = re.compile(r"^[›>]\s+")
_ASKED = re.compile(r"^(.*?\w[\w)'\"]*\?)(\s|$)")
_GAP = 2  # blank lines that part a pinned dialog from what scrolled above it


def read_screen(screen: Screen) -> Reading:
    """What Codex CLI's screen shows (see `sidecar.agent.screens`)."""
    lines = list(screen.lines)
    for at, line in enumerate(lines):
        if _APPROVAL.match(line) and any(_YES.match(rest) for rest in lines[at + 1 :]):
            return Reading(Seen.PERMISSION, _approval_reason(lines, at))
    if any(_STATUS.match(line) for line in lines):
        return Reading(Seen.WORKING)
    if _in_composer(screen):
        return Reading(Seen.PROMPT)
    return dialog(lines, title=_title(lines))


def _in_composer(screen: Screen) -> bool:
    lines, row = screen.lines, screen.cursor_row
    if not 0 <= row < len(lines) or screen.cursor_col < 2:
        return False
    if len(nonblank(lines[row + 1 :])) > _FOOTER_ROWS:
        return False
    for top in range(row, max(row - _COMPOSER_ROWS, -1), -1):
        if _COMPOSER.match(lines[top]):
            return True
        if not _CONTINUED.match(lines[top]):
            return False
    return False


def _approval_reason(lines: list[str], at: int) -> str:
    """'shell command: <command>' for a command, else the approval's question."""
    for line in lines[at + 1 :]:
        if _YES.match(line):
            break
        if found := _COMMAND.match(line):
            return f"shell command: {found.group(1).strip()}"
    return text_of(lines[at])


def _title(lines: list[str]) -> str | None:
    """A dialog's question (the last, up to its '?'), else the line above its first choice,
    else its first line; looked for below the widest gap, which parts a dialog pinned to the
    foot of the screen from what scrolled above it."""
    texts = [
        line
        for line in lines[_below_widest_gap(lines) :]
        if text_of(line) and not _LOGO.match(line) and not _BANNER.match(line)
    ]
    asked = [found.group(1) for line in texts if (found := _ASKED.match(text_of(line)))]
    if asked:
        return asked[-1]
    for before, line in itertools.pairwise(texts):
        if _OPTION.match(line):
            return _first_cell(before)
    return _first_cell(texts[0]) if texts else None


def _below_widest_gap(lines: list[str]) -> int:
    """The first line after the widest run of blank lines between lines of text (0: none)."""
    start, widest, blank, text = 0, _GAP, 0, False
    for at, line in enumerate(lines):
        if not line.strip():
            blank += 1
            continue
        if text and blank >= widest:
            start, widest = at, blank
        text, blank = True, 0
    return start


def _first_cell(line: str) -> str:
    """The first of the columns a line is laid out in (parted by two or more spaces), without
    the mark of a selected line."""
    return text_of(re.split(r"\s{2,}", _SELECTED.sub("", line.strip()))[0])
