"""A dataset row's prompt and answer, wherever the file keeps them.

Column keys may be dotted paths into nested columns (``task.answer_key=reward_model.ground_truth``).
A prompt column may hold text or chat messages (a list of ``{"role", "content"}``, as verl's
parquet files do); the answer falls back to verl's ``reward_model.ground_truth`` where the row
has no ``answer`` column and the key was left at its default, so verl's files train with no
conversion step."""

from __future__ import annotations

DEFAULT_ANSWER_KEY = "answer"
VERL_ANSWER_KEY = "reward_model.ground_truth"
_MISSING = object()


def column(row: dict, key: str):
    """``row[key]``, ``key`` a dotted path into nested dicts; ``None`` where it is absent."""
    value = row.get(key, _MISSING)  # a flat column whose name has dots wins
    if value is not _MISSING:
        return value
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def answer_of(row: dict, key: str):
    """The row's answer under ``key``, or verl's ground truth where ``key`` is the default."""
    answer = column(row, key)
    if answer is None and key == DEFAULT_ANSWER_KEY:
        answer = column(row, VERL_ANSWER_KEY)
    return answer


def chat_messages(value) -> list[dict] | None:
    """``value`` as chat messages if it is a non-empty list of ``{"role", "content"}`` with
    string roles and contents and at least one user turn, else None."""
    if not isinstance(value, list) or not value:
        return None
    messages = []
    for item in value:
        if not isinstance(item, dict):
            return None
        role, content = item.get("role"), item.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            return None
        messages.append({"role": role, "content": content})
    return messages if any(m["role"] == "user" for m in messages) else None


def prompt_of(row: dict, key: str) -> tuple[str | None, list[dict] | None]:
    """(text, messages) of the row's prompt: text as given, or chat messages with their last
    user turn as the text; (None, None) if the column holds neither."""
    value = column(row, key)
    if isinstance(value, str):
        return value, None
    messages = chat_messages(value)
    if messages is None:
        return None, None
    return [m["content"] for m in messages if m["role"] == "user"][-1], messages
