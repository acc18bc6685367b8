"""How the lookup environments (``sql``, ``search``) judge a final answer against the
reference: pure functions of two strings."""

from __future__ import annotations

import re
import string

_SEPARATORS = re.compile(r"[;,\n]|\band\b", re.IGNORECASE)
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _value(text: str) -> str:
    """One value, canonical: numbers by value ("7", "7.0" -> "7"), text by lower case with
    surrounding quotes and full stops dropped and whitespace collapsed."""
    text = " ".join(text.strip().strip("'\"").rstrip(".").split()).lower()
    try:
        number = float(text)
    except ValueError:
        return text
    return f"{number:g}" if number == number else text  # NaN stays as written


def value_set(text: str) -> frozenset[str]:
    """The values of an answer or result text: split at ";", ",", newlines and "and", each
    canonical (``_value``), empty ones dropped."""
    return frozenset(v for v in map(_value, _SEPARATORS.split(text)) if v)


def same_values(answer: str, reference: str) -> bool:
    """Whether ``answer`` states exactly the values of ``reference`` (a result set): order-
    insensitive, case-insensitive, numbers compared by value. "Bob; Ann" matches "Ann, Bob";
    "Ann" does not match "Ann; Bob" (a value missing) nor "Ann; Bob; Cy" (one too many)."""
    values = value_set(reference)
    return bool(values) and value_set(answer) == values


def normalize(text: str) -> str:
    """Lower case, punctuation removed, whitespace collapsed (SQuAD-style, without dropping
    articles: the generated names have none)."""
    return " ".join(text.lower().translate(_PUNCTUATION).split())


def exact_match(answer: str, reference: str) -> bool:
    """Whether the normalised answer equals the normalised reference (and is not empty)."""
    expected = normalize(reference)
    return bool(expected) and normalize(answer) == expected
