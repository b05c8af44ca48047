"""Griffe extension for the documentation site: render fp8sim's reST-flavoured docstrings as Markdown.

fp8sim's docstrings are written for reading in a terminal (``help()``) in a numpy/Sphinx
dialect; mkdocstrings renders docstring text as Markdown.  This extension rewrites each
docstring's text (on a copy held by the documentation build; the source files are not
touched) before the numpy parser sees it:

* Sphinx roles (``:func:`~fp8sim.round```, ``:class:`Format```, ...) become code spans;
* ``**`` used as a power (``2**-127``) is escaped so that Markdown does not read it as bold;
* reST literal blocks (a paragraph ending in ``::`` followed by an indented block) become
  fenced code blocks, simple tables (``=====  =====`` rules; a row whose first cell is empty
  continues the row above) Markdown tables;
* a mention of a documentation page (``docs/gemm.md``) becomes a link to that page;
* ``name : description`` items of Parameters/Attributes sections become numpy items with the
  description on its own line (the signature supplies the types), and the free text of a
  Returns section becomes the description of an unnamed item.

Loaded by mkdocs.yml (``extensions: [docs/_ext/griffe_rst.py]``); mkdocs does not publish
this folder (``exclude_docs``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|obj|exc|const|term|ref):`([^`]+)`")
POWER = re.compile(r"(?<=[\w)\].])\*\*(?=[-+\w(.])")
CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)")
TABLE_RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")
DOC_PAGE = re.compile(r"(?<![\w/.`\[(])docs/([a-z][\w-]*)\.md\b")
NAMED = re.compile(r"^\s*\w+\s*:(\s|$)")
ITEM_SECTIONS = {"parameters", "other parameters", "attributes", "keyword arguments"}
FREE_SECTIONS = {"returns", "yields"}


def _role(match: re.Match) -> str:
    target = match.group(1).strip()
    titled = re.match(r"(.+?)\s*<(.+)>$", target)
    if titled:
        target = titled.group(1)
    elif target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"``{target}``"


def _inline(line: str) -> str:
    """Escape powers and link documentation pages, outside code spans."""
    parts = CODE_SPAN.split(line)
    return "".join(
        p if i % 2 else DOC_PAGE.sub(r"[docs/\1.md](../\1.md)", POWER.sub(r"\\*\\*", p)) for i, p in enumerate(parts)
    )


def _table(lines: list[str]) -> list[str]:
    """A reST simple table (``lines`` from its first rule to its last) as a Markdown table."""
    rule = lines[0]
    spans = [m.span() for m in re.finditer(r"=+", rule)]
    starts = [a for a, _ in spans]

    def cells(line: str) -> list[str]:
        bounds = starts[1:] + [max(len(line), starts[-1]) + 1]
        return [line[a:b].strip() for a, b in zip(starts, bounds)]

    rules = [i for i, t in enumerate(lines) if TABLE_RULE.match(t)]
    header: list[str] | None = None
    rows: list[list[str]] = []
    for i, t in enumerate(lines):
        if i in rules or not t.strip():
            continue
        c = cells(t)
        if len(rules) >= 3 and i < rules[1]:
            header = c if header is None else [f"{h} {x}".strip() for h, x in zip(header, c)]
        elif rows and not c[0]:
            rows[-1] = [f"{r} {x}".strip() for r, x in zip(rows[-1], c)]
        else:
            rows.append(c)
    if header is None:
        header = [""] * len(starts)
    pad = " " * _indent(rule)

    def md(r: list[str]) -> str:
        return pad + "| " + " | ".join(_inline(x).replace("|", "\\|") for x in r) + " |"

    return ["", md(header), pad + "|" + "---|" * len(starts), *[md(r) for r in rows], ""]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _blocks(lines: list[str]) -> list[str]:
    """Literal blocks and simple tables to fenced code; inline fixes elsewhere."""
    out: list[str] = []
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or line.lstrip().startswith("```"):
            out.append(line)
            i += 1
            continue
        if TABLE_RULE.match(line):
            j = i
            while j + 1 < len(lines) and lines[j + 1].strip():
                j += 1
            out += _table(lines[i : j + 1])
            i = j + 1
            continue
        if line.rstrip().endswith("::") and not line.lstrip().startswith((">>>", "...")):
            base = _indent(line)
            head = line.rstrip()[:-2].rstrip()
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            body_start = j
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
                j += 1
            body = lines[body_start:j]
            while body and not body[-1].strip():
                body.pop()
            if body:
                if head.strip():
                    out.append(_inline(head) + ":")
                    out.append("")
                cut = min(_indent(b) for b in body if b.strip())
                pad = " " * base
                out += [pad + "```text", *[pad + b[cut:] if b.strip() else "" for b in body], pad + "```", ""]
                i = j
                continue
        out.append(_inline(line))
        i += 1
    return out


def _sections(lines: list[str]) -> list[str]:
    """Make numpy sections parse the way fp8sim writes them."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        title = lines[i].strip().lower()
        is_header = (
            i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"} and len(lines[i + 1].strip()) >= 3 and title
        )
        if not is_header or (title not in ITEM_SECTIONS and title not in FREE_SECTIONS):
            out.append(lines[i])
            i += 1
            continue
        base = _indent(lines[i])
        out += [lines[i], lines[i + 1]]
        j = i + 2
        body = []
        while j < len(lines):
            nxt = lines[j + 1].strip() if j + 1 < len(lines) else ""
            if lines[j].strip() and _indent(lines[j]) == base and nxt and set(nxt) == {"-"} and len(nxt) >= 3:
                break  # the next section
            body.append(lines[j])
            j += 1
        pad = " " * base
        if title in FREE_SECTIONS:
            first = body[0].strip() if body else ""
            if first and first != ":" and not NAMED.match(body[0]) and _indent(body[0]) == base:
                out.append(pad + ":")
                out += ["    " + b if b.strip() else "" for b in body]
            else:
                out += body
        else:
            for b in body:
                m = re.match(r"^(\s*)([\w*][\w*, ]*?)\s+:\s+(\S.*)$", b)
                if m and len(m.group(1)) == base:
                    out += [m.group(1) + m.group(2), m.group(1) + "    " + m.group(3)]
                else:
                    out.append(b)
        i = j
    return out


def to_markdown(text: str) -> str:
    """The Markdown rendering of one docstring's text."""
    lines = ROLE.sub(_role, text).split("\n")
    lines = _sections(lines)
    lines = _blocks(lines)
    return "\n".join(lines)


class RstDocstrings(griffe.Extension):
    """Rewrite every docstring of the loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[Any] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.is_alias or id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = to_markdown(obj.docstring.value)
            stack.extend(obj.members.values())
