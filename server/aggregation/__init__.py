"""Aggregation rules: FedAvg, server optimizers, inter-group, hierarchical, DSC weights."""
