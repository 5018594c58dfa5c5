"""Replay the fuzz seed corpus and every input that once broke a target.

Each file in ``fuzz/corpus/<target>/`` and ``fuzz/regressions/<target>/``
goes through the target's ``check`` function, the same code the fuzzer runs,
so a fixed bug stays fixed under plain pytest (as zstd keeps the frames that
once broke its decoder).  atheris is not needed: the targets guard its import.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

FUZZ_DIR = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "fuzz")
FUZZ_DIR = os.path.normpath(FUZZ_DIR)
TARGETS = ("decode_block", "decode_code", "round_trip_blocks", "record_chunk", "decode_raw_block")


def target_module(name: str):
    """Import a fuzz target by name (fuzz/ is a directory of scripts, not a package)."""
    if FUZZ_DIR not in sys.path:
        sys.path.insert(0, FUZZ_DIR)
    return importlib.import_module(name)


def inputs():
    harness = target_module("harness")
    for target in TARGETS:
        for path in harness.corpus_files(FUZZ_DIR, target):
            rel = os.path.relpath(path, FUZZ_DIR)
            yield pytest.param(target, path, id=rel)


def test_every_target_has_seeds():
    harness = target_module("harness")
    for target in TARGETS:
        assert harness.corpus_files(FUZZ_DIR, target), f"no seeds for {target}"


@pytest.mark.parametrize("target, path", list(inputs()))
def test_fuzz_input_replays_clean(target, path):
    with open(path, "rb") as fh:
        data = fh.read()
    target_module(target).check(data)
