"""Where covey finds bundled data and keeps built models (see :mod:`server.paths`)."""

from server.paths import REPO_ROOT, cache_dir, ensure_model, femnist_dir, models_source_hash

__all__ = ["REPO_ROOT", "cache_dir", "ensure_model", "femnist_dir", "models_source_hash"]
