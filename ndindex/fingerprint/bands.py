"""Lookup keys for candidate generation: banded bottom-r super-shingles.

A document's candidates are the documents that share one of its 64-bit
lookup keys ([DK20]-[DK24] in format-spec/documents.md).  Band j hashes the
``rows`` smallest distinct values of the MinHash function h_j ([FP40]) over
the document's shingles: Broder's super-shingle of the bottom-r sketch under
the j-th min-wise permutation.  Two documents share band j exactly when the
r smallest values of their union under h_j all lie in both, which for
random permutations has probability C(|A n B|, r) / C(|A u B|, r), about
J^r; with b independent bands a pair is a candidate with probability
1 - (1 - J^r)^b, whatever the Hamming distance of its simhashes.

Against LSH over a p-value MinHash sketch (b bands of r rows need p = b*r
functions) each band costs one function instead of r: the default 20 bands
of 5 rows evaluate 20 multiply-adds per shingle, not 100.

Every document also has an *exact key*, the hash of its whole bottom-k
sketch: documents with identical sketches share it, which is how exact
duplicates are grouped.  A document of DELETION_MIN_VALUES to
DELETION_MAX_VALUES values adds *deletion keys*, the exact keys of its
sketch with one value deleted.  Bands are weak on such small sets (a
document of fewer than ``rows`` values has none), but there Jaccard >= 0.8
leaves no room for more than one value of difference (|A u B| - |A n B| <=
0.2 |A u B| < 2 when |A u B| <= 9): the two sets are equal, or the larger
is the smaller plus one value, and then the larger's deletion key equals the
smaller's exact key.  (4 / 5 = 0.8 is the smallest such pair, so sets of
under 5 values need no deletion keys; sets of 2-4 values would share their
deletion keys with every set that has the same few shingles, as all
"debug symbols for X" do.)  Knows nothing of storage.
"""

from __future__ import annotations

import dataclasses
import math
import struct

import numpy as np

from ndindex import _core
from ndindex.errors import FormatError
from ndindex.fingerprint.minhash import MinHashFamily

#: Default band design: 20 bands of 5 rows.  At Jaccard 0.8 a pair of large
#: documents is a candidate with probability 1 - (1 - 0.8^5)^20 = 0.9996,
#: and still 0.993 for sets of 10 shingles (docs/documents.md has the table).
DEFAULT_BANDS = 20
DEFAULT_ROWS = 5
#: Seed of the exact key's XXH64 (band j uses seed j < 65536).
EXACT_KEY_SEED = 2**64 - 1
#: Documents of DELETION_MIN_VALUES..DELETION_MAX_VALUES sketch values add
#: deletion keys: 9 is the largest union in which Jaccard >= 0.8 allows a
#: difference of one value only, 5 the smallest set one larger than another
#: at Jaccard >= 0.8 (4 / 5).
DELETION_MIN_VALUES = 5
DELETION_MAX_VALUES = 9
#: A band design is chosen for thresholds down to this, so that a pair at
#: the threshold is missed with probability at most MISS_AT_THRESHOLD.
MISS_AT_THRESHOLD = 4e-4
MAX_BANDS = 4096

_MAGIC = b"NDKD"
_VERSION = 1
_RECORD = struct.Struct("<4sHHH")


