"""`SIDECAR_POLICY_FILE` read into a `Policy`: YAML of bounded size with no anchors or aliases (no
expansion bombs), every key checked, regexes and globs compiled here, once. A problem raises
PolicyError saying the file, the line (PyYAML's marks) and what is wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from sidecar.core.files import TooBig, read_limited
from sidecar.egress.allowlist import AllowlistError, Pattern, parse_pattern
from sidecar.policy.paths import GlobError, compile_glob
from sidecar.policy.rules import ACTIONS, DEFAULT_RULE, KINDS, Action, Kind, Match, Policy, Rule

MAX_FILE = 256 * 1024  # bytes a policy file may hold
MAX_RULES = 1000
MAX_NAME = 100
MAX_MESSAGE = 2048  # as POST /approvals' `message`
MAX_REGEX = 1024
MAX_NAMES = 100  # names in a `tool` or `cli` list
TOP_KEYS = ("default", "rules")
RULE_KEYS = ("name", "match", "action", "message")
MATCH_KEYS = ("kind", "cli", "tool", "command", "path", "host")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class PolicyError(ValueError):
    """The policy file is unusable; the message names the file, the line and what is wrong."""


class _Refused(Exception):
    def __init__(self, node_or_mark: Any, what: str) -> None:
        mark = getattr(node_or_mark, "start_mark", node_or_mark)
        super().__init__(what)
        self.line = mark.line + 1 if mark is not None else 0


class NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases: a few lines of aliases can stand for
    billions of nodes (the "billion laughs"), and a policy has no use for them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(event, "anchors and aliases (&name, *name) are not allowed")
        return super().compose_node(parent, index)


def read_policy(path: str | Path) -> Policy:
    """The policy in the file at `path`; PolicyError naming it and what is wrong."""
    try:
        data = read_limited(path, MAX_FILE)
    except OSError as exc:
        msg = f"{path}: cannot read it: {exc.strerror}"
        raise PolicyError(msg) from None
    except TooBig:
        msg = f"{path}: larger than {MAX_FILE // 1024} KiB"
        raise PolicyError(msg) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{path}: not UTF-8 text (byte {exc.start})"
        raise PolicyError(msg) from None
    return parse_policy(text, str(path))


def parse_policy(text: str, source: str) -> Policy:
    """The policy written in `text` (`source`: the file's name, for the messages)."""
    loader = NoAliasLoader(text)
    try:
        node = loader.get_single_node()
        return _policy(loader, node, source)
    except _Refused as exc:
        msg = f"{source}{f':{exc.line}' if exc.line else ''}: {exc}"
        raise PolicyError(msg) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        msg = f"{source}{line}: not valid YAML: {exc.problem or exc.context}"
        raise PolicyError(msg) from None
    except yaml.YAMLError as exc:
        msg = f"{source}: not valid YAML: {exc}"
        raise PolicyError(msg) from None
    except RecursionError:
        msg = f"{source}: nested too deeply"
        raise PolicyError(msg) from None
    finally:
        loader.dispose()


def _mapping(node: Any, what: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A mapping node's value nodes by key: only `keys`, each once."""
    if not isinstance(node, yaml.MappingNode):
        raise _Refused(node, f"{what} must be a mapping")
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if key not in keys:
            raise _Refused(key_node, f"{what}: unknown key {key!r} (one of {', '.join(keys)})")
        if key in out:
            raise _Refused(key_node, f"{what}: {key!r} is given twice")
        out[key] = value_node
    return out


def _string(loader: NoAliasLoader, node: Any, what: str, limit: int) -> str:
    value = loader.construct_object(node) if isinstance(node, yaml.ScalarNode) else None
    if not isinstance(value, str) or not value.strip():
        raise _Refused(node, f"{what} must be a non-empty string")
    if len(value) > limit:
        raise _Refused(node, f"{what} is longer than {limit} characters")
    return value


def _choice(loader: NoAliasLoader, node: Any, what: str, allowed: tuple[str, ...]) -> str:
    value = loader.construct_object(node) if isinstance(node, yaml.ScalarNode) else None
    if value not in allowed:
        raise _Refused(node, f"{what} must be one of {', '.join(allowed)}; got {value!r}")
    return str(value)


def _names(loader: NoAliasLoader, node: Any, what: str) -> frozenset[str]:
    """A name, or a list of names."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    if not items or len(items) > MAX_NAMES:
        raise _Refused(node, f"{what} must be a name or a list of 1 to {MAX_NAMES} names")
    return frozenset(_string(loader, item, what, MAX_NAME) for item in items)


def _policy(loader: NoAliasLoader, node: Any, source: str) -> Policy:
    if node is None:
        raise _Refused(None, "the file is empty; write `rules:` (and `default:`)")
    top = _mapping(node, "the policy", TOP_KEYS)
    default = top.get("default")
    action = "ask" if default is None else _choice(loader, default, "default", ACTIONS)
    listed = top.get("rules")
    if listed is None:
        raise _Refused(node, "the policy has no `rules:` list")
    if not isinstance(listed, yaml.SequenceNode):
        raise _Refused(listed, "rules must be a list of rules (each a mapping: - name: ...)")
    if len(listed.value) > MAX_RULES:
        raise _Refused(listed, f"more than {MAX_RULES} rules")
    rules: list[Rule] = []
    for item in listed.value:
        rule = _rule(loader, item, len(rules) + 1)
        if any(r.name == rule.name for r in rules):
            raise _Refused(item, f"rule {rule.name!r}: another rule has that name")
        rules.append(rule)
    return Policy(tuple(rules), action, source)  # type: ignore[arg-type]  # one of ACTIONS


def _rule(loader: NoAliasLoader, node: Any, number: int) -> Rule:
    fields = _mapping(node, f"rule {number}", RULE_KEYS)
    if "name" not in fields:
        raise _Refused(node, f"rule {number} has no name")
    name = _string(loader, fields["name"], f"rule {number}'s name", MAX_NAME)
    if name == DEFAULT_RULE or not name.isprintable():
        raise _Refused(fields["name"], f"rule {number}: {name!r} cannot name a rule")
    what = f"rule {name!r}"
    if "action" not in fields:
        raise _Refused(node, f"{what} has no action (allow, deny or ask)")
    action: Action = _choice(loader, fields["action"], f"{what}: action", ACTIONS)  # type: ignore[assignment]
    message = None
    if "message" in fields:
        if action != "deny":
            raise _Refused(fields["message"], f"{what}: a message goes with action deny")
        message = _string(loader, fields["message"], f"{what}: message", MAX_MESSAGE)
        if _CONTROL.search(message):
            raise _Refused(fields["message"], f"{what}: the message holds control characters")
    match = _match(loader, fields["match"], what) if "match" in fields else Match()
    return Rule(name, match, action, message, node.start_mark.line + 1)


def _match(loader: NoAliasLoader, node: Any, what: str) -> Match:
    if isinstance(node, yaml.MappingNode) and not node.value:
        return Match()
    fields = _mapping(node, f"{what}: match", MATCH_KEYS)
    kind: Kind | None = None
    if "kind" in fields:
        kind = _choice(loader, fields["kind"], f"{what}: kind", KINDS)  # type: ignore[assignment]
    if kind == "egress" and ({"command", "path", "tool"} & fields.keys()):
        key = next(k for k in ("command", "path", "tool") if k in fields)
        raise _Refused(fields[key], f"{what}: {key} matches tool requests, never kind egress")
    return Match(
        kind=kind,
        cli=_names(loader, fields["cli"], f"{what}: cli") if "cli" in fields else None,
        tool=(
            frozenset(t.lower() for t in _names(loader, fields["tool"], f"{what}: tool"))
            if "tool" in fields
            else None
        ),
        command=_regex(loader, fields["command"], what) if "command" in fields else None,
        path=_glob(loader, fields["path"], what) if "path" in fields else None,
        host=_host(loader, fields["host"], what) if "host" in fields else None,
    )


def _regex(loader: NoAliasLoader, node: Any, what: str) -> re.Pattern[str]:
    text = _string(loader, node, f"{what}: command", MAX_REGEX)
    try:
        return re.compile(text)
    except re.error as exc:
        at = f" at position {exc.pos}" if exc.pos is not None else ""
        raise _Refused(node, f"{what}: command is not a valid regex: {exc.msg}{at}") from None


def _glob(loader: NoAliasLoader, node: Any, what: str) -> re.Pattern[str]:
    try:
        return compile_glob(_string(loader, node, f"{what}: path", 1024))
    except GlobError as exc:
        raise _Refused(node, f"{what}: path {exc}") from None


def _host(loader: NoAliasLoader, node: Any, what: str) -> Pattern:
    try:
        return parse_pattern(f"{what}: host", _string(loader, node, f"{what}: host", 300))
    except AllowlistError as exc:
        raise _Refused(node, str(exc)) from None
