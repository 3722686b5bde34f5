"""Every input kept under tests/fuzz/corpus (seeds, and the inputs of crashes the fuzzer found, named crash-*)
through its target, in this process and without atheris: the fuzz targets' contracts hold on each, so a fixed
crash stays fixed. The fuzzing itself runs in tests/process/test_fuzz_targets.py and `make fuzz`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))  # run.py and seeds.py import `targets` as the fuzzer does

import run  # noqa: E402
import targets  # noqa: E402

CORPUS = FUZZ / "corpus"


def test_every_target_has_seeds_and_run_names_them_all() -> None:
    assert list(run.NAMES) == list(targets.TARGETS)
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(targets.TARGETS)
    assert all(any((CORPUS / name).iterdir()) for name in targets.TARGETS)


@pytest.mark.parametrize("name", list(targets.TARGETS))
def test_the_corpus_holds_the_contract(name: str) -> None:
    inputs = sorted((CORPUS / name).iterdir())
    for path in inputs:
        targets.TARGETS[name](path.read_bytes())
    assert sum(len(p.read_bytes()) for p in inputs) < 16 * 1024  # committed: kept small
