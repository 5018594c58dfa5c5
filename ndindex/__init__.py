"""ndindex: an embedded on-disk near-duplicate index for 64-bit fingerprints.

    >>> import ndindex
    >>> with ndindex.Index.create("pages.ndx", k=3, expected_n=1_000_000) as ix:
    ...     n = ix.add([0x0123456789ABCDEF], keys=["https://example.org/"])
    ...     ix.query(0x0123456789ABCDEE)
    [Match(fingerprint=81985529216486895, distance=1, keys=('https://example.org/',))]
"""

import importlib
import sys
import types

from ndindex.errors import (BusyError, CapacityError, ClosedError, CorruptionError, FormatError,
                            NdindexError, ReadOnlyError)

#: The module each public name comes from.  They are imported on first use
#: (PEP 562), so that ``import ndindex``, and the ``ndindex`` command, load
#: only what they touch: the index needs numpy and LMDB, but not the
#: fingerprinting package, the dedup job (sqlite3, worker processes) or zstd.
_SOURCES = {
    "Index": "ndindex.index", "Match": "ndindex.index", "MATCH_DTYPE": "ndindex.index",
    "open": "ndindex.index",
    "Plan": "ndindex.plan", "choose_plan": "ndindex.plan",
    "dedup": "ndindex.dedup", "DedupResult": "ndindex.dedup", "Cluster": "ndindex.dedup",
    "DuplicateFile": "ndindex.dedup",
    "near_duplicate_pairs": "ndindex.documents", "near_duplicate_clusters": "ndindex.documents",
}

__all__ = [
    "Index", "Match", "MATCH_DTYPE", "open", "Plan", "choose_plan",
    "NdindexError", "FormatError", "CorruptionError", "ClosedError", "CapacityError",
    "ReadOnlyError", "BusyError", "dedup", "DedupResult", "Cluster", "DuplicateFile",
    "near_duplicate_pairs", "near_duplicate_clusters",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Import a public name's module on first use and keep the name here."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'ndindex' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_SOURCES))


class _Package(types.ModuleType):
    """The package module, keeping ``ndindex.dedup`` the function.

    Importing the submodule ``ndindex.dedup`` (``importlib.import_module``,
    or any module that imports it first) binds it as the package attribute
    ``dedup``, over the function of that name.  Eager imports hid this by
    importing the function after the module; here the function is put back
    as the module is bound.  Reach the module with
    ``importlib.import_module("ndindex.dedup")``.
    """

    def __setattr__(self, name, value):
        if name == "dedup" and isinstance(value, types.ModuleType):
            value = value.dedup
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
