"""The test suite's own rules, read from its files: a test module takes its helpers from the
helper modules (tests/harness.py, tests/proctools.py, ...), never from another test module; and
every sleep in a test or a helper is a deliberate one that says why (`# sleep-ok: why`), but
`sleep(0)`, which waits for no time: it gives the event loop one turn."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def parsed() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(TESTS.rglob("*.py"))]


def imported_modules(tree: ast.Module) -> list[str]:
    """Every module an `import` or `from ... import` names, relative ones left out."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return found


def test_no_test_module_imports_another_test_module() -> None:
    wrong = [
        f"{path.relative_to(TESTS)} imports {module}"
        for path, tree in parsed()
        for module in imported_modules(tree)
        if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert wrong == [], "move the helper to a helper module: " + "; ".join(wrong)


def test_every_sleep_says_why_it_is_not_a_wait() -> None:
    wrong = []
    for path, tree in parsed():
        lines = path.read_text().splitlines()
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name != "sleep" or "# sleep-ok: " in lines[node.lineno - 1]:
                continue
            assert isinstance(node, ast.Call)
            if [ast.unparse(arg) for arg in node.args] != ["0"]:  # sleep(0): one turn of the loop
                wrong.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert wrong == [], "wait on a condition with a deadline (tests/harness.py wait_for): " + (
        ", ".join(wrong)
    )
