"""DSC: Dual-Segment Clustering (Sun et al., IEEE Wireless Commun. Letters, Sec. III).

Two rounds of affinity propagation (AP, Eq. 9-11; scikit-learn's implementation):

1. *Primary groups* from communication quality: AP on a similarity built from the
   SNR matrix Γ (Eq. 7-8), with preference values P_k on the diagonal.
2. *Secondary groups* inside each primary group from data: AP on S_d (Eq. 13), built
   from the label-information matrix Ξ (Eq. 12),
   ``Ξ(k, ι) = -(C_k^ι / D) log(D C_k^ι / (D_k C^ι))``, with
   ``s(i, k) = (sum_ι (Ξ(i, ι) - Ξ(k, ι))²)²``. The similarity *grows* with the
   difference, as the letter intends: a secondary group should hold as many labels
   as possible, so clients with complementary labels are drawn together.

AP stops when the exemplars stay unchanged for ``T_cl = 15`` iterations (the
letter's value). Clients AP leaves unassigned (no convergence, or a primary group
too small to split) join the nearest group by Euclidean distance of their Ξ rows
to the groups' mean Ξ rows.

Primary similarity. Eq. (8) puts ``-γ_ik²`` off the diagonal, with γ the SNR as a
power ratio (Sec. II-B defines ``γ = p|h|²/σ²``, not decibels). Printed that way, a
pair with a *strong* link is the *least* similar (at the letter's link budget, about
-35 to -115 dB, a -35 dB pair scores -1e-7 and a -115 dB pair -1e-23): AP would
group clients that hear each other badly. ``snr_similarity="paper"`` computes exactly
that, from Γ given in dB: ``-(10^(Γ/10))²``. (An earlier covey squared the dB values,
``-(Γ_dB)²``, which ranks the pairs the other way round and is not Eq. 8.) covey's
default, ``snr_similarity="profile"``, is the usual AP similarity: the negative
squared Euclidean distance between clients' SNR profiles (rows of Γ in dB), which puts
clients with similar links together.
"""

from __future__ import annotations

import warnings

import numpy as np

from server.errors import GroupingError
from server.grouping._checks import RandomState, as_generator, check_counts, check_square

T_CL = 15


