"""covey: federated learning for heterogeneous edge devices (command line and glue)."""
