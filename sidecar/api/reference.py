"""The HTTP API reference, read out of the OpenAPI document (`sidecar.api.openapi`) once and
written two ways: Markdown for the documentation site (its mkdocs hook builds it from the
document at build time) and the self-contained HTML page the sidecar serves at `GET /api`.
Pure: no I/O, and nothing in it is kept by hand beside the document.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ref:
    """A link to one of the document's shapes (`#/components/schemas/<name>`)."""

    name: str


@dataclass(frozen=True)
class Code:
    """A literal value (an enum member, a constant): set as code."""

    text: str


Part = str | Ref | Code
Type = tuple[Part, ...]  # a type written out: words, links to shapes, literal values


@dataclass(frozen=True)
class Field:
    name: str
    type: Type
    required: bool
    description: str
    where: str = ""  # a parameter's place: path, query, header


@dataclass(frozen=True)
class Answer:
    status: str  # "200", ..., "default"
    description: str
    media: str  # its content type; "" for none
    type: Type


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    anchor: str
    summary: str
    description: str
    auth: str  # who may call it; "" when the sidecar has no token (nobody is asked)
    parameters: tuple[Field, ...]
    body: Type  # () without a body
    body_required: bool
    answers: tuple[Answer, ...]


@dataclass(frozen=True)
class Group:
    name: str
    description: str
    routes: tuple[Route, ...]


@dataclass(frozen=True)
class Shape:
    name: str
    anchor: str
    description: str
    fields: tuple[Field, ...]
    type: Type  # what it is when it is not an object with fields (an enum, one of several)


@dataclass(frozen=True)
class Reference:
    title: str
    version: str
    description: str
    groups: tuple[Group, ...]
    shapes: tuple[Shape, ...]


# ---- reading the document --------------------------------------------------------------------


def shape_anchor(name: str) -> str:
    return f"shape-{name.lower()}"


def _prose(text: str) -> str:
    """Docstring text made plain: each paragraph on one line, paragraphs apart by a blank line."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _joined(types: Iterable[Type], sep: str) -> Type:
    out: list[Part] = []
    for i, kind in enumerate(types):
        if i:
            out.append(sep)
        out.extend(kind)
    return tuple(out)


def _literal(value: Any) -> Code:
    return Code(value if isinstance(value, str) else json.dumps(value))


def type_of(schema: Mapping[str, Any]) -> Type:
    """A JSON Schema written out as a reader says it: `array of Message`, `integer or null`."""
    if "$ref" in schema:
        return (Ref(str(schema["$ref"]).rsplit("/", 1)[-1]),)
    if "properties" in schema or schema.get("type") == "object":
        return ("object",)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _joined((type_of(s) for s in schema[key]), " or ")
    if "enum" in schema:
        values = [(_literal(v),) for v in schema["enum"]]
        return values[0] if len(values) == 1 else ("one of ", *_joined(values, ", "))
    if "const" in schema:
        return (_literal(schema["const"]),)
    kind = schema.get("type")
    if kind == "array":
        return ("array of ", *type_of(schema.get("items", {})))
    if isinstance(kind, list):
        return _joined(((str(k),) for k in kind), " or ")
    if kind is None:
        return ("any",)
    return (f"{kind} ({schema['format']})" if "format" in schema else str(kind),)


def _fields(schema: Mapping[str, Any]) -> tuple[Field, ...]:
    required = set(schema.get("required", ()))
    return tuple(
        Field(name, type_of(prop), name in required, _prose(prop.get("description", "")))
        for name, prop in schema.get("properties", {}).items()
    )


def _content(node: Mapping[str, Any]) -> tuple[str, Type]:
    for media, body in node.get("content", {}).items():
        return media, type_of(body.get("schema", {}))
    return "", ()


def _auth(doc: Mapping[str, Any], method: str, op: Mapping[str, Any]) -> str:
    if "security" not in doc:
        return ""
    if op.get("security") == []:
        return "no API token"
    if method == "GET":
        return "the token; the view token is enough"
    return "the token (the view token answers 403)"


def _route(doc: Mapping[str, Any], method: str, path: str, op: Mapping[str, Any]) -> Route:
    responses = doc.get("components", {}).get("responses", {})
    answers = []
    for status, given in op.get("responses", {}).items():
        ref = given.get("$ref")
        answer = responses.get(str(ref).rsplit("/", 1)[-1], {}) if ref else given
        media, kind = _content(answer)
        answers.append(Answer(status, _prose(answer.get("description", "")), media, kind))
    parameters = tuple(
        Field(
            p["name"],
            type_of(p.get("schema", {})),
            bool(p.get("required")),
            _prose(p.get("description", "")),
            p.get("in", ""),
        )
        for p in op.get("parameters", ())
    )
    body = op.get("requestBody", {})
    return Route(
        method=method.upper(),
        path=path,
        anchor=f"op-{op['operationId'].lower()}",
        summary=_prose(op.get("summary", "")),
        description=_prose(op.get("description", "")),
        auth=_auth(doc, method.upper(), op),
        parameters=parameters,
        body=_content(body)[1],
        body_required=bool(body.get("required")),
        answers=tuple(answers),
    )


def read(doc: Mapping[str, Any]) -> Reference:
    """The reference of an OpenAPI document as `sidecar.api.openapi.document` builds it."""
    routes: dict[str, list[Route]] = {}
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            tag = (op.get("tags") or ["other"])[0]
            routes.setdefault(tag, []).append(_route(doc, method, path, op))
    described = {t["name"]: t.get("description", "") for t in doc.get("tags", ())}
    order = [*described, *sorted(set(routes) - set(described))]
    groups = tuple(
        Group(name, _prose(described.get(name, "")), tuple(routes[name]))
        for name in order
        if name in routes
    )
    schemas = doc.get("components", {}).get("schemas", {})
    shapes = tuple(
        Shape(
            name,
            shape_anchor(name),
            _prose(s.get("description", "")),
            _fields(s),
            () if "properties" in s else type_of(s),
        )
        for name, s in sorted(schemas.items())
    )
    info = doc.get("info", {})
    return Reference(
        title=str(info.get("title", "HTTP API")),
        version=str(info.get("version", "")),
        description=_prose(info.get("description", "")),
        groups=groups,
        shapes=shapes,
    )


# ---- Markdown (the documentation site) -------------------------------------------------------

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)


def _outside_code(text: str, change: Callable[[str], str]) -> str:
    """`text` with `change` applied to everything but its code spans."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [change(text[last : m.start()]), m.group(0)]
        last = m.end()
    out.append(change(text[last:]))
    return "".join(out)


