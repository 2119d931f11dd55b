"""Models: the served models by name and alias, and which one a request gets.

The first model is the default: a request that names no model gets it. With one model any name
is accepted, as TEI accepts any `model` on its OpenAI route; with several, an unknown name is a
ModelNotFoundError that lists the served names.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, Protocol, TypeVar

from vectorpress.errors import ModelNotFoundError


class Named(Protocol):
    @property
    def names(self) -> tuple[str, ...]:
        """The served name first, then the aliases."""
        ...


M = TypeVar("M", bound=Named)


class Models(Generic[M]):
    """An ordered set of served models, each reachable by any of its names."""

    def __init__(self, models: Sequence[M]) -> None:
        if not models:
            raise ValueError("at least one model")
        self._models = tuple(models)
        self._by_name: dict[str, M] = {}
        for model in self._models:
            for name in model.names:
                if name in self._by_name:
                    raise ValueError(f"two models are named {name!r}")
                self._by_name[name] = model

    @property
    def default(self) -> M:
        return self._models[0]

    @property
    def names(self) -> tuple[str, ...]:
        """Each model's served name, in order (aliases left out)."""
        return tuple(m.names[0] for m in self._models)

    @property
    def all_names(self) -> tuple[str, ...]:
        """Every name and alias, longest first (how a path prefix is matched)."""
        return tuple(sorted(self._by_name, key=len, reverse=True))

    def serves(self, name: str) -> bool:
        """Whether `name` is one of the served names or aliases."""
        return name in self._by_name

    def get(self, name: str | None) -> M:
        """The model `name` routes to; None is the default one."""
        if name is None:
            return self._models[0]
        model = self._by_name.get(name)
        if model is not None:
            return model
        if len(self._models) == 1:
            return self._models[0]
        raise ModelNotFoundError(name, self.names)

    def __iter__(self) -> Iterator[M]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)
