"""ndindex: an embedded on-disk near-duplicate index for 64-bit fingerprints.

    >>> import ndindex
    >>> with ndindex.Index.create("pages.ndx", k=3, expected_n=1_000_000) as ix:
    ...     n = ix.add([0x0123456789ABCDEF], keys=["https://example.org/"])
    ...     ix.query(0x0123456789ABCDEE)
    [Match(fingerprint=81985529216486895, distance=1, keys=('https://example.org/',))]
"""

from ndindex.errors import (CapacityError, ClosedError, CorruptionError, FormatError,
                            NdindexError, ReadOnlyError)
from ndindex.index import MATCH_DTYPE, Index, Match, open
from ndindex.plan import Plan, choose_plan
# The function shadows its module as an attribute of the package: reach the
# module with importlib.import_module("ndindex.dedup").
from ndindex.dedup import Cluster, DedupResult, DuplicateFile, dedup  # noqa: E402
from ndindex.documents import near_duplicate_clusters, near_duplicate_pairs  # noqa: E402

__all__ = [
    "Index", "Match", "MATCH_DTYPE", "open", "Plan", "choose_plan",
    "NdindexError", "FormatError", "CorruptionError", "ClosedError", "CapacityError",
    "ReadOnlyError", "dedup", "DedupResult", "Cluster", "DuplicateFile",
    "near_duplicate_pairs", "near_duplicate_clusters",
]
__version__ = "0.1.0"
