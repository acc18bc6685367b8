"""One registry type for every extension kind: config names -> implementations, with traits.

Each kind (advantage estimators, policy losses, engines, training backends, ...) has one
module-level ``Registry`` in the module where its implementations live, and an implementation
joins it with one decorator line next to its definition::

    @ADVANTAGES.register("gae", settings=GaeSettings, needs_critic=True)
    def gae(x: AdvantageInputs, s: GaeSettings) -> Advantages: ...

The config holds names as plain strings; ``rlsys.resolve`` asks each registry whether a name
is known (``check``), and the code that needs a property of an implementation asks for its
trait (``trait``), so no list of names is kept anywhere else. docs/extending.md lists the registries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from rlsys.config.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps the names a config key accepts to implementations and their traits (a small dict
    of flags such as ``needs_critic=True``; a trait not given reads as ``False``)."""

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind  # what an item is, for messages: "advantage estimator"
        self.config_key = config_key  # the config key whose values are this registry's names
        self._items: dict[str, T] = {}
        self._traits: dict[str, dict[str, Any]] = {}
        self._settings: dict[str, type | None] = {}

    def register(self, name: str, settings: type | None = None, **traits: Any) -> Callable[[T], T]:
        """Decorator: register the item as ``name`` with ``traits`` and, for a kind whose
        implementations take their own settings, its ``settings`` dataclass
        (``rlsys.algorithms.settings``); returns the item unchanged."""

        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(
                    f"{self.kind} {name!r} is registered twice ({self._items[name]!r} and "
                    f"{item!r}); give the new one another name"
                )
            self._items[name] = item
            self._traits[name] = dict(traits)
            self._settings[name] = settings
            return item

        return add

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and plugins that registered something temporary)."""
        self.check(name)
        del self._items[name], self._traits[name], self._settings[name]

    def check(self, name: str, key: str | None = None) -> None:
        """Raise a ``ConfigError`` naming the config key (``key``, default this registry's),
        the bad value and the known names, unless ``name`` is registered."""
        if name in self._items:
            return
        key = key or self.config_key
        raise ConfigError(
            f"{key}={name!r} is not a known {self.kind}; use one of {self.names()} "
            "(a new one registers itself: see docs/extending.md)"
        )

    def get(self, name: str) -> T:
        """The implementation registered as ``name`` (``check``'s error if there is none)."""
        self.check(name)
        return self._items[name]

    def names(self, **traits: Any) -> list[str]:
        """The registered names, sorted; with ``traits``, only those whose traits match."""
        return sorted(
            name
            for name, own in self._traits.items()
            if all(own.get(key, False) == value for key, value in traits.items())
        )

    def trait(self, name: str, key: str, default: Any = False) -> Any:
        """Trait ``key`` of the implementation registered as ``name`` (``default`` if unset)."""
        self.check(name)
        return self._traits[name].get(key, default)

    def settings(self, name: str) -> type | None:
        """The settings dataclass ``name`` registered with (None: it takes none)."""
        self.check(name)
        return self._settings[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items
