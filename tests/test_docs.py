"""The documentation: the README is a landing page whose links and figures hold, the API
reference is rendered from the OpenAPI document (the site's page and the sidecar's `GET /api`),
and the site's build refuses an environment variable the configuration page does not name.
(`mkdocs build --strict` itself runs in scripts/test.)"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sidecar.agent.registry import load_registry
from sidecar.api import reference, reference_pages
from sidecar.api.app import OPENAPI, create_app
from sidecar.config import Config
from sidecar.core.events import EventBus
from sidecar.process.supervisor import Supervisor
from tests.harness import REPO, Sidecar

TOKEN, VIEW_TOKEN = "docs-admin-token-123", "docs-view-token-456"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def openapi_document(**config: Any) -> dict[str, Any]:
    """The document a sidecar with this configuration serves at /openapi.json."""
    cfg = Config(sleeve_name="docs", cli="shell", **config)
    app = create_app(Supervisor(cfg, load_registry(None), EventBus()))
    document: dict[str, Any] = json.loads(app[OPENAPI])
    return document


def operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, item in document["paths"].items() for method in item]


class Anchors(HTMLParser):
    """The ids a page defines and the in-page links it makes."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: set[str] = set()
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        for name in ("href", "src"):
            target = values.get(name) or ""
            if target.startswith("#"):
                self.links.add(target[1:])
            elif "//" in target:
                self.external.append(target)


# ---- the README ---------------------------------------------------------------------------


def test_readme_is_a_landing_page_whose_links_lead_to_files_of_the_repository() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    targets = [t for t in LINK.findall(readme) if "://" not in t]
    assert "docs/getting-started.md" in targets
    missing = [t for t in targets if not (REPO / t).exists()]
    assert missing == [], f"README links to files that do not exist: {missing}"


def test_readme_figures_are_rows_of_the_benchmarks_page() -> None:
    """The README's short table is copied from docs/benchmarks.md's latest run, row for row:
    a new run that changes the page makes this fail until the README follows."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = [line for line in readme.split("## Benchmarks", 1)[1].splitlines() if "| yes |" in line]
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    latest = page.split("<!-- bench:begin -->", 1)[1].split("<!-- bench:end -->", 1)[0]
    assert len(rows) >= 5
    assert [r for r in rows if r not in latest.splitlines()] == []


def test_nothing_points_outside_the_repository() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "CONTRACT.md" not in text, page
        assert "../shared" not in text, page


# ---- the API reference ---------------------------------------------------------------------


@pytest.mark.parametrize("secured", [False, True], ids=["open", "secured"])
def test_reference_names_every_route_and_shape_and_every_link_has_its_anchor(
    secured: bool,
) -> None:
    tokens = {"token": TOKEN, "view_token": VIEW_TOKEN} if secured else {}
    document = openapi_document(**tokens)
    ref = reference.read(document)
    markdown = reference_pages.markdown(ref)
    page = reference_pages.page(ref)
    for method, path in operations(document):
        assert f"`{method} {path}`" in markdown
        assert f"<code>{method} {path}</code>" in page
    for name in document["components"]["schemas"]:
        assert f"### {name} {{#{reference.shape_anchor(name)}}}" in markdown
    anchors = Anchors()
    anchors.feed(page)
    assert anchors.links, "the page links its routes and shapes"
    assert anchors.links <= anchors.ids, f"links without a target: {anchors.links - anchors.ids}"
    # Who may call a route is said exactly when the sidecar has tokens.
    assert ("Who may call it" in page) is secured
    assert ("Who may call it: no API token." in markdown) is secured  # /health, the hooks


def test_reference_page_is_self_contained_and_shows_text_as_text() -> None:
    """A description holding markup is shown, never applied; nothing comes from elsewhere."""
    document = openapi_document()
    document["paths"]["/health"]["get"]["description"] = 'Try `<b>` and <script>alert("x")</script>'
    page = reference_pages.page(reference.read(document))
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert "<code>&lt;b&gt;</code>" in page
    anchors = Anchors()
    anchors.feed(page)
    assert anchors.external == []
    markdown = reference_pages.markdown(reference.read(document))
    assert "&lt;script>" in markdown  # Markdown passes raw HTML through: it is escaped too
    assert "`<b>`" in markdown  # code spans keep their text


def test_reference_writes_types_as_a_reader_says_them() -> None:
    ref = reference.read(openapi_document())
    shapes = {s.name: s for s in ref.shapes}
    fields = {f.name: f for f in shapes["StatusAnswer"].fields}
    assert fields["cli_pid"].type == ("integer", " or ", "null")
    assert fields["blockers"].type == ("array of ", "string")
    assert fields["agent"].type == (reference.Ref("AgentInfo"),)
    assert fields["sleeve_id"].required
    state = shapes["ProcState"]
    assert state.fields == () and reference.Code("running") in state.type


def test_api_route_serves_the_reference_to_the_view_token_and_the_dashboard_links_it(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": VIEW_TOKEN})
    sc.start()
    view = {"Authorization": f"Bearer {VIEW_TOKEN}"}
    reply = sc.get("/api", headers=view)
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/html")
    page = reply.body.decode()
    document = sc.get("/openapi.json", headers=view).body
    for method, path in operations(document):
        assert f"<code>{method} {path}</code>" in page
    assert "default-src 'none'" in page  # its own policy: no script, nothing from elsewhere
    assert sc.get("/api", headers={}).status == 401
    dashboard = sc.get("/", headers=view).body.decode()
    assert 'href="api"' in dashboard


# ---- the site's build ----------------------------------------------------------------------


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "scripts/mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_build_warns_of_a_variable_the_configuration_page_does_not_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hooks = load_hooks()
    known = hooks.variables()
    assert {"SLEEVE_NAME", "SIDECAR_STOP_GRACE", "SIDECAR_VIEW_TOKEN", "TTYD_PORT"} <= known
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        hooks.check_variables(page)
        assert caplog.records == []
        hooks.check_variables(page.replace("`SIDECAR_STOP_GRACE`", "the grace"))
    assert [r.getMessage() for r in caplog.records] == [
        "sidecar-docs: configuration.md does not document the environment variable "
        "SIDECAR_STOP_GRACE"
    ]


def test_site_layers_are_the_import_linter_contracts() -> None:
    hooks = load_hooks()
    text = hooks.layers()
    assert "`workspace`: " in text and "independent: none imports another" in text
    assert "`sidecar.launcher` must not import" in text
    assert Path(REPO / "docs" / "architecture.md").read_text().count("<!-- generated: ") == 2
