"""The last ``\\boxed{...}`` answer of a LaTeX text: how MATH solutions give their answer (read
by ``rlsys.data.math_data``) and how a policy is asked to give its own (``rlsys.rewards.math``)."""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)")


def _balanced(text: str, start: int) -> int | None:
    """The index just past the ``}`` closing the ``{`` at ``start``, or None if unclosed."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (braces
    balanced; ``\\boxed 5`` also counts), or None. A box cut off by the length limit is
    ignored, and a box nested in another is part of the outer one's content."""
    found, pos = None, 0
    while match := _BOX.search(text, pos):
        pos = match.end()
        rest = text[pos:]
        if rest.startswith("{"):
            end = _balanced(text, pos)
            if end is None:
                continue
            found, pos = text[pos + 1 : end - 1], end
        elif rest[:1] == " " and (word := re.match(r" +([^\s$]+)", rest)):
            found, pos = word.group(1), pos + word.end()
    return found
