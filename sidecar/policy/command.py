"""What a shell command line can be read as, for the policy's `command` regexes: whether it is one
simple command (what an `allow` rule may match), and its normalised forms (what a `deny` or `ask`
rule also matches: whitespace collapsed, quotes and escapes removed, each command of a list or a
substitution on its own, wrappers and `VAR=` prefixes dropped, a `sh -c` script read again).

It is not a shell parser: it reads a line the way a person skimming it would, bounded in size and
depth, so that the obvious disguises of a denied command do not slip past a rule.
"""

from __future__ import annotations

import os
import re
import shlex

# Characters of a command read (reading costs ~5 us a character). A longer command is never
# allowed by a `command` rule, and a `deny` or `ask` rule that could apply to it sends it to a
# person (`sidecar.policy.rules`): it is not read in part.
MAX_COMMAND = 8 * 1024
MAX_FORMS = 64  # forms kept of one command (a line of many `;` lists is bounded)
MAX_DEPTH = 3  # `sh -c` scripts read again, nested at most this deep

# Anything that makes a line more than one simple command, or makes what runs differ from what
# it says: lists and pipes, substitutions, subshells, redirections, expansions, escaped newlines.
_COMPOUND = re.compile(r"[;&|`$<>(){}\n\r\\]")
# Where one command of a line ends and another begins (lists, pipes, substitutions, subshells).
_SEPARATORS = re.compile(r"&&|\|\||[;&|\n\r`]|\$\(|<\(|>\(|[()]")
_OPERATORS = frozenset("();<>|&")  # what shlex's punctuation_chars splits off
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Commands that run their arguments as a command.
_WRAPPERS = frozenset(
    {"sudo", "env", "command", "builtin", "exec", "nohup", "time", "nice", "doas", "stdbuf"}
)
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish", "ash", "busybox"})


def is_simple(command: str) -> bool:
    """One simple command with nothing a shell would expand, chain or redirect: the only kind an
    `allow` rule's regex can vouch for (quotes are fine; `$`, `;`, `|`, `&`, backquotes,
    parentheses, braces, `<`, `>`, backslashes and newlines are not)."""
    return not _COMPOUND.search(command)


def _words(segment: str) -> list[str]:
    """The words a shell would make of `segment` (quotes and escapes removed); whitespace-split
    when the quoting does not balance."""
    try:
        return shlex.split(segment, comments=False, posix=True)
    except ValueError:
        return segment.split()


def _unwrapped(words: list[str]) -> list[str]:
    """`words` without leading `VAR=value` assignments and wrappers (`sudo`, `env`, `nohup` ...,
    with the wrapper's own options), the command's name without its directory."""
    at = 0
    while at < len(words):
        word = words[at]
        if _ASSIGNMENT.match(word) or (at and words[at - 1] in _WRAPPERS and word.startswith("-")):
            at += 1
        elif os.path.basename(word) in _WRAPPERS:
            words = [*words[:at], os.path.basename(word), *words[at + 1 :]]
            at += 1
        else:
            break
    rest = words[at:]
    if rest:
        rest[0] = os.path.basename(rest[0]) or rest[0]
    return rest


def _script(words: list[str]) -> str | None:
    """The script of `sh -c SCRIPT` (any shell, `-c` among combined flags such as `-lc`), or of
    `eval ARGS`."""
    if not words:
        return None
    if words[0] == "eval":
        return " ".join(words[1:])
    if words[0] not in _SHELLS:
        return None
    for at, word in enumerate(words[1:], 1):
        if word == "--" or not word.startswith("-"):
            return None
        if not word.startswith("--") and "c" in word[1:] and at + 1 < len(words):
            return words[at + 1]
    return None


def forms(command: str) -> list[str]:
    """The command as given, then its normalised forms, each once, at most MAX_FORMS."""
    out: dict[str, None] = {}
    _add_forms(command, out, 0)
    return list(out)[:MAX_FORMS]


def _segments(command: str) -> list[list[str]]:
    """The words of each simple command in `command`: read with quotes (operators inside them
    are text), then read blind to quotes (a quote that does not balance, an operator the first
    reading kept in a word)."""
    text = command.replace("\n", " ; ").replace("\r", " ; ").replace("`", " ; ")
    out: list[list[str]] = []
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for token in lexer:
            if token and all(c in _OPERATORS for c in token):
                out.append(current)
                current = []
            else:
                current.append(token.removesuffix("$"))
        out.append(current)
    except ValueError:
        pass
    out += [_words(part) for part in _SEPARATORS.split(command)]
    return [words for words in out if words]


def _add_forms(command: str, out: dict[str, None], depth: int) -> None:
    joined = command.replace("\\\n", "")  # a line continued with a backslash is one line
    out.setdefault(command, None)
    out.setdefault(" ".join(joined.split()), None)
    for words in _segments(joined):
        if len(out) >= MAX_FORMS:
            return
        out.setdefault(" ".join(words), None)
        plain = _unwrapped(words)
        if plain:
            out.setdefault(" ".join(plain), None)
        script = _script(plain)
        if script is not None and depth < MAX_DEPTH:
            _add_forms(script, out, depth + 1)
