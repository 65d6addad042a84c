"""``covey site sample-data DIR``: one LEAF writer per board, in its bundle, for a trial."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from covey.cli import main
from tests.site.conftest import init


def leaf(folder: Path, writers: list[str]) -> Path:
    """A LEAF folder with train/ and test/, each writer with 3 and 2 samples of 4 features."""
    for split, n in (("train", 3), ("test", 2)):
        (folder / split).mkdir(parents=True)
        data = {w: {"x": [[float(i)] * 4 for i in range(n)], "y": list(range(n))} for w in writers}
        doc = {"users": writers, "num_samples": [n] * len(writers), "user_data": data}
        (folder / split / "data.json").write_text(json.dumps(doc))
    return folder


def test_each_board_gets_its_own_writer_in_its_bundle(site_parent: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    site = init(site_parent / "site", "b2", "a1")
    root = leaf(tmp_path / "leaf", ["w0", "w1", "w2"])

    # Execute
    code = main(["site", "sample-data", str(site.layout.root), "--data-dir", str(root)])

    # Assert: boards in id order take writers in file order; the files hold those writers' data
    assert code == 0
    out = capsys.readouterr().out
    assert "a1: writer w0, 3 training and 2 test samples" in out and "b2: writer w1" in out
    with np.load(site.layout.bundle("b2") / "train.npz") as train:
        assert train["x"].shape == (3, 4) and list(train["y"]) == [0, 1, 2]
    assert (site.layout.bundle("a1") / "test.npz").exists()


def test_more_boards_than_writers_is_one_line(site_parent: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    site = init(site_parent / "site", "a1", "b2")
    root = leaf(tmp_path / "leaf", ["w0"])
    code = main(["site", "sample-data", str(site.layout.root), "--data-dir", str(root)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "1 writers with train and test data, and the site has 2 boards" in err[0]
    assert not (site.layout.bundle("a1") / "train.npz").exists()


@pytest.mark.parametrize("missing", ["site", "leaf"])
def test_a_missing_folder_is_one_line(site_parent: Path, tmp_path: Path, capsys, missing: str) -> None:  # type: ignore[no-untyped-def]
    site = init(site_parent / "site", "a1")
    folder = str(tmp_path / "nowhere") if missing == "site" else str(site.layout.root)
    data_dir = tmp_path / "nowhere" if missing == "leaf" else leaf(tmp_path / "l", ["w"])
    code = main(["site", "sample-data", folder, "--data-dir", str(data_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "nowhere" in err[0], err
