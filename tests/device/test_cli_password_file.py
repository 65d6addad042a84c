"""``password_file`` / ``--password-file``, and paths in a config file relative to it.

The password is read at start, before the agent reads its data, writes its state
folder or connects; a missing, empty or conflicting one is one line and exit status
2. A relative path in a config file is relative to the file's folder, so a site
bundle (``device.toml`` beside ``password`` and ``ca.crt``) works where it lies and
wherever it is copied.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.device.test_cli_mistakes import assert_one_line_error, data, run_main  # noqa: F401 (fixture)


def bundle(folder: Path, data_path: Path, *lines: str) -> Path:
    """A device.toml as a site bundle holds it, with ``lines`` added."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "device.toml"
    base = ['broker = "127.0.0.1:1"', 'run = "r"', 'id = "pi-1"', 'username = "pi-1"', f'data = "{data_path}"']
    config.write_text("\n".join([*base, *lines]) + "\n")
    return config


def test_a_missing_password_file_names_the_config_key_and_the_file(
    tmp_path: Path,
    data: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = bundle(tmp_path / "bundle", data, 'password_file = "password"', f'state_dir = "{tmp_path / "state"}"')
    line = assert_one_line_error(*run_main(capsys, "--config", str(config)), "password_file", "does not exist")
    assert str(config) in line and str(tmp_path / "bundle" / "password") in line  # relative to the config
    assert not (tmp_path / "state").exists()


def test_an_empty_password_file_is_refused(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    (tmp_path / "pw").write_text("\n")
    argv = ["--broker", "127.0.0.1:1", "--run", "r", "--data", str(data), "--password-file", str(tmp_path / "pw")]
    assert_one_line_error(*run_main(capsys, *argv, "--state-dir", str(tmp_path / "state")), "--password-file", "empty")
    assert not (tmp_path / "state").exists()


def test_password_and_password_file_together_in_a_config_are_refused(
    tmp_path: Path,
    data: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "password").write_text("secret\n")
    config = bundle(folder, data, 'password = "other"', 'password_file = "password"')
    assert_one_line_error(*run_main(capsys, "--config", str(config)), "password", "password_file", "keep one")


def test_a_flag_overrides_the_configs_password_in_either_form(
    tmp_path: Path,
    data: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare: the config has a password; the flag gives a file (and the other way round)
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "password").write_text("secret\n")
    state = ["--state-dir", str(tmp_path / "state")]
    with_password = bundle(folder, data, 'password = "other"')

    # Execute: both get past the settings to the (closed) broker
    first = run_main(capsys, "--config", str(with_password), "--password-file", str(folder / "password"), *state)
    with_file = bundle(folder, data, 'password_file = "password"')
    second = run_main(capsys, "--config", str(with_file), "--password", "x", *state)

    # Assert
    for result in (first, second):
        assert_one_line_error(*result, "127.0.0.1:1")


def test_relative_tls_paths_in_a_config_are_relative_to_it(
    tmp_path: Path,
    data: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = bundle(tmp_path / "bundle", data, 'ca_certs = "ca.crt"')
    line = assert_one_line_error(*run_main(capsys, "--config", str(config)), "ca_certs", "does not exist")
    assert str(tmp_path / "bundle" / "ca.crt") in line