def label_information(counts: np.ndarray) -> np.ndarray:
    """Ξ of Eq. (12), clients x labels (0 where a client has no sample of a label)."""
    c = check_counts(counts)
    total = c.sum()
    if total <= 0:
        raise GroupingError("class counts are all zero")
    per_client = c.sum(1, keepdims=True)
    per_label = c.sum(0, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = total * c / (per_client * per_label)
        xi = -(c / total) * np.log(ratio)
    return np.where(c > 0, xi, 0.0)


def data_similarity(xi: np.ndarray) -> np.ndarray:
    """Off-diagonal s(i, k) of Eq. (13): squared squared-distance of Ξ rows."""
    sq = ((xi[:, None, :] - xi[None, :, :]) ** 2).sum(-1)
    return sq**2


def snr_similarity_matrix(snr_db: np.ndarray, mode: str = "profile") -> np.ndarray:
    """Similarity for the primary AP from the SNR matrix Γ (dB), Eq. (8)."""
    gamma = check_square(snr_db, "SNR matrix", symmetric=True)
    if mode == "profile":
        return -((gamma[:, None, :] - gamma[None, :, :]) ** 2).sum(-1)
    if mode == "paper":  # Eq. (8) as printed: γ as a power ratio
        return -((10.0 ** (gamma / 10.0)) ** 2)
    raise GroupingError(f"snr_similarity must be 'profile' or 'paper', got {mode!r}")


def affinity_propagation(
    similarity: np.ndarray, preference: float | np.ndarray | None, random_state: np.random.Generator
) -> np.ndarray:
    """AP labels (Eq. 9-11) with ``T_cl`` unchanged iterations; -1 where AP did not converge."""
    n = len(similarity)
    off = similarity[~np.eye(n, dtype=bool)]
    if n == 1 or np.ptp(off) == 0:  # nothing to tell the clients apart: one group
        return np.zeros(n, np.int64)
    from sklearn.cluster import AffinityPropagation  # here: scikit-learn takes seconds to import
    from sklearn.exceptions import ConvergenceWarning

    ap = AffinityPropagation(
        affinity="precomputed",
        preference=preference,
        convergence_iter=T_CL,
        max_iter=400,
        damping=0.5,
        random_state=int(random_state.integers(2**31 - 1)),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        labels = ap.fit_predict(similarity)
    return np.asarray(labels, np.int64)


def dsc_groups(
    snr_db: np.ndarray,
    counts: np.ndarray,
    *,
    snr_preference: float | None = None,
    data_preference: float | None = None,
    snr_similarity: str = "profile",
    random_state: RandomState = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Primary and final (secondary) group labels of every client.

    Preferences default to the median similarity (scikit-learn's default, which lets
    AP choose a moderate number of groups, as the letter requires no preset count).
    """
    counts = check_counts(counts)
    gamma = check_square(snr_db, "SNR matrix", symmetric=True)
    if len(gamma) != len(counts):
        raise GroupingError(f"SNR matrix is {len(gamma)}x{len(gamma)} but there are {len(counts)} clients")
    rng = as_generator(random_state)
    primary = affinity_propagation(snr_similarity_matrix(gamma, snr_similarity), snr_preference, rng)
    if (primary < 0).all():  # AP did not converge: one primary group
        primary = np.zeros(len(counts), np.int64)
    xi = label_information(counts)
    final = np.full(len(counts), -1, np.int64)
    next_label = 0
    for p in np.unique(primary[primary >= 0]):
        members = np.flatnonzero(primary == p)
        if len(members) < 3:
            final[members] = next_label
            next_label += 1
            continue
        labels = affinity_propagation(data_similarity(xi[members]), data_preference, rng)
        for lab in np.unique(labels[labels >= 0]):
            final[members[labels == lab]] = next_label
            next_label += 1
    _join_nearest(final, xi)
    return primary, final


def _join_nearest(labels: np.ndarray, xi: np.ndarray) -> None:
    """Unassigned clients (label -1) join the group with the nearest mean Ξ row."""
    lost = np.flatnonzero(labels < 0)
    if not len(lost):
        return
    groups = np.unique(labels[labels >= 0])
    if not len(groups):
        labels[:] = 0
        return
    centres = np.array([xi[labels == g].mean(0) for g in groups])
    dist = ((xi[lost][:, None, :] - centres[None, :, :]) ** 2).sum(-1)
    labels[lost] = groups[np.argmin(dist, axis=1)]


class DualSegmentClustering:
    """DSC as an estimator: ``DualSegmentClustering().fit(snr_db, counts).labels_``.

    Attributes: ``labels_`` (final groups), ``primary_labels_``, ``n_groups_``.
    """

    def __init__(
        self,
        *,
        snr_preference: float | None = None,
        data_preference: float | None = None,
        snr_similarity: str = "profile",
        random_state: RandomState = None,
    ) -> None:
        if snr_similarity not in ("profile", "paper"):
            raise GroupingError(f"snr_similarity must be 'profile' or 'paper', got {snr_similarity!r}")
        self.snr_preference = snr_preference
        self.data_preference = data_preference
        self.snr_similarity = snr_similarity
        self.random_state = random_state

    def fit(self, snr_db: np.ndarray, counts: np.ndarray) -> DualSegmentClustering:
        self.primary_labels_, self.labels_ = dsc_groups(
            snr_db,
            counts,
            snr_preference=self.snr_preference,
            data_preference=self.data_preference,
            snr_similarity=self.snr_similarity,
            random_state=self.random_state,
        )
        self.n_groups_ = int(self.labels_.max()) + 1
        return self