def md_text(text: str, *, cell: bool = False) -> str:
    """Prose for Markdown: `<` is no tag; in a table cell `|` is no column and a line is one."""
    text = _outside_code(text, lambda s: s.replace("<", "&lt;"))
    if cell:
        text = _outside_code(text.replace("\n\n", " "), lambda s: s.replace("|", r"\|"))
    return text


def _md_type(kind: Type) -> str:
    parts = []
    for part in kind:
        if isinstance(part, Ref):
            parts.append(f"[{part.name}](#{shape_anchor(part.name)})")
        elif isinstance(part, Code):
            parts.append(f"`{part.text}`")
        else:
            parts.append(part)
    return "".join(parts)


def _md_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _md_fields(fields: Sequence[Field], *, where: bool = False) -> list[str]:
    head = ["name", *(["in"] if where else []), "type", "required", "description"]
    rows = (
        [
            f"`{f.name}`",
            *([f.where] if where else []),
            _md_type(f.type),
            "yes" if f.required else "",
            md_text(f.description, cell=True),
        ]
        for f in fields
    )
    return _md_table(head, rows)


def _md_route(route: Route, level: int) -> list[str]:
    lines = [f"{'#' * level} `{route.method} {route.path}` {{#{route.anchor}}}", ""]
    lines += [md_text(_sentence(route.summary)), ""]
    if route.description:
        lines += [md_text(route.description), ""]
    if route.auth:
        lines += [f"Who may call it: {route.auth}.", ""]
    if route.parameters:
        lines += ["Parameters:", "", *_md_fields(route.parameters, where=True)]
    if route.body:
        needed = "" if route.body_required else " (optional)"
        lines += [f"Request body{needed}: {_md_type(route.body)}.", ""]
    rows = (
        [
            f"{a.status}",
            md_text(a.description, cell=True),
            f"{_md_type(a.type)} (`{a.media}`)" if a.type else (f"`{a.media}`" if a.media else ""),
        ]
        for a in route.answers
    )
    return [*lines, *_md_table(["status", "meaning", "body"], rows)]


def markdown(ref: Reference, level: int = 2) -> str:
    """The reference as Markdown, its sections starting at heading `level` (mkdocs' attr_list
    extension gives each route and shape the same anchor as in the HTML page)."""
    h = "#" * level
    lines = [md_text(ref.description), ""]
    for group in ref.groups:
        lines += [f"{h} {group.name.capitalize()}: {md_text(group.description)}", ""]
        for route in group.routes:
            lines += _md_route(route, level + 1)
    lines += [f"{h} Shapes", ""]
    for shape in ref.shapes:
        lines += [f"{h}# {shape.name} {{#{shape.anchor}}}", ""]
        if shape.description:
            lines += [md_text(shape.description), ""]
        if shape.fields:
            lines += _md_fields(shape.fields)
        elif shape.type:
            lines += [_md_type(shape.type), ""]
    return "\n".join(lines)


