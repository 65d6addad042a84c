"""A read-only page for a run: live beside the coordinator (``covey server run
--dashboard``) or as one static file from a finished run's results (``covey report``).
See :mod:`server.dashboard.live` for how the page gets its state and why."""
