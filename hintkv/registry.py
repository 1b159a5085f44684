"""Named, pluggable policies: one registry per kind (scheduling policy, load timing), one way to
add a policy by name and to build it, one error for an unknown name."""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind  # what the error calls a name: "scheduling policy", "load timing"
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator: file the class under `name` and set its `name` attribute."""
        def deco(cls: type) -> type:
            self._factories[name] = cls
            cls.name = name
            return cls
        return deco

    def names(self) -> list[str]:
        return sorted(self._factories)

    def make(self, name: str, **kwargs: Any) -> T:
        factory = self._factories.get(name)
        if factory is None:  # looked up first, so a KeyError inside a constructor is not renamed
            raise ValueError(f"unknown {self.kind} {name!r} (known: {', '.join(self.names())})")
        return factory(**kwargs)
