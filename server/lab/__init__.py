"""Experiment harnesses: what tests, benchmarks and the docs' measurements drive covey
with, never what a user's run imports (an import-linter contract in pyproject.toml).

* :mod:`server.lab.equivalence`: one strategy in simulation and over MQTT, compared;
* :mod:`server.lab.process_faults`: faults injected into real processes (kill a device,
  the broker or the coordinator, cut a connection) and what each costs a run;
* :mod:`server.lab.poisoning`: one poisoner among FEMNIST writers, boards and simulation;
* :mod:`server.lab.fuzzing`: generated and mutated inputs for every untrusted decoder.

Faults of *virtual* devices, which a simulation user asks for, are
:mod:`server.simulation.faults`.
"""
