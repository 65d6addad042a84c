"""Data for a trial without the boards' own data: one LEAF writer per board of a site.

``covey site sample-data DIR`` gives each board of the site one writer of a LEAF folder
(the shared FEMNIST sample by default), in the writers' file order, as ``train.npz``
and ``test.npz`` (arrays ``x`` and ``y``) inside the board's bundle, so that
``provision-device.sh BUNDLE BUNDLE/train.npz BUNDLE/test.npz`` installs it with the
rest. A field site's boards hold their own data instead (docs/site-guide.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device.data import read_leaf
from device.errors import ConfigError
from server.site.build import load_site


@dataclass(frozen=True)
class BoardData:
    """What one board got: the writer, and where its two files went."""

    device: str
    writer: str
    n_train: int
    n_test: int
    train: Path
    test: Path


def sample_data(site_dir: Path, leaf_root: Path) -> list[BoardData]:
    """Write one writer's train and test sets into each board's bundle of ``site_dir``."""
    site = load_site(site_dir)
    devices = sorted(p.name for p in site.layout.devices_dir.iterdir() if (p / "device.toml").is_file())
    if not devices:
        raise ConfigError(f"{site_dir} has no board bundles; add boards with `covey site add-device`")
    train, test = read_leaf(leaf_root / "train"), read_leaf(leaf_root / "test")
    writers = [w for w in train if w in test]
    if len(writers) < len(devices):
        raise ConfigError(
            f"{leaf_root} has {len(writers)} writers with train and test data, and the site has {len(devices)} boards"
        )
    done = []
    for device, writer in zip(devices, writers, strict=False):
        bundle = site.layout.bundle(device)
        paths = bundle / "train.npz", bundle / "test.npz"
        for path, data in zip(paths, (train[writer], test[writer]), strict=True):
            np.savez(path, x=data.x, y=data.y)
        done.append(BoardData(device, writer, len(train[writer]), len(test[writer]), *paths))
    return done
