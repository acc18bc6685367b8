"""An implementation's own settings: a frozen dataclass registered with it
(``REGISTRY.register(name, settings=MySettings)``), built from the config in one place.

Each field says which flat ``algorithm.*`` keys feed it (``setting(default, "clip_eps")``, the
keys users know from the presets), and the section's ``<kind>_args`` dict
(``algorithm.policy_loss_args``) sets any field by its own name, so a new implementation needs
no new config key. Checks of a setting's value live in its dataclass's ``__post_init__``."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlsys.config.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """The settings of an implementation that registered none."""


def setting(default: Any, keys: str | tuple[str, ...] = ()) -> Any:
    """A settings field with its default, fed from the flat config key ``keys`` (or, given
    several, the first of them that is not null)."""
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    return dataclasses.field(default=default, metadata={"keys": keys})


def build_settings(cls: type, section: Any, args: dict[str, Any], where: str, what: str) -> Any:
    """``cls`` from ``section``'s flat keys overridden by ``args`` (``where``: the args' config
    key, ``what``: the implementation, for messages); raises ConfigError naming an unknown or
    bad argument."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(args) - set(names))
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]} is not a setting of {what}; its settings are "
            f"{names or 'none'} ({cls.__name__})"
        )
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in args:
            values[f.name] = args[f.name]
            continue
        keys = f.metadata.get("keys", ())
        found = [getattr(section, key) for key in keys]
        given = [v for v in found if v is not None]
        if len(keys) == 1:
            values[f.name] = found[0]
        elif given:
            values[f.name] = given[0]
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}; fix the setting it names") from exc
