"""The policy as data and the one question asked of it: which rule decides a request. A request is
described by its `Facts` (its kind, the CLI, the tool, the command, the path, the host), taken
from the tool's input as the CLI gave it. First match wins; no match is the policy's default.

`command` regexes are read in two ways (see `sidecar.policy.command`): an `allow` rule matches
only a single simple command, searched as given; `deny` and `ask` rules also match any
normalised form of it, so that extra spaces, quotes, a `;` list or a `$(...)` do not hide it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args
from urllib.parse import urlsplit

from sidecar.core.contract import ApprovalKind
from sidecar.egress.allowlist import Pattern, normalise_host
from sidecar.policy import command as commands

Action = Literal["allow", "deny", "ask"]
ACTIONS: Final[tuple[str, ...]] = get_args(Action)
Kind = ApprovalKind
KINDS: Final[tuple[str, ...]] = get_args(Kind)
DEFAULT_RULE: Final = "default"  # the `rule` of a decision no rule matched

# Keys of a tool's input that hold what it acts on.
COMMAND_KEYS = ("command", "cmd")
PATH_KEYS = ("file_path", "filePath", "filepath", "notebook_path", "path")
URL_KEYS = ("url",)


@dataclass(frozen=True)
class Facts:
    """What a request would do, as the policy sees it."""

    kind: Kind
    tool: str
    cli: str | None = None
    command: str | None = None  # the command line a shell tool would run
    path: str | None = None  # a file tool's path relative to the workspace
    outside: bool = False  # the tool names a path that leads out of the workspace
    host: str | None = None  # the host asked for (egress), or of a tool's URL
    port: int | None = None


@dataclass(frozen=True)
class Match:
    """What a rule's `match` requires (None: anything)."""

    kind: Kind | None = None
    cli: frozenset[str] | None = None
    tool: frozenset[str] | None = None  # lower case: tool names match in any case
    command: re.Pattern[str] | None = None
    path: re.Pattern[str] | None = None
    host: Pattern | None = None

    def holds(self, facts: Facts, action: Action, *, read_command: bool = True) -> bool:
        """Whether every key holds (`read_command` False: every key but `command`)."""
        if self.kind is not None and facts.kind != self.kind:
            return False
        if self.cli is not None and facts.cli not in self.cli:
            return False
        if self.tool is not None and facts.tool.lower() not in self.tool:
            return False
        if read_command and self.command is not None and not self._command(facts.command, action):
            return False
        if self.path is not None and (
            facts.outside or facts.path is None or not self.path.match(facts.path)
        ):
            return False
        if self.host is not None:
            host = normalise_host(facts.host) if facts.host else None
            if host is None or facts.port is None or not self.host.matches(host, facts.port):
                return False
        return True

    def _command(self, command: str | None, action: Action) -> bool:
        assert self.command is not None
        if command is None:
            return False
        if action == "allow":
            return commands.is_simple(command) and self.command.search(command) is not None
        return any(self.command.search(form) for form in commands.forms(command))


@dataclass(frozen=True)
class Rule:
    name: str
    match: Match
    action: Action
    message: str | None = None  # told to the agent on deny
    line: int = 0  # where the rule starts in its file


@dataclass(frozen=True)
class Verdict:
    action: Action
    rule: str  # the rule's name, or DEFAULT_RULE
    message: str | None = None


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    default: Action = "ask"
    source: str = ""  # the file it was read from

    def decide(self, facts: Facts) -> Verdict:
        long = facts.command is not None and len(facts.command) > commands.MAX_COMMAND
        for rule in self.rules:
            if long and rule.match.command is not None:
                # Too long to read whole: never allowed by its text, and a rule that would
                # refuse or ask about it if it said so sends it to a person.
                if rule.action != "allow" and rule.match.holds(
                    facts, rule.action, read_command=False
                ):
                    return Verdict("ask", rule.name)
                continue
            if rule.match.holds(facts, rule.action):
                return Verdict(rule.action, rule.name, rule.message)
        return Verdict(self.default, DEFAULT_RULE)


def _text(tool_input: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = tool_input.get(key)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return " ".join(value)  # an argv
        if isinstance(value, str) and value.strip():
            return value
    return None


def _url_host(url: str | None) -> tuple[str | None, int | None]:
    if url is None:
        return None, None
    try:
        parts = urlsplit(url.strip())
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower())
    except ValueError:
        return None, None
    return parts.hostname, port


def tool_facts(
    tool: str,
    tool_input: Any,
    *,
    cli: str | None,
    screen: bool,
    resolve: Callable[[str], str | None] | None = None,
) -> Facts:
    """The facts of a tool's permission request. `screen`: listed from a dialog on screen, whose
    only text is what the dialog shows (its `dialog` line is the command). `resolve(path)`: the
    path relative to the workspace, None when it leads outside."""
    data: Mapping[str, Any] = tool_input if isinstance(tool_input, Mapping) else {}
    command = _text(data, ("dialog",) if screen else COMMAND_KEYS)
    path = None if screen else _text(data, PATH_KEYS)
    relative = resolve(path) if path is not None and resolve is not None else path
    host, port = _url_host(None if screen else _text(data, URL_KEYS))
    return Facts(
        kind="tool",
        tool=tool,
        cli=cli,
        command=command,
        path=relative,
        outside=path is not None and relative is None,
        host=host,
        port=port,
    )
