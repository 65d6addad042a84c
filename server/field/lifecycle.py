"""A context manager made of ``open()`` and ``close()``, for the lab's parts that mount,
register or start things: ``close()`` runs when the block ends, and also when ``open()``
fails halfway, so nothing it already set up is left behind."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T", bound="OpenClose")


class OpenClose:
    """Subclasses implement :meth:`open` and an idempotent :meth:`close` that undoes any
    part of what ``open`` did."""

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: T) -> T:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