# ---- HTML (GET /api) -------------------------------------------------------------------------


def _inline(text: str) -> str:
    """Escaped prose with its code spans set as code."""
    escaped = html.escape(text, quote=False)
    return _CODE_SPAN.sub(lambda m: f"<code>{m.group(2)}</code>", escaped)


def _html_prose(text: str) -> str:
    return "".join(f"<p>{_inline(p)}</p>" for p in text.split("\n\n") if p)


def _html_type(kind: Type) -> str:
    parts = []
    for part in kind:
        if isinstance(part, Ref):
            name = html.escape(part.name)
            parts.append(f'<a href="#{shape_anchor(part.name)}">{name}</a>')
        elif isinstance(part, Code):
            parts.append(f"<code>{html.escape(part.text)}</code>")
        else:
            parts.append(html.escape(part))
    return "".join(parts)


def _html_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    cells = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _html_fields(fields: Sequence[Field], *, where: bool = False) -> str:
    head = ["name", *(["in"] if where else []), "type", "required", "description"]
    rows = (
        [
            f"<code>{html.escape(f.name)}</code>",
            *([html.escape(f.where)] if where else []),
            _html_type(f.type),
            "yes" if f.required else "",
            _inline(f.description),
        ]
        for f in fields
    )
    return _html_table(head, rows)


def _html_route(route: Route) -> str:
    out = [
        f'<h3 id="{route.anchor}"><code>{route.method} {html.escape(route.path)}</code></h3>',
        f"<p>{_inline(_sentence(route.summary))}</p>",
        _html_prose(route.description),
    ]
    if route.auth:
        out.append(f"<p>Who may call it: {html.escape(route.auth)}.</p>")
    if route.parameters:
        out += ["<p>Parameters:</p>", _html_fields(route.parameters, where=True)]
    if route.body:
        needed = "" if route.body_required else " (optional)"
        out.append(f"<p>Request body{needed}: {_html_type(route.body)}.</p>")
    rows = (
        [
            html.escape(a.status),
            _inline(a.description),
            _html_type(a.type) + (f" (<code>{html.escape(a.media)}</code>)" if a.media else ""),
        ]
        for a in route.answers
    )
    out.append(_html_table(["status", "meaning", "body"], rows))
    return "".join(out)


STYLE = """
body{margin:0 auto;max-width:72rem;padding:1rem 1.5rem;font:15px/1.5 system-ui,"DejaVu Sans",
sans-serif;color:#d6dde6;background:#0d1117}
a{color:#58a6ff}code{font:13px ui-monospace,"DejaVu Sans Mono",monospace;color:#e6edf3}
h1{font-size:1.5rem}h2{margin-top:2.5rem;border-bottom:1px solid #30363d}
h3{margin-top:2rem}table{border-collapse:collapse;width:100%;margin:.5rem 0 1rem}
th,td{border:1px solid #30363d;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#161b22}nav ul{columns:2;padding-left:1.2rem}
"""


def page(ref: Reference) -> str:
    """The reference as one self-contained HTML page: no script, nothing from another origin,
    every link relative (the page works behind a path prefix too)."""
    nav = "".join(
        f'<li><a href="#{r.anchor}"><code>{r.method} {html.escape(r.path)}</code></a> '
        f"{_inline(r.summary)}</li>"
        for g in ref.groups
        for r in g.routes
    )
    body = [
        f"<h1>{html.escape(ref.title)} — HTTP API {html.escape(ref.version)}</h1>",
        '<p><a href="./">dashboard</a> · <a href="openapi.json">openapi.json</a></p>',
        f"<nav><ul>{nav}</ul></nav>",
        _html_prose(ref.description),
    ]
    for group in ref.groups:
        body.append(
            f"<h2>{html.escape(group.name.capitalize())}: {_inline(group.description)}</h2>"
        )
        body += [_html_route(r) for r in group.routes]
    body.append("<h2>Shapes</h2>")
    for shape in ref.shapes:
        body += [f'<h3 id="{shape.anchor}">{html.escape(shape.name)}</h3>']
        body.append(_html_prose(shape.description))
        if shape.fields:
            body.append(_html_fields(shape.fields))
        elif shape.type:
            body.append(f"<p>{_html_type(shape.type)}</p>")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'\">"
        f"<title>{html.escape(ref.title)} — HTTP API</title><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
