"""The registry of AI CLIs the sidecar can run: one knowledge object per CLI package (the
built-ins below, and the packages SIDECAR_CLI_PACKAGES names), plus a YAML file that adds or
overrides entries. A CLI is always an argv list (never a shell string).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sidecar.agent.clis import claude_code, codex, gemini_cli, opencode, shell
from sidecar.agent.knowledge import NAME_RE, STATE_SOURCES, CLIDef, Knowledge
from sidecar.config import ConfigError
from sidecar.core.contract import StateSource
from sidecar.security.acting import Owner, acting

__all__ = ["BUILTINS", "CLIDef", "Knowledge", "load_registry", "packages"]

#: The CLIs the sidecar knows, one line per package (in the order a slot mounts their homes).
BUILTINS: tuple[Knowledge, ...] = (
    claude_code.CLI,
    shell.CLI,
    codex.CLI,
    gemini_cli.CLI,
    opencode.CLI,
)
KEYS = ("command", "resume", "env", "prompt", "state", "prompt_pattern")


def packages(names: Iterable[str], workspace: Path) -> tuple[Knowledge, ...]:
    """The knowledge objects (`CLI`) of the CLI packages `names` (SIDECAR_CLI_PACKAGES: the
    sidecar's own environment, which the agent cannot write). Each is imported from the
    sidecar's own Python path, never from the workspace, where the agent could plant one."""
    found = []
    for name in names:
        # Where the top-level package lies is known before any of its code runs.
        for part in (name.partition(".")[0], name):
            _outside(part, workspace, f"SIDECAR_CLI_PACKAGES: {name}")
        try:
            module = importlib.import_module(name)
        except ConfigError:
            raise  # its declaration contradicts itself: the line says where
        except Exception as exc:  # anything its code raises: one line, exit 2, not a traceback
            msg = f"SIDECAR_CLI_PACKAGES: {name}: importing it failed: {exc!r}"
            raise ConfigError(msg) from None
        knowledge = getattr(module, "CLI", None)
        if not isinstance(knowledge, Knowledge):
            msg = f"SIDECAR_CLI_PACKAGES: {name} has no `CLI` (a sidecar.agent.knowledge.Knowledge)"
            raise ConfigError(msg)
        found.append(knowledge)
    return tuple(found)


def _outside(module: str, workspace: Path, where: str) -> None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        msg = f"{where}: cannot be imported ({exc})"
        raise ConfigError(msg) from None
    if spec is None or spec.origin is None:
        msg = f"{where}: no module {module} on the sidecar's Python path"
        raise ConfigError(msg)
    origin = Path(spec.origin).resolve()
    if origin.is_relative_to(workspace.resolve()):
        msg = f"{where}: {origin} is in the workspace, which the agent can write"
        raise ConfigError(msg)


def _builtins(login_shell: str, extra: Iterable[Knowledge]) -> dict[str, CLIDef]:
    return {k.name: k.entry(login_shell) for k in (*BUILTINS, *extra)}


def _argv(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        msg = f"{where} must be a non-empty list of strings (an argv, not a shell line)"
        raise ConfigError(msg)
    if any("\x00" in a for a in value) or value[0] == "" or "=" in value[0]:
        msg = f"{where}: no NUL bytes, and a non-empty program name without '='"
        raise ConfigError(msg)
    return tuple(value)


def _parse_entry(name: Any, body: Any, source: str, known: tuple[Knowledge, ...]) -> CLIDef:
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
    # A `claude` (`codex`, ...) of the user's own is still that CLI: its knowledge goes with it.
    program = Path(command[0]).name
    knowledge = next((k for k in known if not k.login_shell and k.program == program), None)
    state = _state(body.get("state", "activity"), knowledge, known, where)
    pattern = _prompt_pattern(body.get("prompt_pattern"), where)
    return CLIDef(
        name,
        command,
        resume,
        env,
        prompt=prompt,
        state=state,
        knowledge=knowledge,
        prompt_pattern=pattern,
    )


def _state(
    value: Any, knowledge: Knowledge | None, known: Iterable[Knowledge], where: str
) -> StateSource:
    if value not in STATE_SOURCES:
        msg = f"{where}.state must be one of {', '.join(STATE_SOURCES)}"
        raise ConfigError(msg)
    # The sidecar installs only the hooks, and reads only the event streams, of the CLIs whose
    # packages declare them.
    if value == "hooks" and (knowledge is None or knowledge.hooks is None):
        names = ", ".join(sorted(f"`{k.program}`" for k in known if k.hooks is not None))
        msg = f"{where}.state: hooks needs a CLI whose hooks it knows ({names})"
        raise ConfigError(msg)
    if value == "events" and (knowledge is None or knowledge.events is None):
        names = ", ".join(f"{k.name} (command `{k.program}`)" for k in known if k.events)
        msg = f"{where}.state: events needs {names}"
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


def load_registry(
    config_file: Path | None,
    login_shell: str = "/bin/bash",
    extra: tuple[Knowledge, ...] = (),
    reader: Owner | None = None,
) -> dict[str, CLIDef]:
    """Built-ins and `extra` (the packages of SIDECAR_CLI_PACKAGES: `packages`), then the YAML
    file's entries (which add or override by name). The file is read acting as `reader` (it may
    be the user's own, private to it); nothing else is, since an import made while acting as a
    user who cannot see the interpreter's library fails."""
    registry = _builtins(login_shell, extra)
    known = (*BUILTINS, *extra)
    if config_file is None:
        return registry
    source = str(config_file)
    try:
        with acting(reader):
            text = config_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"SIDECAR_CLI_CONFIG: cannot read {source}: {exc}"
        raise ConfigError(msg) from None
    import yaml  # here: `sleeve` reads the built-ins without a YAML file

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
        entry = _parse_entry(name, body, f"SIDECAR_CLI_CONFIG: {source}", known)
        registry[entry.name] = entry
    return registry
