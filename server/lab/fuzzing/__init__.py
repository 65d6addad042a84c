"""Fuzzing covey's decoders of untrusted input: generated and mutated inputs.

Two sources of input per target (:mod:`server.lab.fuzzing.targets`):

* *generated*: hypothesis draws documents from each target's valid templates, every
  field kept, replaced by an arbitrary JSON value, dropped, or joined by unknown
  fields (:func:`perturbed`); a share of raw binary is mixed in;
* *mutated*: a valid encoding (a seed, or an earlier mutant) after byte-level
  mutations, or after structure-level ones on its parsed JSON/TOML tree
  (:mod:`server.lab.fuzzing.mutate`).

An exception that is not covey's own :class:`~device.errors.CoveyError` is a crash.
:func:`run_fuzz` returns the counts and the first crashes with the input and the
traceback's last line; ``bench/fuzz.py`` prints the figures, and a test runs a small
count in CI.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import CoveyError
from server.lab.fuzzing.mutate import mutate_bytes
from server.lab.fuzzing.targets import Target, all_targets

_ROOT = str(Path(__file__).resolve().parents[2])
__all__ = ["Crash", "FuzzReport", "Target", "all_targets", "run_fuzz"]


@dataclass(frozen=True)
class Crash:
    """An exception other than covey's own, raised by ``target`` on ``data``."""

    target: str
    error: str  # "TypeName: message"
    where: str  # the innermost frame: file, line and function
    data: bytes = field(repr=False)

    def describe(self, width: int = 160) -> str:
        shown = repr(self.data[:width]) + ("…" if len(self.data) > width else "")
        return f"{self.target}: {self.error} at {self.where}\n    input ({len(self.data)} bytes): {shown}"


@dataclass
class FuzzReport:
    inputs: dict[str, int] = field(default_factory=dict)  # per target
    refused: dict[str, int] = field(default_factory=dict)  # inputs refused with a CoveyError
    crashes: list[Crash] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total_inputs(self) -> int:
        return sum(self.inputs.values())

    def crash_kinds(self) -> dict[tuple[str, str], int]:
        """Crashes grouped by target and exception type with its innermost frame."""
        kinds: dict[tuple[str, str], int] = {}
        for c in self.crashes:
            key = (c.target, f"{c.error.split(':')[0]} at {c.where}")
            kinds[key] = kinds.get(key, 0) + 1
        return kinds


def _innermost_covey_frame(exc: BaseException) -> str:
    """``file:line function`` of the innermost traceback entry in covey's own code."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{_ROOT}/" in f.filename and "/fuzzing/" not in f.filename] or frames[-1:]
    f = ours[-1]
    return f"{f.filename.replace(_ROOT + '/', '')}:{f.lineno} {f.name}"


def _run_one(target: Target, data: bytes, report: FuzzReport) -> bool:
    """Decode ``data``; True when it was accepted (a candidate for the mutation pool)."""
    report.inputs[target.name] = report.inputs.get(target.name, 0) + 1
    try:
        target.decode(data)
    except CoveyError:
        report.refused[target.name] = report.refused.get(target.name, 0) + 1
        return False
    except Exception as exc:  # the point: anything else is a crash
        where = _innermost_covey_frame(exc)
        report.crashes.append(Crash(target.name, f"{type(exc).__name__}: {str(exc)[:200]}", where, data))
        return False
    return True


def _mutated(target: Target, n: int, rng: np.random.Generator, report: FuzzReport) -> None:
    pool: list[bytes] = list(target.seeds)
    for _ in range(n):
        parent = pool[int(rng.integers(len(pool)))]
        if rng.random() < 0.5:
            data = target.structured(parent, rng)
        else:
            data = mutate_bytes(parent, rng, target.seeds)
        if len(data) > 4 << 20:  # no decoder ever sees more than a few MB (message and frame limits)
            data = data[: 4 << 20]
        if _run_one(target, data, report) and len(pool) < 512 and len(data) <= 8192 and data not in pool:
            pool.append(data)  # accepted mutants are mutated further


def perturbed(template: Any) -> Any:
    """A hypothesis strategy: ``template`` with each field kept (perturbed further
    inside containers), replaced by any JSON value, or dropped, and unknown fields added."""
    from hypothesis import strategies as st

    from server.lab.fuzzing.mutate import INTERESTING_INTS

    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.sampled_from(INTERESTING_INTS)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=80)
    )
    anything = st.recursive(
        leaves,
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
        max_leaves=12,
    )

    @st.composite
    def draw_tree(draw: Any, value: Any) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                choice = draw(st.integers(0, 9))
                if choice == 0:
                    continue
                out[k] = draw(anything) if choice == 1 else draw(draw_tree(v))
            if draw(st.integers(0, 9)) == 0:
                out[draw(st.text(max_size=10))] = draw(anything)
            return out
        if isinstance(value, list):
            items = [draw(draw_tree(v)) for v in value[:16]]
            if draw(st.integers(0, 5)) == 0:
                items.append(draw(anything))
            return items
        choice = draw(st.integers(0, 5))
        if choice == 0:
            return draw(anything)
        if choice == 1 and isinstance(value, int) and not isinstance(value, bool):
            return value + draw(st.integers(-2, 2))
        return value

    return draw_tree(template)


def _generated(target: Target, n: int, seed: int, report: FuzzReport) -> None:
    if n <= 0:
        return
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    documents = st.sampled_from(target.templates).flatmap(perturbed).map(target.encode_tree)
    source = st.one_of(documents, documents, documents, st.binary(max_size=512))
    budget = {"left": n}

    @hypothesis_seed(seed)
    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(source)
    def check(data: bytes) -> None:
        if budget["left"] > 0:
            budget["left"] -= 1
            _run_one(target, data, report)

    check()
    # hypothesis may stop early on a small search space: the rest are mutated inputs
    if budget["left"] > 0:
        _mutated(target, budget["left"], np.random.default_rng([seed, 1]), report)


def run_fuzz(
    inputs: int = 100_000,
    *,
    random_state: int = 0,
    generated_fraction: float = 0.25,
    targets: Sequence[Target] | None = None,
) -> FuzzReport:
    """Feed ``inputs`` inputs, split evenly over ``targets`` (default: every decoder).

    Parameters
    ----------
    inputs : total number of inputs.
    random_state : seeds the mutations (one ``np.random.Generator``) and hypothesis.
    generated_fraction : share of each target's inputs drawn by hypothesis; the rest
        are mutations of valid encodings.
    targets : the decoders (:func:`all_targets`).
    """
    targets = list(targets) if targets is not None else all_targets()
    rng = np.random.default_rng(random_state)
    report = FuzzReport()
    start = time.perf_counter()
    for i, target in enumerate(targets):
        share = inputs // len(targets) + (1 if i < inputs % len(targets) else 0)
        n_gen = round(share * generated_fraction)
        for data in target.seeds:  # the seeds themselves must decode (or be refused) cleanly
            _run_one(target, data, report)
        _generated(target, max(0, n_gen - len(target.seeds)), random_state + i, report)
        _mutated(target, share - n_gen, rng, report)
    report.seconds = time.perf_counter() - start
    return report
