"""ndindex: an embedded on-disk near-duplicate index for 64-bit fingerprints."""

from ndindex.errors import (CapacityError, ClosedError, CorruptionError, FormatError,
                            NdindexError, ReadOnlyError)

__all__ = [
    "NdindexError", "FormatError", "CorruptionError", "ClosedError", "CapacityError",
    "ReadOnlyError",
]
__version__ = "0.1.0"
