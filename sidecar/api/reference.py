"""The HTTP API reference read out of the OpenAPI document (`sidecar.api.openapi`): its routes
by tag, what each takes and answers, and every shape, with types written as a reader says them.
`sidecar.api.reference_pages` writes it out (the docs site's page, `GET /api`). Pure, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
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
