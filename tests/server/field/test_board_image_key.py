"""An emulated board's image is rebuilt when what a board installs changes, and only then.

On 2026-11-27 adding a developer tool (pytest-xdist) to the ``dev`` extra rebuilt both
board images (about ten minutes each, from a Debian mirror) though no board installs it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from server.field.boards import image_key

REPO = Path(__file__).resolve().parents[3]


def _repo(tmp_path: Path, edit: tuple[str, str] | None = None) -> Path:
    """The files an image key reads, copied, with one text replacement."""
    root = tmp_path / f"repo{len(list(tmp_path.iterdir()))}"
    (root / "firmware_scripts").mkdir(parents=True)
    shutil.copy(REPO / "firmware_scripts" / "install-device.sh", root / "firmware_scripts")
    text = (REPO / "pyproject.toml").read_text()
    if edit is not None:
        assert edit[0] in text, edit
        text = text.replace(edit[0], edit[1], 1)
    (root / "pyproject.toml").write_text(text)
    return root


def test_a_developer_or_server_dependency_leaves_the_board_image_as_it_is(tmp_path: Path) -> None:
    base = image_key("arm64", _repo(tmp_path))
    dev = image_key("arm64", _repo(tmp_path, ("dev = [", 'dev = [\n    "some-dev-tool>=1",')))
    server = image_key("arm64", _repo(tmp_path, ('    "ortools>=9.10",', '    "ortools>=9.11",')))
    markers = image_key("armhf", _repo(tmp_path, ("markers = [", 'markers = [\n    "new: a marker",')))

    assert dev == base and server == base
    assert markers == image_key("armhf", _repo(tmp_path))


def test_what_a_board_installs_changes_the_board_image(tmp_path: Path) -> None:
    base = image_key("arm64", _repo(tmp_path))
    agent = image_key("arm64", _repo(tmp_path, ('    "paho-mqtt>=2.0",', '    "paho-mqtt>=2.1",')))
    litert = image_key("arm64", _repo(tmp_path, ('"ai-edge-litert>=1.2"', '"ai-edge-litert>=1.3"')))
    numpy = image_key("arm64", _repo(tmp_path, ('dependencies = ["numpy>=1.23"]', 'dependencies = ["numpy>=1.24"]')))

    assert len({base, agent, litert, numpy}) == 4
    assert image_key("armhf", _repo(tmp_path)) != base  # each architecture its own image
