"""One package per CLI: the registry finds every CLI through its package's knowledge object, and
a package that declares something inconsistent fails as it is imported, with one line naming the
package and the field (never once the sidecar runs)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.agent.clis import claude_code, codex, gemini_cli, opencode, shell
from sidecar.agent.hooks import HookEffect, Hooks, Launched
from sidecar.agent.knowledge import ApprovalKeys, Homes, Knowledge, KnowledgeError, ScreenKnowledge
from sidecar.agent.registry import BUILTINS, load_registry, packages
from sidecar.agent.screens import Reading, Seen
from sidecar.config import Config, ConfigError
from tests.commands import run_until_exit
from tests.harness import Sidecar

KEYS = ApprovalKeys(once=("y",), always=("2",), deny=("n",))


def read(screen: Any) -> Reading:
    return Reading(Seen.PROMPT)


HOOKS = Hooks(
    ("Start", "Ask"),
    lambda start: Launched(start.argv, {}, None),
    lambda event, payload: HookEffect(None),
)


def keys(**changes: Any) -> ScreenKnowledge:
    return ScreenKnowledge(read, frozenset(Seen), replace(KEYS, **changes))


def toy(**changes: Any) -> Knowledge:
    fields: dict[str, Any] = {
        "package": "my_clis.toy",
        "name": "toy",
        "command": ("toy",),
        "state": "hooks",
        "hooks": HOOKS,
        "screen": ScreenKnowledge(read, frozenset(Seen), KEYS),
        "homes": Homes(dirs=(".toy",), project_dirs=(".toy/chats",), sign_in=".toy/auth.json"),
    }
    return Knowledge(**{**fields, **changes})


def test_the_registry_holds_one_entry_per_cli_package() -> None:
    declared = (claude_code, shell, codex, gemini_cli, opencode)
    assert tuple(p.CLI for p in declared) == BUILTINS
    registry = load_registry(None)
    assert list(registry) == ["claude-code", "shell", "codex", "gemini-cli", "opencode"]
    for known in BUILTINS:
        assert registry[known.name].knowledge is known
        assert known.package.startswith("sidecar.agent.clis.")
    assert toy().entry("/bin/sh").knowledge is not None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": "no spaces"}, "name"),
        ({"command": ()}, "command"),
        ({"resume": ("toy", "")}, "resume"),
        ({"history": lambda env, workspace: True}, "history"),
        ({"state": "hooks", "hooks": None}, "state"),
        ({"state": "events"}, "state"),
        ({"hooks": replace(HOOKS, events=("Start", "Ask/2"))}, "hooks.events"),
        ({"hooks": replace(HOOKS, events=())}, "hooks.events"),
        ({"hooks": replace(HOOKS, permission_event="No", max_hold=5.0)}, "hooks.permission_event"),
        ({"hooks": replace(HOOKS, permission_event="Ask")}, "hooks.max_hold"),
        ({"screen": ScreenKnowledge(read, frozenset(Seen))}, "screen.keys"),
        ({"screen": ScreenKnowledge(read, frozenset({Seen.PROMPT}), KEYS)}, "screen.keys"),
        ({"screen": keys(deny=("Del",))}, "screen.keys.deny"),
        ({"screen": keys(once=())}, "screen.keys.once"),
        ({"homes": Homes(dirs=("/etc",))}, "homes"),
        ({"homes": Homes(dirs=(".toy/../..",))}, "homes"),
        ({"homes": Homes(dirs=(".toy",), project_files=(".other/h",))}, "homes"),
        ({"homes": Homes(dirs=(".toy",), seed="toy-credentials")}, "homes.seed"),
    ],
)  # fmt: skip
def test_an_inconsistent_declaration_names_the_package_and_the_field(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(KnowledgeError) as info:
        toy(**changes)
    message = str(info.value)
    assert message.startswith(f"CLI package my_clis.toy: {field}: "), message
    assert "\n" not in message


@pytest.fixture
def on_path(tmp_path: Path) -> Iterator[Path]:
    """A folder on sys.path for packages written by the test (removed again, with them)."""
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith("badcli")]:
        del sys.modules[name]


BAD_PACKAGE = """
from sidecar.agent.knowledge import Knowledge, ScreenKnowledge
from sidecar.agent.screens import Reading, Seen

CLI = Knowledge(
    __name__,
    "bad",
    ("bad",),
    screen=ScreenKnowledge(lambda screen: Reading(Seen.PERMISSION), frozenset(Seen)),
)
"""


def test_a_package_whose_screen_has_no_keys_for_its_dialog_fails_as_it_is_imported(
    on_path: Path,
) -> None:
    (on_path / "badcli").mkdir()
    (on_path / "badcli" / "__init__.py").write_text(BAD_PACKAGE)
    with pytest.raises(KnowledgeError, match=r"^CLI package badcli: screen\.keys: "):
        importlib.import_module("badcli")


def test_sidecar_cli_packages_names_modules_of_the_sidecar_s_own_python(
    on_path: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="not a dotted module path"):
        Config.from_env({"SLEEVE_NAME": "s", "SLEEVE_CLI": "x", "SIDECAR_CLI_PACKAGES": "a/b"})
    config = Config.from_env(
        {
            "SLEEVE_NAME": "s",
            "SLEEVE_CLI": "x",
            "SIDECAR_CLI_PACKAGES": "tests.toycli, tests.toycli",
        }
    )
    assert config.cli_packages == ("tests.toycli",)
    [toy_cli] = packages(config.cli_packages, tmp_path / "workspace")
    assert load_registry(None, extra=(toy_cli,))["toy"].knowledge is toy_cli
    with pytest.raises(ConfigError, match="no module no_such_cli"):
        packages(["no_such_cli"], tmp_path)
    with pytest.raises(ConfigError, match="has no `CLI`"):
        packages(["tests.harness"], tmp_path / "workspace")
    # Anywhere in the workspace: refused before the module is imported.
    (on_path / "badcli").mkdir()
    (on_path / "badcli" / "__init__.py").write_text(BAD_PACKAGE)
    with pytest.raises(ConfigError, match="in the workspace, which the agent can write"):
        packages(["badcli"], on_path)
    assert "badcli" not in sys.modules


def test_the_sidecar_refuses_to_start_with_an_inconsistent_package(
    make_sidecar: Callable[..., Sidecar], on_path: Path
) -> None:
    """Exit 2 with the one line, before anything runs: never a fault once the CLI works."""
    (on_path / "badcli").mkdir()
    (on_path / "badcli" / "__init__.py").write_text(BAD_PACKAGE)
    sc = make_sidecar(cli="bad")
    env = {**sc.env(), "SIDECAR_CLI_PACKAGES": "badcli"}
    env["PYTHONPATH"] = f"{on_path}:{env['PYTHONPATH']}"
    done = run_until_exit([sys.executable, "-m", "sidecar", "run"], env)
    assert done.returncode == 2
    assert done.stderr == (
        "sidecar: CLI package badcli: screen.keys: its screen shows a permission dialog, "
        "and no keys answer it\n"
    )
