"""mkdocs hooks (`hooks:` in mkdocs.yml): the parts of the documentation made from the code at
build time, so that none of them is a hand-kept copy.

A page asks for one with a marker line: `<!-- generated: api-reference -->` (the HTTP API
reference, written by `sidecar.api.reference_pages` from the OpenAPI document a sidecar builds: the
generator of the sidecar's own `GET /api` page), `<!-- generated: layers -->` (the import-linter
contracts in pyproject.toml) or `<!-- generated: code-map -->` (every module and its docstring's
first sentence). And one check: every environment variable the package names appears on the
configuration page; a missing one is a warning, which `mkdocs build --strict` makes an error.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mkdocs.plugins import get_plugin_logger

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sidecar"
CONFIG_PAGE = "configuration.md"
VARIABLE = re.compile(r"^(?:(?:SIDECAR|SLEEVE)_[A-Z0-9_]*[A-Z0-9]|TTYD_PORT)$")
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)

log = get_plugin_logger("sidecar-docs")


# ---- the HTTP API reference ------------------------------------------------------------------


def api_reference() -> str:
    """The reference of a sidecar with both tokens set (so that the document says who may call
    each route), built the way `sidecar run` builds it, without starting anything."""
    from sidecar.agent.registry import load_registry
    from sidecar.api import reference, reference_pages
    from sidecar.api.app import OPENAPI, create_app
    from sidecar.config import Config
    from sidecar.core.events import EventBus
    from sidecar.process.supervisor import Supervisor

    config = Config(sleeve_name="docs", cli="shell", token="t", view_token="v")
    app = create_app(Supervisor(config, load_registry(None), EventBus()))
    return reference_pages.markdown(reference.read(json.loads(app[OPENAPI])))


# ---- the layers --------------------------------------------------------------------------------


def _contracts() -> list[dict[str, Any]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        contracts: list[dict[str, Any]] = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return contracts


def _about(dotted: str) -> str:
    """The first sentence of a module's or package's docstring, by its dotted name."""
    path = ROOT.joinpath(*dotted.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return first_sentence(_docstring(source)) if source.is_file() else ""


def _layer_row(number: int, layer: str, container: str) -> list[str]:
    from sidecar.api.reference_pages import md_text

    independent = "|" in layer
    names = [n.strip() for n in re.split(r"[|:]", layer)]
    if len(names) == 1:
        siblings = ""
    elif independent:
        siblings = "independent: none imports another"
    else:
        siblings = "may import each other"
    about = "<br>".join(f"`{n}`: " + md_text(_about(f"{container}.{n}"), cell=True) for n in names)
    return [str(number), about, siblings]


def layers() -> str:
    lines: list[str] = []
    for contract in _contracts():
        lines += [f"**{contract['name']}** (contract `{contract['id']}`)", ""]
        if contract["type"] == "layers":
            (container,) = contract["containers"]
            lines += [
                f"Inside `{container}`, top to bottom; each layer may import only the layers "
                "below it:",
                "",
                "| layer | modules | siblings |",
                "|---|---|---|",
            ]
            lines += [
                "| " + " | ".join(_layer_row(i, layer, container)) + " |"
                for i, layer in enumerate(contract["layers"], 1)
            ]
            lines.append("")
        elif contract["type"] == "forbidden":
            sources = ", ".join(f"`{m}`" for m in contract["source_modules"])
            forbidden = ", ".join(f"`{m}`" for m in contract["forbidden_modules"])
            indirect = not contract.get("allow_indirect_imports")
            how = "directly or through another module" if indirect else "directly"
            lines += [f"{sources} must not import ({how}): {forbidden}.", ""]
        elif contract["type"] == "independence":
            modules = ", ".join(f"`{m}`" for m in contract["modules"])
            lines += [f"{modules}: none of these imports another of them.", ""]
        else:  # a kind this page does not know how to say: the build must not hide it
            kind = contract["type"]
            log.warning("architecture: contract %s of type %s is not shown", contract["id"], kind)
        for ignored in contract.get("ignore_imports", ()):
            lines += [f"- allowed exception: `{ignored}`"]
        if contract.get("ignore_imports"):
            lines.append("")
    return "\n".join(lines)


# ---- the code map ------------------------------------------------------------------------------


def first_sentence(doc: str | None) -> str:
    text = " ".join((doc or "").split())
    return re.split(r"(?<=\.)\s+(?=[A-Z`])", text, maxsplit=1)[0]


def _docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))


def _packages(top: Path) -> Iterator[Path]:
    yield top
    for sub in sorted(p for p in top.iterdir() if (p / "__init__.py").is_file()):
        yield from _packages(sub)


def code_map() -> str:
    from sidecar.api.reference_pages import md_text

    lines: list[str] = []
    for package in _packages(PACKAGE):
        dotted = ".".join(package.relative_to(ROOT).parts)
        lines += [f"### `{dotted}`", "", first_sentence(_docstring(package / "__init__.py")), ""]
        lines += ["| module | its job |", "|---|---|"]
        for module in sorted(package.glob("*.py")):
            if module.name != "__init__.py":
                about = md_text(first_sentence(_docstring(module)), cell=True)
                lines.append(f"| `{module.stem}` | {about} |")
        lines.append("")
    return "\n".join(lines)


# ---- the environment variables ---------------------------------------------------------------


def variables() -> set[str]:
    """Every variable name the package spells out (configuration, client, launcher)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(VARIABLE.findall(node.value))
    return names


def check_variables(markdown: str) -> None:
    for name in sorted(variables()):
        if f"`{name}`" not in markdown:
            log.warning("%s does not document the environment variable %s", CONFIG_PAGE, name)


# ---- the hooks -----------------------------------------------------------------------------------

GENERATORS: dict[str, Callable[[], str]] = {
    "api-reference": api_reference,
    "layers": layers,
    "code-map": code_map,
}


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == CONFIG_PAGE:
        check_variables(markdown)

    def generated(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            log.warning("%s: no generator named %r", page.file.src_uri, name)
            return match.group(0)
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)
