"""Where covey finds bundled data and keeps built models."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from device.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent


def femnist_dir() -> Path:
    """The LEAF FEMNIST sample: ``$COVEY_FEMNIST_DIR``, else ``../shared/data/femnist``
    beside the checkout covey runs from, or beside the working folder (covey installed
    by ``install-server.sh`` lives in a virtualenv, and its commands run from the
    copy of the repository)."""
    configured = os.environ.get("COVEY_FEMNIST_DIR")
    sample = Path("shared") / "data" / "femnist"
    candidates = [Path(configured)] if configured else [REPO_ROOT.parent / sample, Path.cwd().parent / sample]
    for path in candidates:
        if (path / "train").is_dir() and (path / "test").is_dir():
            return path
    tried = " or ".join(str(p) for p in dict.fromkeys(candidates))
    raise ConfigError(
        f"FEMNIST data not found at {tried} (it needs train/ and test/ folders of LEAF JSON); "
        "set COVEY_FEMNIST_DIR or pass --data-dir"
    )


def cache_dir() -> Path:
    """``$COVEY_CACHE_DIR``, else ``$XDG_CACHE_HOME/covey``, else ``~/.cache/covey``."""
    configured = os.environ.get("COVEY_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "covey"


def models_source_hash() -> str:
    """A digest of the model-building code: built models are cached under it."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "models").glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_model(name: str, seed: int = 0) -> Path:
    """Path of the zoo model ``name``, building it (TensorFlow needed) if not cached.

    Processes that ask at once (two commands on a fresh cache, the test suite's
    workers) take turns on a lock file beside the model: one builds, the others then
    find it built. (A build killed while writing can leave a partial file that counts
    as built: delete the cache folder then.)"""
    out = cache_dir() / "zoo" / f"{models_source_hash()}-seed{seed}"
    model_path = out / f"{name}.tflite"
    if model_path.exists() and model_path.with_suffix(".json").exists():
        return model_path  # built (a read-only cache needs no lock)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not model_path.exists() or not model_path.with_suffix(".json").exists():
            from models.export import build

            build(name, out, seed=seed)
    return model_path
