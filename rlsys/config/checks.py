"""Value checks shared by the config dataclasses: each error names the key and the fix."""

from __future__ import annotations

from rlsys.config.errors import ConfigError


def positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{key}={value} must be > 0; set {key} to a positive value")


def non_negative(key: str, value: float) -> None:
    if value < 0:
        raise ConfigError(f"{key}={value} must be >= 0; set {key} to zero or more")


def one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of {list(choices)}; pick one of those")