@dataclasses.dataclass(frozen=True)
class KeyDesign:
    """How many lookup keys a document gets: ``bands`` bands of ``rows`` values.

    Attributes:
        bands: band keys per document, 1..MAX_BANDS.
        rows: values hashed into one band key, 1..64; also the fewest
            distinct shingle values a document needs for band keys.
    """

    bands: int = DEFAULT_BANDS
    rows: int = DEFAULT_ROWS

    def __post_init__(self):
        for name, value, top in (("bands", self.bands, MAX_BANDS), ("rows", self.rows, 64)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be int, got {type(value).__name__}")
            if not 1 <= value <= top:
                raise ValueError(f"{name} must be in 1..{top}, got {value}")

    @classmethod
    def for_threshold(cls, threshold: float, rows: int = DEFAULT_ROWS) -> KeyDesign:
        """Return the design with the fewest bands of ``rows`` rows that misses a
        pair of large documents at Jaccard ``threshold`` with probability at
        most MISS_AT_THRESHOLD (the default design for thresholds >= 0.8).

        Raises:
            ValueError: threshold outside (0, 1], or needing over MAX_BANDS bands.
        """
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        threshold = min(threshold, 0.8)
        hit = threshold ** rows
        bands = math.ceil(math.log(MISS_AT_THRESHOLD) / math.log1p(-hit)) if hit < 1 else 1
        if bands > MAX_BANDS:
            raise ValueError(f"threshold {threshold} needs {bands} bands of {rows} rows, "
                             f"over {MAX_BANDS}")
        return cls(max(bands, 1), rows)

    def candidate_probability(self, intersection, union) -> np.ndarray:
        """Return the probability that two documents share a band key, given the
        sizes of the intersection and union of their shingle sets (random
        min-wise permutations; exact-key matches of identical sets count 1)."""
        i = np.asarray(intersection, dtype=np.float64)
        u = np.asarray(union, dtype=np.float64)
        r = self.rows
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = _log_comb(i, r) - _log_comb(u, r)
            p = np.where(i >= r, np.exp(log_p), 0.0)
        p = 1.0 - (1.0 - p) ** self.bands
        return np.where((i == u), 1.0, p)

    def to_bytes(self) -> bytes:
        """Serialise ([DK40]): magic "NDKD", u16 version, u16 bands, u16 rows (LE)."""
        return _RECORD.pack(_MAGIC, _VERSION, self.bands, self.rows)

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyDesign:
        """Parse :meth:`to_bytes` output.

        Raises:
            FormatError: wrong length or magic, unknown version, values out of range.
        """
        data = bytes(data)
        if len(data) != _RECORD.size:
            raise FormatError(f"key design record is {len(data)} bytes, expected {_RECORD.size}")
        magic, version, bands, rows = _RECORD.unpack(data)
        if magic != _MAGIC:
            raise FormatError(f"not a key design record: magic {magic!r} != {_MAGIC!r}")
        if version != _VERSION:
            raise FormatError(f"key design version {version} is not the supported {_VERSION}")
        try:
            return cls(bands, rows)
        except ValueError as exc:
            raise FormatError(f"invalid key design: {exc}") from exc


def _log_comb(n: np.ndarray, r: int) -> np.ndarray:
    lg = np.vectorize(math.lgamma, otypes=[np.float64])
    n = np.maximum(n, r)
    return lg(n + 1) - lg(r + 1) - lg(n - r + 1)


class KeyMaker:
    """Computes lookup keys for one (minhash_seed, design): holds the band functions."""

    def __init__(self, design: KeyDesign = KeyDesign(), minhash_seed: int = 1):
        self.design = design
        family = MinHashFamily(design.bands, minhash_seed)
        self._a, self._b = family.a, family.b

    def band_state(self) -> bytearray:
        """A document's band state: band_keys(..., state) over its features in
        pieces gives, at the last piece, the keys of all of them."""
        return bytearray(4 * self.design.bands * (self.design.rows + 1))

    def band_keys(self, features, state: bytearray | None = None) -> np.ndarray:
        """Return the ``bands`` band keys (uint64) of a document's shingle hashes
        ([DK21]), and of those state holds from earlier pieces (see
        band_state).  Cost: O(n * bands) in C."""
        f = np.ascontiguousarray(features, dtype=np.uint64)
        args = (f, self._a, self._b, self.design.rows) + (() if state is None else (state,))
        return np.frombuffer(_core.band_keys(*args), dtype=np.uint64)

    def lookup_keys(self, features, sketch, state: bytearray | None = None) -> np.ndarray:
        """Return every lookup key of a document ([DK23]): the exact key of its
        bottom-k sketch; its band keys when the sketch holds at least ``rows``
        values; then, when it holds DELETION_MIN_VALUES..DELETION_MAX_VALUES,
        the deletion keys in the order of the deleted value.  state: the band
        state of the document's earlier features (features then its last)."""
        keys = [np.array([exact_key(sketch)], dtype=np.uint64)]
        if len(sketch) >= self.design.rows:
            keys.append(self.band_keys(features, state))
        if DELETION_MIN_VALUES <= len(sketch) <= DELETION_MAX_VALUES:
            keys.append(deletion_keys(sketch))
        return np.concatenate(keys)


def deletion_keys(sketch) -> np.ndarray:
    """Return the exact keys of the sketch with each value deleted in turn ([DK24])."""
    values = np.asarray(sketch, dtype=np.uint32)
    return np.array([exact_key(np.delete(values, i)) for i in range(len(values))],
                    dtype=np.uint64)


def min_values_for(threshold: float) -> int:
    """Return the fewest sketch values s for which a set other than the same one
    can reach Jaccard ``threshold`` (s / (s + 1) >= threshold): below it a
    document can only match an identical shingle set."""
    if threshold >= 1.0:
        return 2**31
    return max(1, math.ceil(threshold / (1.0 - threshold) - 1e-9))


def exact_key(sketch) -> int:
    """Return the exact key of a bottom-k sketch ([DK22]): XXH64 of its values
    as little-endian uint32, seed EXACT_KEY_SEED."""
    values = np.ascontiguousarray(sketch, dtype="<u4")
    return _core.xxh64(values.tobytes(), EXACT_KEY_SEED)
