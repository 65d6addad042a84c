"""FedAvg family: what the FedProx class records about its μ."""

from __future__ import annotations

from server.strategies import make_strategy
from server.strategies.fedavg import FedProx


def test_fedprox_records_the_authors_mu_for_synthetic_data() -> None:
    """The FedProx repository runs Synthetic(1,1) with ``bash run_fedprox.sh synthetic_1_1 0 1``:
    μ = 1 (the third argument), while the class default stays a generic 0.01."""
    # Prepare / Execute
    doc = FedProx.__doc__ or ""
    strategy = make_strategy("fedprox")

    # Assert
    assert "μ = 1" in doc and "run_fedprox.sh synthetic_1_1 0 1" in doc and "litian96/FedProx" in doc
    assert strategy.train.mu == 0.01
