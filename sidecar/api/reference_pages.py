"""The HTTP API reference (`sidecar.api.reference`) written out two ways from one walk of it:
Markdown for the documentation site (its mkdocs hook builds the page from the document at build
time) and the self-contained HTML page the sidecar serves at `GET /api`. Pure, no I/O.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.api.reference import Code, Field, Ref, Reference, Route, Type, shape_anchor


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else f"{text}."


@dataclass(frozen=True)
class Heading:
    level: int
    text: Type
    anchor: str = ""


@dataclass(frozen=True)
class Para:
    text: Type


@dataclass(frozen=True)
class Table:
    head: tuple[str, ...]
    rows: tuple[tuple[Type, ...], ...]


Block = Heading | Para | Table


def _prose_paras(text: str) -> list[Block]:
    return [Para((p,)) for p in text.split("\n\n") if p]


def _fields_table(fields: Sequence[Field], *, where: bool = False) -> Table:
    head = ("name", *(("in",) if where else ()), "type", "required", "description")
    rows = tuple(
        (
            (Code(f.name),),
            *(((f.where,),) if where else ()),
            f.type,
            ("yes" if f.required else "",),
            (f.description,),
        )
        for f in fields
    )
    return Table(head, rows)


def _route_blocks(route: Route, level: int) -> list[Block]:
    out: list[Block] = [
        Heading(level, (Code(f"{route.method} {route.path}"),), route.anchor),
        Para((_sentence(route.summary),)),
        *_prose_paras(route.description),
    ]
    if route.auth:
        out.append(Para((f"Who may call it: {route.auth}.",)))
    if route.parameters:
        out += [Para(("Parameters:",)), _fields_table(route.parameters, where=True)]
    if route.body:
        needed = "" if route.body_required else " (optional)"
        out.append(Para((f"Request body{needed}: ", *route.body, ".")))
    rows = tuple(
        ((a.status,), (a.description,), (*a.type, *((" (", Code(a.media), ")") if a.media else ())))
        for a in route.answers
    )
    return [*out, Table(("status", "meaning", "body"), rows)]


def blocks(ref: Reference, level: int = 2) -> list[Block]:
    """The reference as headings, paragraphs and tables, its sections at heading `level`."""
    out: list[Block] = _prose_paras(ref.description)
    for group in ref.groups:
        out.append(Heading(level, (f"{group.name.capitalize()}: {group.description}",)))
        for route in group.routes:
            out += _route_blocks(route, level + 1)
    out.append(Heading(level, ("Shapes",)))
    for shape in ref.shapes:
        out += [Heading(level + 1, (shape.name,), shape.anchor), *_prose_paras(shape.description)]
        if shape.fields:
            out.append(_fields_table(shape.fields))
        elif shape.type:
            out.append(Para(shape.type))
    return out


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


def _md(text: Type, *, cell: bool = False) -> str:
    parts = []
    for part in text:
        if isinstance(part, Ref):
            parts.append(f"[{part.name}](#{shape_anchor(part.name)})")
        elif isinstance(part, Code):
            parts.append(f"`{part.text}`")
        else:
            parts.append(md_text(part, cell=cell))
    return "".join(parts)


def _md_block(block: Block) -> str:
    if isinstance(block, Heading):
        anchor = f" {{#{block.anchor}}}" if block.anchor else ""
        return f"{'#' * block.level} {_md(block.text)}{anchor}\n"
    if isinstance(block, Para):
        return _md(block.text) + "\n"
    lines = ["| " + " | ".join(block.head) + " |", "|" + "---|" * len(block.head)]
    lines += ["| " + " | ".join(_md(c, cell=True) for c in row) + " |" for row in block.rows]
    return "\n".join(lines) + "\n"


def markdown(ref: Reference, level: int = 2) -> str:
    """The reference as Markdown, its sections starting at heading `level` (mkdocs' attr_list
    extension gives each route and shape the same anchor as in the HTML page)."""
    return "\n".join(_md_block(b) for b in blocks(ref, level))


# ---- HTML (GET /api) -------------------------------------------------------------------------


def _html(text: Type) -> str:
    parts = []
    for part in text:
        if isinstance(part, Ref):
            name = html.escape(part.name)
            parts.append(f'<a href="#{shape_anchor(part.name)}">{name}</a>')
        elif isinstance(part, Code):
            parts.append(f"<code>{html.escape(part.text)}</code>")
        else:  # prose: escaped, its code spans set as code
            escaped = html.escape(part, quote=False)
            parts.append(_CODE_SPAN.sub(lambda m: f"<code>{m.group(2)}</code>", escaped))
    return "".join(parts)


def _html_block(block: Block) -> str:
    if isinstance(block, Heading):
        anchor = f' id="{block.anchor}"' if block.anchor else ""
        return f"<h{block.level}{anchor}>{_html(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        return f"<p>{_html(block.text)}</p>"
    head = "".join(f"<th>{h}</th>" for h in block.head)
    rows = "".join(
        "<tr>" + "".join(f"<td>{_html(c)}</td>" for c in row) + "</tr>" for row in block.rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


STYLE = """
body{margin:0 auto;max-width:72rem;padding:1rem 1.5rem;font:15px/1.5 system-ui,"DejaVu Sans",
sans-serif;color:#d6dde6;background:#0d1117}
a{color:#58a6ff}code{font:13px ui-monospace,"DejaVu Sans Mono",monospace;color:#e6edf3}
h1{font-size:1.5rem}h2{margin-top:2.5rem;border-bottom:1px solid #30363d}
h3{margin-top:2rem}h3 code{font-size:1rem}table{border-collapse:collapse;width:100%;
margin:.5rem 0 1rem}th,td{border:1px solid #30363d;padding:.3rem .5rem;text-align:left;
vertical-align:top}th{background:#161b22}nav ul{columns:2;padding-left:1.2rem}
"""


def page(ref: Reference) -> str:
    """The reference as one self-contained HTML page: no script, nothing from another origin,
    every link relative (the page works behind a path prefix too)."""
    nav = "".join(
        f'<li><a href="#{r.anchor}">{_html((Code(f"{r.method} {r.path}"),))}</a> '
        f"{_html((r.summary,))}</li>"
        for g in ref.groups
        for r in g.routes
    )
    title = html.escape(ref.title)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'\">"
        f"<title>{title} — HTTP API</title><style>{STYLE}</style></head><body>"
        f"<h1>{title} — HTTP API {html.escape(ref.version)}</h1>"
        '<p><a href="./">dashboard</a> · <a href="openapi.json">openapi.json</a></p>'
        f"<nav><ul>{nav}</ul></nav>{''.join(_html_block(b) for b in blocks(ref))}</body></html>\n"
    )
