"""``covey server run``'s recorded settings: what the results JSON says the run used."""

from __future__ import annotations

from pathlib import Path

from server.coordinator.config import CoordinatorConfig
from server.serve import ServeOptions, prepare_serve


def test_the_recorded_settings_name_the_codec_and_the_evaluation_schedule(tmp_path: Path) -> None:
    opts = ServeOptions(
        CoordinatorConfig("r", "127.0.0.1", 1883, tmp_path / "state", codec="int4", federated_eval_every=5),
        strategy="fedavg",
        strategy_params={},
        model_path=tmp_path / "mlp_femnist.tflite",
        rounds=3,
        min_devices=10,
    )
    settings = prepare_serve(opts).settings
    assert settings["codec"].value == "int4"
    assert (
        settings["federated_eval_every"].value == 5
        and settings["federated_eval_every"].detail == "--federated-eval-every"
    )
