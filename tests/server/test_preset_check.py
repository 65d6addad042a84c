"""``covey presets --check`` (issue 29): every setting a preset's runs take from covey's
defaults or the authors' code, not the paper, is a listed departure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from covey.cli import main
from server.settings import Source
from server.simulation.preset_check import run_settings, unlisted_departures
from server.simulation.presets import PRESETS, Preset


def without(preset: Preset, cover: str) -> Preset:
    """``preset`` with the departures that cover ``cover`` removed."""
    return replace(preset, departures=tuple(d for d in preset.departures if cover not in d.covers))


def test_covey_presets_check_passes_on_the_shipped_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "--check"]) == 0
    assert "every preset (3) lists each of its runs' departures" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("preset_name", "cover", "expected"),
    [
        # ICG's balanced draw (covey's) where the paper draws at random
        ("fedgsp-femnist", "fedgsp:strategy.icg_draw", [("fedgsp", "strategy.icg_draw")]),
        # weighted chain averaging where Alg. 1 line 14 averages plainly
        ("fedgsp-femnist", "fedgsp:strategy.weighted", [("fedgsp", "strategy.weighted")]),
        # 50 pre-training steps: the public code's, not the paper's
        # and the convex inter-group form: the public code's, not the paper's
        (
            "flexcfl-synthetic",
            "strategy.pretrain_steps",
            [("flexcfl", "strategy.eta_g_form"), ("flexcfl", "strategy.pretrain_steps")],
        ),
        # IFCA's perturbed starts, and FeSEM as the public code runs it
        ("flexcfl-synthetic", "ifca:starts", [("ifca", "starts"), ("fesem", "strategy.variant")]),
    ],
)
def test_a_departure_left_out_is_named(preset_name: str, cover: str, expected: list[tuple[str, str]]) -> None:
    unlisted = unlisted_departures(without(PRESETS[preset_name], cover))
    assert [(u.strategy, u.key) for u in unlisted] == expected
    assert str(unlisted[0]).startswith(f"{preset_name}: {expected[0][0]}: {expected[0][1]} = ")


def test_screening_on_is_a_departure_named_for_every_method_of_the_preset() -> None:
    """The presets run without screening (the papers screen nothing); one that left it
    at covey's default would depart for every method it runs."""
    preset = PRESETS["fedgroup-synthetic"]
    screened = replace(preset, settings={k: v for k, v in preset.settings.items() if k != "screening"})
    unlisted = unlisted_departures(screened)
    assert sorted((u.strategy, u.key) for u in unlisted if u.key in ("screening", "norm_factor")) == sorted(
        (s, key) for s in ("fedgroup", "fedavg", "fedprox", "ifca", "fesem") for key in ("screening", "norm_factor")
    )


def test_pretraining_steps_are_recorded_as_the_authors_code_not_the_paper() -> None:
    settings = run_settings(PRESETS["flexcfl-synthetic"], "flexcfl")
    assert settings["strategy.pretrain_steps"].source is Source.CODE
    assert "morningD/FlexCFL" in settings["strategy.pretrain_steps"].detail
    assert settings["strategy.alpha"].source is Source.PAPER
    assert settings["strategy.shift_fraction"].source is Source.PAPER  # Eq. (9)


def test_the_presets_cite_the_sections_that_hold_their_settings() -> None:
    assert "Sec. 4.1" in PRESETS["fedgsp-femnist"].paper and "Sec. 5 " not in PRESETS["fedgsp-femnist"].paper
    assert "Sec. IV-A" in PRESETS["fedgroup-synthetic"].paper
    assert "Sec. 5.1" in PRESETS["flexcfl-synthetic"].paper
