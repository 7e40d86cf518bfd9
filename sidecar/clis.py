"""The registry of AI CLIs the sidecar can run: built-ins plus a YAML file that adds or overrides.

A CLI is always an argv list (never a shell string); `resume` is the argv used when the CLI is
started again in the same workspace (resleeve, self-healing, a hard resleeve with history).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sidecar.config import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class CLIDef:
    name: str
    command: tuple[str, ...]
    resume: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # Resume only when the CLI has history for this workspace (claude --continue fails without).
    resume_needs_history: bool = False

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
        CLIDef("claude-code", ("claude",), ("claude", "--continue"), resume_needs_history=True),
        CLIDef("gemini-cli", ("gemini",)),
        CLIDef("opencode", ("opencode",), ("opencode", "--continue")),
        CLIDef("codex", ("codex",), ("codex", "resume", "--last")),
        CLIDef("shell", (login_shell, "-l")),
    ]
    return {d.name: d for d in defs}


def claude_has_history(workspace: Path, home: Path, config_dir: Path | None) -> bool:
    """Whether Claude Code has a conversation for `workspace` (its projects/<encoded cwd>/)."""
    base = config_dir if config_dir is not None else home / ".claude"
    # Claude Code names a project's history folder after its cwd with every
    # character outside [A-Za-z0-9] replaced by '-'.
    encoded = re.sub(r"[^A-Za-z0-9]", "-", str(workspace))
    folder = base / "projects" / encoded
    try:
        return any(p.suffix == ".jsonl" for p in folder.iterdir())
    except OSError:
        return False


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
    unknown = set(body) - {"command", "resume", "env"}
    if unknown:
        allowed = "command, resume, env"
        msg = f"{source}: clis.{name} has unknown keys {sorted(unknown)}; allowed: {allowed}"
        raise ConfigError(msg)
    command = _argv(body.get("command"), f"{source}: clis.{name}.command")
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
    return CLIDef(name, command, resume, env)


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
