"""Coverage for a fuzz target's imports: ``with instrumented.imports(__name__):``.

Run as a script under the fuzzer, a target imports ndindex and the
harness inside the block so that atheris instruments them (coverage
guides the fuzzer); imported by pytest, which replays the corpus, or
without atheris installed, the block is plain imports.  This module is
imported before the block: it is not ours to cover.
"""

from __future__ import annotations

import contextlib


def imports(name: str):
    """The context to import a target's modules in (name: the target's __name__)."""
    if name == "__main__":
        try:
            import atheris
        except ImportError:  # harness.fuzz says so when asked to fuzz
            return contextlib.nullcontext()
        return atheris.instrument_imports(include=["ndindex", "harness"])
    return contextlib.nullcontext()
