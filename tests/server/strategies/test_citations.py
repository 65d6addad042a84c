"""Strategies and algorithms name their papers' first authors (author lines of the papers)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

import server.aggregation.dsc_weights
import server.aggregation.hierarchical
import server.grouping.dsc
import server.grouping.fedavg_ic
import server.strategies.dsc
import server.strategies.fedavg_ic
from server.strategies.dsc import DSC
from server.strategies.fedavg_ic import FedAvgIC

DOCS = Path(__file__).resolve().parents[3] / "docs" / "grouping.md"

# DSC: "Pengcheng Sun, Erwu Liu, ..."; FedAvg-IC: "Jin-woo Lee, Jaehoon Oh, ..., Se-Young Yoon"
CASES = [
    ("Sun et al.", "Zhang et al.", DSC.summary, server.strategies.dsc),
    ("Sun et al.", "Zhang et al.", DSC.summary, server.grouping.dsc),
    ("Sun et al.", "Zhang et al.", DSC.summary, server.aggregation.dsc_weights),
    ("Lee et al.", "Yoon et al.", FedAvgIC.summary, server.strategies.fedavg_ic),
    ("Lee et al.", "Yoon et al.", FedAvgIC.summary, server.grouping.fedavg_ic),
    ("Lee et al.", "Yoon et al.", FedAvgIC.summary, server.aggregation.hierarchical),
]


@pytest.mark.parametrize(("author", "wrong", "summary", "module"), CASES)
def test_first_authors_are_cited_correctly(author: str, wrong: str, summary: str, module: ModuleType) -> None:
    assert author in summary
    assert module.__doc__ is not None and author in module.__doc__ and wrong not in module.__doc__


def test_grouping_docs_cite_the_first_authors() -> None:
    text = DOCS.read_text()
    assert "DSC (Sun et al.)" in text and "FedAvg-IC (Lee et al.)" in text
    assert "Zhang et al." not in text and "Yoon et al." not in text
