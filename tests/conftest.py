"""Shared fixtures: the HLO corpus in ../shared/corpus/hlo (skipped cleanly where absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus" / "hlo"


def corpus_files() -> list[Path]:
    return sorted(CORPUS.glob("*.hlo")) if CORPUS.is_dir() else []


@pytest.fixture
def corpus_dir() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"HLO corpus not found at {CORPUS} (it lives in ../shared/corpus/hlo)")
    return CORPUS


def corpus_file(name: str) -> Path:
    p = CORPUS / name
    if not p.is_file():
        pytest.skip(f"corpus file {p} not found (the corpus lives in ../shared/corpus/hlo)")
    return p
