"""A cache of parsed data sets, keyed by the content of the files they were parsed from.

Parsing FEMNIST's LEAF JSON takes over a second on every run; reading the same arrays
back from an uncompressed ``.npz`` takes a small fraction of that. An entry's key is
the SHA-256 of every source file's bytes with its name (the data files and the
modules that parse them), not of their size and modification time: hashing the 42 MB of the FEMNIST
sample costs little beside parsing it, and a stat-based key would miss an edit that keeps the size
and the mtime (``cp -p``, ``rsync -t``, a coarse-mtime file system). A changed file
changes the key, so a stale entry is never read; it is deleted when its replacement
is written. Entries are plain ``.npz`` (``allow_pickle=False``), written atomically
under ``$COVEY_CACHE_DIR`` (else ``$XDG_CACHE_HOME/covey``, else ``~/.cache/covey``),
in ``data/``. A cache that cannot be written or read is skipped: the data are parsed
as before.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from pathlib import Path

import numpy as np

from server.paths import cache_dir

Arrays = Mapping[str, np.ndarray]
_savez: Callable[..., None] = np.savez  # (numpy's stub reads **arrays as its allow_pickle flag)


class CacheOutcome(Enum):
    HIT = "hit"  # read back from the cache
    MISS = "miss"  # built, and stored for the next run
    UNSTORED = "unstored"  # built; the cache could not be written


def content_key(kind: str, files: Iterable[Path]) -> str:
    """SHA-256 over ``kind`` and each file's name and bytes, in the given order."""
    digest = hashlib.sha256(f"{kind}\0".encode())
    for path in files:
        with open(path, "rb") as handle:
            file_digest = hashlib.file_digest(handle, "sha256").digest()
        digest.update(path.name.encode() + b"\0" + file_digest)
    return digest.hexdigest()


def entry_path(kind: str, source: Path, key: str) -> Path:
    """``<cache>/data/<kind>-<source digest>-<key>.npz``: one live entry per source folder."""
    where = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
    return cache_dir() / "data" / f"{kind}-{where}-{key[:32]}.npz"


def _read(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None  # missing or damaged: parse again


def _write(path: Path, arrays: Arrays) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                _savez(handle, allow_pickle=False, **arrays)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        stem = path.name.rsplit("-", 1)[0] + "-"
        for old in path.parent.glob(f"{stem}*.npz"):  # the same folder's entries for older contents
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        return False
    return True


def load_or_build(
    kind: str, source: Path, files: list[Path], build: Callable[[], Arrays]
) -> tuple[dict[str, np.ndarray], CacheOutcome]:
    """The arrays ``build()`` returns for ``files``, from the cache when their content is unchanged.

    Parameters
    ----------
    kind : what the entry holds (``"leaf"``); part of the key and of the file name.
    source : the folder the files come from (one live entry per folder).
    files : every file ``build`` reads, and the code it parses them with, in a stable order.
    build : parses the files; called only on a miss.

    Returns
    -------
    The arrays by name, and whether they came from the cache.
    """
    path = entry_path(kind, source, content_key(kind, files))
    cached = _read(path) if path.exists() else None
    if cached is not None:
        return cached, CacheOutcome.HIT
    arrays = {name: np.ascontiguousarray(a) for name, a in build().items()}
    return arrays, CacheOutcome.MISS if _write(path, arrays) else CacheOutcome.UNSTORED
