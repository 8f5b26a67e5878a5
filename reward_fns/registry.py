"""Name -> class registries with veRL's decorator shape (``@register_policy_loss(name)``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", bound=type)


class Registry(dict):
    """A dict of registered classes; ``kind`` names them in errors (``"ASR backend"``)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(cls: T) -> T:
            self[name] = cls
            return cls

        return decorator

    def get_cls(self, name: str) -> type:
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {sorted(self)}")
        return self[name]
