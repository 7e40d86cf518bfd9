"""The registry of AI CLIs the sidecar can run: built-ins plus a YAML file that adds or overrides.
A CLI is always an argv list (never a shell string); what each CLI keeps on disk and how it
reports its state live in its own module (`sidecar.agent.clis.claude_code`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml

from sidecar.config import ConfigError
from sidecar.core.contract import StateSource

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
STATE_SOURCES: tuple[str, ...] = get_args(StateSource)
# The programs whose screens the sidecar knows (`sidecar.agent.screen_source.RECOGNIZERS`).
SCREENS = {
    "claude": "claude-code",
    "codex": "codex",
    "gemini": "gemini-cli",
    "opencode": "opencode",
}
# The knowledge names whose hooks the sidecar installs (`sidecar.agent.hook_source.HOOK_CLIS`).
HOOK_SCREENS = frozenset({"claude-code", "codex", "gemini-cli"})
KEYS = ("command", "resume", "env", "prompt", "state", "prompt_pattern")


# `resume` is the argv used when the CLI is started again in the same workspace (resleeve,
# self-healing, a hard resleeve with history). `prompt` marks an interactive prompt that takes
# typed lines (inbox notices); `state` says how the agent's state is known
# (`sidecar.agent.machine`): `hooks` (the CLI's own hooks), `events` (opencode's server),
# `activity` (pane output) or `none`. `screen` names whose
# knowledge reads the CLI's screen (`sidecar.agent.screen_source.RECOGNIZERS`): a CLI the sidecar
# knows, else `generic`, told the CLI's input prompt by `prompt_pattern` when the YAML gives it.
@dataclass(frozen=True)
class CLIDef:
    name: str
    command: tuple[str, ...]
    resume: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # Resume only when the CLI has history for this workspace (claude --continue fails without).
    resume_needs_history: bool = False
    prompt: bool = False  # takes typed lines: inbox notices are typed into it
    state: StateSource = "activity"
    screen: str = "generic"
    prompt_pattern: re.Pattern[str] | None = None

    def argv(self, *, resume: bool, has_history: bool) -> tuple[str, ...]:
        """The argv to run. `resume` asks for the resume argv (resleeve, restart, self-heal).
        A CLI whose history can be checked resumes exactly when it has history, first start
        included (a hard resleeve: a new container with the same history)."""
        if self.resume is None:
            return self.command
        if self.resume_needs_history:
            return self.resume if has_history else self.command
        return self.resume if resume else self.command


def _builtins(login_shell: str) -> dict[str, CLIDef]:
    defs = [
        # claude-code's session arguments (--session-id/--resume/--continue) and --settings
        # come from sidecar.agent.clis.claude_code; `resume` is what it does without hooks.
        CLIDef(
            "claude-code",
            ("claude",),
            ("claude", "--continue"),
            resume_needs_history=True,
            prompt=True,
            state="hooks",
            screen="claude-code",
        ),
        # gemini-cli's session arguments (--session-id/--resume) and its hook settings come
        # from sidecar.agent.clis.gemini_cli; `resume` is what it does without hooks.
        CLIDef(
            "gemini-cli",
            ("gemini",),
            ("gemini", "--resume", "latest"),
            prompt=True,
            state="hooks",
            screen="gemini-cli",
        ),
        # opencode's --port/--session arguments and its server's password come from
        # sidecar.agent.clis.opencode; `resume` is what it does while no session id is known.
        CLIDef(
            "opencode",
            ("opencode",),
            ("opencode", "--continue"),
            prompt=True,
            state="events",
            screen="opencode",
        ),
        # codex's hooks and `resume <id>` come from sidecar.agent.clis.codex; `resume` is its
        # fallback.
        CLIDef(
            "codex",
            ("codex",),
            ("codex", "resume", "--last"),
            prompt=True,
            state="hooks",
            screen="codex",
        ),
        CLIDef("shell", (login_shell, "-l")),
    ]
    return {d.name: d for d in defs}


def _argv(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        msg = f"{where} must be a non-empty list of strings (an argv, not a shell line)"
        raise ConfigError(msg)
    if any("\x00" in a for a in value) or value[0] == "" or "=" in value[0]:
        msg = f"{where}: no NUL bytes, and a non-empty program name without '='"
        raise ConfigError(msg)
    return tuple(value)


def _parse_entry(name: Any, body: Any, source: str) -> CLIDef:
    if not isinstance(name, str) or not NAME_RE.match(name):
        msg = f"{source}: CLI name {name!r} must match {NAME_RE.pattern}"
        raise ConfigError(msg)
    if not isinstance(body, dict):
        msg = f"{source}: clis.{name} must be a mapping with a 'command' list"
        raise ConfigError(msg)
    unknown = set(body) - set(KEYS)
    if unknown:
        allowed = ", ".join(KEYS)
        msg = f"{source}: clis.{name} has unknown keys {sorted(unknown)}; allowed: {allowed}"
        raise ConfigError(msg)
    where = f"{source}: clis.{name}"
    command = _argv(body.get("command"), f"{where}.command")
    resume = None
    if body.get("resume") is not None:
        resume = _argv(body["resume"], f"{source}: clis.{name}.resume")
    env_raw = body.get("env") or {}
    if not isinstance(env_raw, dict):
        msg = f"{source}: clis.{name}.env must be a mapping of names to values"
        raise ConfigError(msg)
    env: dict[str, str] = {}
    for key, value in env_raw.items():
        if not isinstance(key, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            msg = f"{source}: clis.{name}.env key {key!r} is not a valid variable name"
            raise ConfigError(msg)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            msg = f"{source}: clis.{name}.env.{key} must be a string or a number"
            raise ConfigError(msg)
        env[key] = str(value)
    prompt = body.get("prompt", False)
    if not isinstance(prompt, bool):
        msg = f"{source}: clis.{name}.prompt must be true or false"
        raise ConfigError(msg)
    state = _state(body.get("state", "activity"), command, where)
    pattern = _prompt_pattern(body.get("prompt_pattern"), where)
    # A `claude` (`codex`, ...) of the user's own is still that CLI on screen.
    screen = SCREENS.get(Path(command[0]).name, "generic")
    return CLIDef(
        name,
        command,
        resume,
        env,
        prompt=prompt,
        state=state,
        screen=screen,
        prompt_pattern=pattern,
    )


def _state(value: Any, command: tuple[str, ...], where: str) -> StateSource:
    if value not in STATE_SOURCES:
        msg = f"{where}.state must be one of {', '.join(STATE_SOURCES)}"
        raise ConfigError(msg)
    if value == "hooks" and SCREENS.get(Path(command[0]).name) not in HOOK_SCREENS:
        # The sidecar installs only the hooks of the CLIs it knows.
        known = ", ".join(f"`{p}`" for p, n in sorted(SCREENS.items()) if n in HOOK_SCREENS)
        msg = f"{where}.state: hooks needs a CLI whose hooks it knows ({known})"
        raise ConfigError(msg)
    if value == "events" and Path(command[0]).name != "opencode":
        # The only event stream the sidecar reads is opencode's server's.
        msg = f"{where}.state: events needs opencode (command `opencode`)"
        raise ConfigError(msg)
    state: StateSource = value
    return state


def _prompt_pattern(value: Any, where: str) -> re.Pattern[str] | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        msg = f"{where}.prompt_pattern must be a regular expression (a non-empty string)"
        raise ConfigError(msg)
    try:
        return re.compile(value)
    except re.error as exc:
        msg = f"{where}.prompt_pattern is not a valid regular expression: {exc}"
        raise ConfigError(msg) from None


def load_registry(config_file: Path | None, login_shell: str = "/bin/bash") -> dict[str, CLIDef]:
    """Built-ins, then the YAML file's entries (which add or override by name)."""
    registry = _builtins(login_shell)
    if config_file is None:
        return registry
    source = str(config_file)
    try:
        text = config_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"SIDECAR_CLI_CONFIG: cannot read {source}: {exc}"
        raise ConfigError(msg) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}, line {mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        msg = f"SIDECAR_CLI_CONFIG: malformed YAML at {where}: {problem}"
        raise ConfigError(msg) from None
    if data is None:
        return registry
    if not isinstance(data, dict) or not isinstance(data.get("clis"), dict):
        msg = f"SIDECAR_CLI_CONFIG: {source} must be a mapping with a 'clis' mapping at the top"
        raise ConfigError(msg)
    for name, body in data["clis"].items():
        entry = _parse_entry(name, body, f"SIDECAR_CLI_CONFIG: {source}")
        registry[entry.name] = entry
    return registry
