"""Feature weights: binary, term frequency, log tf, tf-idf.

A weighting turns the feature hashes of one document (one per occurrence)
into distinct features with float weights.  Document frequencies for tf-idf
are learned from a corpus into an :class:`IdfTable`, which saves to and loads
from bytes (it travels inside ``Fingerprinter.to_bytes()``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

from ndindex.arrays import sorted_unique
from ndindex.errors import FormatError

WEIGHTINGS = ("binary", "tf", "logtf", "tfidf")

_IDF_MAGIC = b"NDIDF1\0\0"


class IdfTable:
    """Document frequencies of feature hashes, learned from a corpus.

    idf(f) = ln((1 + N) / (1 + df(f))) + 1 (smoothed, as scikit-learn), so
    a feature never seen gets the largest weight and none gets zero.

    Attributes:
        n_docs: N, documents seen.
        hashes: sorted distinct feature hashes (uint64).
        df: their document frequencies (uint32).
    """

    def __init__(self, n_docs: int = 0, hashes=None, df=None):
        self.n_docs = int(n_docs)
        self.hashes = np.asarray(hashes if hashes is not None else [], dtype=np.uint64)
        self.df = np.asarray(df if df is not None else [], dtype=np.uint32)
        if self.hashes.shape != self.df.shape:
            raise ValueError(f"hashes and df must have one shape, got {self.hashes.shape} "
                             f"and {self.df.shape}")

    @classmethod
    def learn(cls, feature_arrays: Iterable[np.ndarray]) -> IdfTable:
        """Return the table of a corpus given as one feature array per document.

        Cost: O(total features * log) time, O(distinct features) memory per
        batch of 4096 documents.
        """
        table = cls()
        batch: list[np.ndarray] = []
        for feats in feature_arrays:
            batch.append(sorted_unique(np.asarray(feats, dtype=np.uint64)))
            if len(batch) == 4096:
                table._merge(batch)
                batch = []
        table._merge(batch)
        return table

    def _merge(self, batch: list[np.ndarray]) -> None:
        if not batch:
            return
        self.n_docs += len(batch)
        allf = np.concatenate(batch + [self.hashes])
        counts = np.concatenate([np.ones(sum(len(b) for b in batch), np.uint64),
                                 self.df.astype(np.uint64)])
        uniq, inverse = np.unique(allf, return_inverse=True)
        df = np.zeros(len(uniq), np.uint64)
        np.add.at(df, inverse, counts)
        self.hashes, self.df = uniq, np.minimum(df, 0xFFFFFFFF).astype(np.uint32)

    def idf(self, features: np.ndarray) -> np.ndarray:
        """Return idf for each feature hash (float64)."""
        features = np.asarray(features, dtype=np.uint64)
        df = np.zeros(len(features), dtype=np.float64)
        if len(self.hashes):
            pos = np.searchsorted(self.hashes, features)
            pos_c = np.minimum(pos, len(self.hashes) - 1)
            hit = self.hashes[pos_c] == features
            df[hit] = self.df[pos_c[hit]]
        return np.log((1.0 + self.n_docs) / (1.0 + df)) + 1.0

    def to_bytes(self) -> bytes:
        """Serialise: magic, u64 N, u64 count, count u64 hashes, count u32 df (LE)."""
        return (_IDF_MAGIC + struct.pack("<QQ", self.n_docs, len(self.hashes))
                + self.hashes.astype("<u8").tobytes() + self.df.astype("<u4").tobytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> IdfTable:
        """Parse :meth:`to_bytes` output.

        Raises:
            FormatError: wrong magic, impossible count, unsorted hashes.
        """
        data = bytes(data)
        if data[:8] != _IDF_MAGIC or len(data) < 24:
            raise FormatError(f"not an idf table: magic {data[:8]!r} != {_IDF_MAGIC!r}")
        n_docs, count = struct.unpack_from("<QQ", data, 8)
        if len(data) != 24 + 12 * count:
            raise FormatError(f"idf table of {count} entries needs {24 + 12 * count} bytes, "
                              f"got {len(data)}")
        hashes = np.frombuffer(data, "<u8", count, 24).astype(np.uint64)
        df = np.frombuffer(data, "<u4", count, 24 + 8 * count).astype(np.uint32)
        if count > 1 and not np.all(hashes[1:] > hashes[:-1]):
            raise FormatError("idf table hashes are not strictly increasing")
        return cls(n_docs, hashes, df)

    def __eq__(self, other):
        return (isinstance(other, IdfTable) and self.n_docs == other.n_docs
                and np.array_equal(self.hashes, other.hashes)
                and np.array_equal(self.df, other.df))

    def __len__(self):
        return len(self.hashes)


class FeatureCounts:
    """Distinct features and their counts, merged batch by batch (memory
    O(distinct features) however long the text)."""

    def __init__(self):
        self.features = np.empty(0, dtype=np.uint64)
        self.counts = np.empty(0, dtype=np.int64)

    def add(self, features: np.ndarray) -> None:
        """Count more feature occurrences."""
        uniq, counts = np.unique(np.asarray(features, dtype=np.uint64), return_counts=True)
        if len(self.features) == 0:
            self.features, self.counts = uniq, counts.astype(np.int64)
            return
        merged, inverse = np.unique(np.concatenate([self.features, uniq]), return_inverse=True)
        total = np.zeros(len(merged), dtype=np.int64)
        np.add.at(total, inverse, np.concatenate([self.counts, counts]))
        self.features, self.counts = merged, total


def weigh_counts(features: np.ndarray, counts: np.ndarray, weighting: str,
                 idf: IdfTable | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Return (features, weights) for distinct features with their counts.

    ``binary`` 1 each (None), ``tf`` the count, ``logtf`` 1 + ln(tf),
    ``tfidf`` tf * idf.

    Raises:
        ValueError: unknown weighting, or ``tfidf`` without an idf table.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if weighting == "binary":
        return features, None
    if weighting == "tf":
        return features, counts.astype(np.float64)
    if weighting == "logtf":
        return features, 1.0 + np.log(counts)
    if idf is None:
        raise ValueError("weighting 'tfidf' needs an IdfTable (idf=...)")
    return features, counts * idf.idf(features)


def weigh(features: np.ndarray, weighting: str = "tf", idf: IdfTable | None = None
          ) -> tuple[np.ndarray, np.ndarray | None]:
    """Return (features, weights) for simhash accumulation.

    ``tf`` keeps one entry per occurrence with weight None (1 each): summing
    them is term frequency without a sort.  The others return the distinct
    features with float64 weights (see :func:`weigh_counts`).

    Raises:
        ValueError: unknown weighting, or ``tfidf`` without an idf table.
    """
    if weighting == "tf":
        return features, None
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    uniq, counts = np.unique(features, return_counts=True)
    return weigh_counts(uniq, counts, weighting, idf)
