"""Name -> entry registries with veRL's decorator shape (``@register_policy_loss(name)``).

One behaviour for every registry of the project (segmenters, ASR and speaker backends): registering a name twice
with a different object raises, as veRL does for advantage estimators; registering the same function or class again
(its module imported twice) is allowed. A lookup of an unknown name lists the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _origin(obj: Any) -> tuple[str, str]:
    return getattr(obj, "__module__", ""), getattr(obj, "__qualname__", repr(obj))


class Registry(dict):
    """A dict of registered entries; ``kind`` names them in errors (``"segmenter"``, ``"ASR backend"``)."""

    def __init__(self, kind: str, hint: str = ""):
        super().__init__()
        self.kind = kind
        self.hint = hint
        self._origins: dict[str, tuple[str, str]] = {}

    def add(self, name: str, entry: Any, origin: Any = None) -> None:
        """Register ``entry`` under ``name``; ``origin`` (default: ``entry``) is the function or class it wraps."""
        source = _origin(entry if origin is None else origin)
        if name in self and self._origins[name] != source:
            raise ValueError(f"{self.kind} {name!r} is already registered by {'.'.join(self._origins[name])}")
        self[name] = entry
        self._origins[name] = source

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated function or class under ``name``."""

        def decorator(obj: T) -> T:
            self.add(name, obj)
            return obj

        return decorator

    def lookup(self, name: str) -> Any:
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {sorted(self)}{self.hint}")
        return self[name]

    def pop(self, name: str, *default: Any) -> Any:
        self._origins.pop(name, None)
        return super().pop(name, *default)

    def __delitem__(self, name: str) -> None:
        self._origins.pop(name, None)
        super().__delitem__(name)
