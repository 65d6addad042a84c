"""Running a round's plan, whatever carries the messages: group managers (when to send
and skip), what they send (:mod:`~server.execution.group_sender`), the shared start
models, and :class:`~server.execution.round.RoundExecution`, which runs one manager
per group over a bus and a clock it is handed (:mod:`server.execution.ports`). The
coordinator hands it the MQTT bus; the simulator an in-process one
(:mod:`server.simulation.virtual_bus`)."""
