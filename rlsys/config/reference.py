"""The configuration reference (docs/config.md), generated from the schema dataclasses: every
key with its type, default and the comment written beside its field, so the reference cannot
drift from the code (``python -m rlsys.config.reference > docs/config.md``; a test fails when
the committed file is stale)."""

from __future__ import annotations

import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing

from rlsys.config.schema import TrainConfig

HEADER = """# Configuration reference

Generated from the dataclasses in `rlsys/config/` by `python -m rlsys.config.reference`; do not
edit by hand. Set any key on the command line (`rlsys train rollout.n_samples=4`) or in a preset
under `conf/`. `null` means the documented fallback.
"""


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment: the ``#`` comment on the field's line, after the comment
    lines just above it (a subclass's own comments over its bases')."""
    comments: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and base is not object:
            comments.update({k: v for k, v in _own_comments(base).items() if v})
    return comments


def _own_comments(cls: type) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[str, str] = {}
    pending: list[str] = []  # full-line comments waiting for the next field
    names = {f.name for f in dataclasses.fields(cls)}
    line_tokens: dict[int, list[tokenize.TokenInfo]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        line_tokens.setdefault(token.start[0], []).append(token)
    for number in sorted(line_tokens):
        tokens = [
            t
            for t in line_tokens[number]
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        ]
        if not tokens:
            continue
        if tokens[0].type == tokenize.COMMENT:
            pending.append(tokens[0].string.lstrip("# ").strip())
            continue
        first = tokens[0]
        is_field = (
            first.type == tokenize.NAME
            and first.string in names
            and len(tokens) > 1
            and tokens[1].string == ":"
            and first.start[1] == 4
        )
        if is_field:
            trailing = [t.string.lstrip("# ").strip() for t in tokens if t.type == tokenize.COMMENT]
            comments[first.string] = " ".join(pending + trailing)
        pending = []
    return comments


def _type_name(annotation) -> str:
    text = str(annotation).replace("typing.", "")
    return text.replace("<class '", "").replace("'>", "").replace("NoneType", "None")


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


def _show(value) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{value}`"


def sections(cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, str, list[tuple]]]:
    """(key prefix, class docstring, rows of (key, type, default, comment)) per dataclass,
    depth first from ``cls``."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            nested.extend(sections(kind, f"{prefix}{f.name}."))
            continue
        rows.append(
            (prefix + f.name, _type_name(kind), _show(_default(f)), comments.get(f.name, ""))
        )
    doc = inspect.cleandoc(cls.__doc__ or "")
    return [(prefix.rstrip("."), doc, rows), *nested] if rows else nested


def render() -> str:
    """docs/config.md."""
    out = [HEADER]
    for prefix, doc, rows in sections():
        out.append(f"\n## `{prefix or '(top level)'}`\n\n{doc}\n")
        out.append("| key | type | default | meaning |\n|---|---|---|---|")
        for key, kind, default, comment in rows:
            cells = [f"`{key}`", f"`{kind}`", default, comment]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
