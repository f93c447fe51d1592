"""Typed run-wide state shared by the loop and plugins: ``config.stash``, as in pytest.

A module that keeps a value in the stash declares its key once, at module level, next
to the code that owns the value, with the value's type::

    #: what this plugin measured, per host (why it is kept for the run: ...)
    seen_key = StashKey[dict[str, float]]()

    config.stash[seen_key] = {}
    seen = config.stash.setdefault(seen_key, {})   # static type: dict[str, float]

Keys are compared by identity, so two plugins never share a value by choosing the same
name, and a type checker knows the type of every value. A string key is a
:class:`TypeError`: the stash was a dict of string keys before, and an old plugin's
``config.stash["mine"]`` says so at once rather than working by accident.
"""

from __future__ import annotations

from typing import Any, Generic, Optional, TypeVar, Union, cast, overload

__all__ = ["Stash", "StashKey"]

T = TypeVar("T")
D = TypeVar("D")

_MISSING: Any = object()  # pop's "no default given" (None is a default)


class StashKey(Generic[T]):
    """A key of a :class:`Stash`, for values of type ``T``: ``StashKey[int]()``.

    Every key is unique (compared by identity): make one per value, at module level.
    """

    __slots__ = ()


def _check(key: object) -> None:
    if not isinstance(key, StashKey):
        raise TypeError(
            f"a stash key is a fleetrun.StashKey, not {type(key).__name__} {key!r} "
            "(declare one at module level: KEY = StashKey[T]())"
        )


class Stash:
    """A mapping from :class:`StashKey` to values of the key's type (``config.stash``).

    The methods are those of a dict, typed by the key; ``get`` and ``pop`` take an
    optional default as a dict's do.
    """

    __slots__ = ("_storage",)

    def __init__(self) -> None:
        self._storage: dict[object, object] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        """Set the value for ``key``."""
        _check(key)
        self._storage[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        """The value for ``key``.

        :raises KeyError: ``key`` was never set.
        """
        _check(key)
        return cast(T, self._storage[key])

    @overload
    def get(self, key: StashKey[T]) -> Optional[T]: ...

    @overload
    def get(self, key: StashKey[T], default: D) -> Union[T, D]: ...

    def get(self, key: Any, default: Any = None) -> Any:
        """The value for ``key``, or ``default`` (None) when it was never set."""
        _check(key)
        return self._storage.get(key, default)

    def setdefault(self, key: StashKey[T], default: T) -> T:
        """The value for ``key``; when it was never set, set it to ``default`` first."""
        _check(key)
        return cast(T, self._storage.setdefault(key, default))

    @overload
    def pop(self, key: StashKey[T]) -> T: ...

    @overload
    def pop(self, key: StashKey[T], default: D) -> Union[T, D]: ...

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its value, or ``default`` when it was never set.

        :raises KeyError: ``key`` was never set and no default was given.
        """
        _check(key)
        if default is _MISSING:
            return self._storage.pop(key)
        return self._storage.pop(key, default)

    def __delitem__(self, key: StashKey[T]) -> None:
        """Remove ``key``.

        :raises KeyError: ``key`` was never set.
        """
        _check(key)
        del self._storage[key]

    def __contains__(self, key: StashKey[T]) -> bool:
        """Whether ``key`` was set."""
        _check(key)
        return key in self._storage

    def __len__(self) -> int:
        """How many keys are set."""
        return len(self._storage)
