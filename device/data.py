"""Read a device's local data set: LEAF JSON, ``.npz`` or CSV.

Only class counts ever leave the device (:func:`class_counts`); samples stay here.

Formats
-------
LEAF JSON
    ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``
    (the format of LEAF's FEMNIST, Shakespeare, Sent140 downloads). A folder of such
    files is read as a whole; one user is one client.
``.npz``
    Arrays ``x`` (samples × features…) and ``y`` (integer labels).
CSV
    One sample per row, label in the first column, features after it; a header row
    is skipped when its first cell is not a number.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import DataError

FORMATS = "a LEAF .json file or folder, an .npz with arrays x and y, or a .csv with the label first"


@dataclass(frozen=True)
class Dataset:
    """Features and integer labels of one client."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise DataError(f"{self.x.shape[0]} samples but {self.y.shape[0]} labels")

    def __len__(self) -> int:
        return int(self.y.shape[0])


def class_counts(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """The class-count vector V^k a device announces (FedGSP Sec. 4.2)."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise DataError(f"labels outside [0, {n_classes}) cannot be counted")
    # intp, not int64: on a 32-bit board bincount refuses to cast int64 down to its int32
    # index type (an armv7l agent crashed at registration; issue 25)
    return np.bincount(labels.astype(np.intp), minlength=n_classes).astype(np.int64)


def leaf_files(path: Path) -> list[Path]:
    """The LEAF JSON files :func:`read_leaf` reads for ``path`` (a file, or a folder's sorted ``*.json``)."""
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".json")
        if not files:
            raise DataError(f"{path} holds no .json files; a LEAF folder holds train/*.json or test/*.json")
        return files
    raise DataError(f"{path} does not exist; give a LEAF .json file or a folder of them")


def _leaf_user(name: str, record: Any, where: str) -> Dataset:
    if not isinstance(record, dict) or "x" not in record or "y" not in record:
        raise DataError(f"{where}: user {name!r} needs 'x' and 'y' lists")
    try:
        x = np.asarray(record["x"], dtype=np.float32)
        y = np.asarray(record["y"])
    except (ValueError, TypeError) as exc:
        raise DataError(f"{where}: user {name!r} has ragged or non-numeric samples ({exc})") from None
    if x.ndim < 2 and len(x):
        raise DataError(f"{where}: user {name!r}: 'x' must be a list of samples")
    if y.ndim != 1 or (len(y) and not np.issubdtype(y.dtype, np.integer)):
        raise DataError(f"{where}: user {name!r}: 'y' must be a list of integer labels")
    if len(x) != len(y):  # checked before the reshape, which could otherwise regroup the values
        raise DataError(
            f"{where}: user {name!r} has {len(x)} samples in 'x' but {len(y)} labels in 'y'; "
            "every sample needs exactly one label"
        )
    return Dataset(x.reshape(len(y), -1) if len(y) else x.reshape(0, 0), y.astype(np.int64))


def read_leaf(path: Path | str) -> dict[str, Dataset]:
    """Read a LEAF JSON file or folder; return ``{user: Dataset}`` in file order.

    A user that appears in several files has its samples concatenated.
    """
    path = Path(path)
    users: dict[str, list[Dataset]] = {}
    for file in leaf_files(path):
        try:
            raw = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise DataError(f"{file} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        except OSError as exc:
            raise DataError(f"cannot read {file}: {exc.strerror}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("user_data"), dict):
            raise DataError(f"{file} is not in LEAF format: it needs a 'user_data' object")
        listed = raw.get("users")
        order: list[Any] = listed if isinstance(listed, list) else list(raw["user_data"])
        for name in order:
            if name not in raw["user_data"]:
                raise DataError(f"{file}: user {name!r} is listed but has no user_data")
            users.setdefault(str(name), []).append(_leaf_user(name, raw["user_data"][name], str(file)))
    return {
        name: parts[0]
        if len(parts) == 1
        else Dataset(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]))
        for name, parts in users.items()
    }


def read_npz(path: Path | str) -> Dataset:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            if "x" not in archive or "y" not in archive:
                raise DataError(f"{path} needs arrays named 'x' and 'y', has {sorted(archive.files)}")
            x, y = archive["x"], archive["y"]
    except FileNotFoundError:
        raise DataError(f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not a readable .npz file ({exc})") from None
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: labels 'y' have dtype {y.dtype}; integers expected")
    if x.ndim == 0 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        n_x = x.shape[0] if x.ndim else 0
        raise DataError(
            f"{path}: 'x' holds {n_x} samples but 'y' holds {y.size} labels; "
            "'x' needs one row per sample and 'y' one integer label per row"
        )
    return Dataset(np.asarray(x, np.float32), y.astype(np.int64))


def read_csv(path: Path | str) -> Dataset:
    path = Path(path)
    try:
        with path.open(newline="") as handle:
            rows = [row for row in csv.reader(handle) if row]
    except FileNotFoundError:
        raise DataError(f"{path} does not exist") from None
    if rows:
        try:
            float(rows[0][0])
        except ValueError:
            rows = rows[1:]  # header
    if not rows:
        raise DataError(f"{path} holds no samples")
    try:
        table = np.asarray(rows, dtype=np.float64)
    except ValueError:
        raise DataError(f"{path}: every row needs the same number of numeric cells") from None
    labels = table[:, 0]
    if not np.all(labels == np.round(labels)):
        raise DataError(f"{path}: the first column must hold integer labels")
    return Dataset(table[:, 1:].astype(np.float32), labels.astype(np.int64))


def read_dataset(path: Path | str, user: str | None = None) -> Dataset:
    """Read one client's data from a LEAF file/folder (``user`` picks the writer),
    an ``.npz`` or a ``.csv`` file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return read_npz(path)
    if suffix == ".csv":
        return read_csv(path)
    if path.is_file() and suffix != ".json":
        raise DataError(f"{path}: unknown data format {path.suffix or '(no extension)'!r}; give {FORMATS}")
    users = read_leaf(path)
    choose = 'choose one with --user ID (in a device.toml: user = "ID"; provision-device.sh --user ID)'
    if user is None:
        if len(users) != 1:
            raise DataError(f"{path} holds {len(users)} writers ({_listed(users)}); {choose}")
        return next(iter(users.values()))
    if user not in users:
        raise DataError(f"writer {user!r} is not in {path}, which holds {_listed(users)}; {choose}")
    return users[user]


def _listed(names: Iterable[str], limit: int = 12) -> str:
    """``a, b, c`` (the first ``limit``, then how many more)."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
