"""Huffman-delta blocks: sorted uint64 arrays <-> 1024-byte compressed blocks.

This is Manku, Jain and Das Sarma's table compression (WWW 2007, §3.2),
specified normatively in ``format-spec/FORMAT.md`` ("Blocks", "Huffman
codes").  A table is cut into blocks of ``BLOCK_BYTES``; each block stores its
first fingerprint in full and then, for every next fingerprint b after a,
the canonical Huffman code of h followed by the h bits of b below bit h,
where h is the position of the leading 1-bit of the *delta* of a and b.

Two deltas are defined, chosen per table by the code:

``CODING_DELTA``
    d = b - a.  Gaps between sorted random fingerprints are close to
    exponentially distributed, and Huffman(leading bit of the gap) plus the
    raw bits below it costs about 1.002 x the information-theoretic minimum
    (64 - log2 N + log2 e bits per fingerprint).
``CODING_XOR``
    d = b XOR a, the paper's scheme.  The position of the leading 1-bit of
    the XOR also depends on the low bits of a, which the code cannot see, so
    it costs about 1.045 x the minimum, as the paper reports.

Both share one bitstream; only the reconstruction differs (``a + d`` versus
``a`` with its bits below h+1 replaced).

``CODING_RESTARTS`` (the default)
    ``CODING_DELTA`` with a restart table at the end of each block: where
    the entries a quarter, half and three quarters of the way through the
    block end, and their values.  A query starts decoding at the last one
    below the prefix it looks for, so it decodes at most a quarter of a
    block before it, instead of half a block on average (FORMAT.md 5.4).
    The table takes about 2% of a block.  Hot loops run in ``ndindex._core``;
``ndindex.codec_reference`` is an independent plain-Python decoder for
conformance and differential tests.

All functions here are pure: no I/O, no state.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ndindex import _core
from ndindex.errors import CorruptionError, FormatError

BLOCK_BYTES = _core.BLOCK_BYTES
BLOCK_HEADER_BYTES = _core.BLOCK_HEADER_BYTES
CODE_MAX_BITS = _core.CODE_MAX_BITS
CODE_SYMBOLS = 64
CODING_XOR = 0
CODING_DELTA = 1
CODING_RESTARTS = 2
CODING_NAMES = {CODING_XOR: "xor", CODING_DELTA: "delta", CODING_RESTARTS: "delta+restarts"}
#: Serialised code: u8 coding, u8 max code bits, 64 x u8 code lengths.
CODE_RECORD_BYTES = 2 + CODE_SYMBOLS
#: Fewest entries a block can hold (each costs at most 12 + 63 bits, and a
#: restart table at most 30 bytes).
BLOCK_MIN_ENTRIES = _core.BLOCK_MIN_ENTRIES
#: Sample size used to estimate the h distribution of random fingerprints.
_PRIOR_SAMPLE = 1 << 16


def limited_code_lengths(freqs, max_bits: int = CODE_MAX_BITS) -> list[int]:
    """Return optimal Huffman code lengths of at most max_bits (package-merge).

    Every symbol gets a length, so every symbol stays encodable: frequencies
    of zero are treated as a small positive weight.  The code is complete
    (Kraft sum exactly 1), which the decoder relies on.

    Parameters: freqs, one non-negative weight per symbol (2 <= n <= 2^max_bits).
    Cost: O(n * max_bits * log n); trivial for 64 symbols.
    """
    n = len(freqs)
    if not 2 <= n <= (1 << max_bits):
        raise ValueError(f"need 2..{1 << max_bits} symbols, got {n}")
    total = float(sum(freqs))
    # A zero weight would let package-merge leave a symbol without a code.
    floor = max(total, 1.0) * 1e-9
    weights = [max(float(f), floor) for f in freqs]
    leaves = sorted((w, (s,)) for s, w in enumerate(weights))
    current = list(leaves)
    for _ in range(max_bits - 1):
        packages = [(current[j][0] + current[j + 1][0], current[j][1] + current[j + 1][1])
                    for j in range(0, len(current) - 1, 2)]
        current = sorted(leaves + packages, key=lambda item: item[0])
    lengths = [0] * n
    for _, symbols in current[:2 * n - 2]:
        for s in symbols:
            lengths[s] += 1
    return lengths


@dataclasses.dataclass(frozen=True, eq=False)
class HuffmanCode:
    """A table's canonical Huffman code over h in [0, 63], and its coding.

    Build one with :meth:`from_values`, :meth:`for_density` or
    :meth:`from_frequencies`; store it with :meth:`to_bytes`.
    """

    coding: int
    lengths: bytes
    compiled: object = dataclasses.field(repr=False)

    @classmethod
    def from_lengths(cls, lengths, coding: int = CODING_DELTA) -> "HuffmanCode":
        """Make a code from 64 code lengths; ValueError unless they form a complete code."""
        lengths = bytes(lengths)
        return cls(coding, lengths, _core.compile_code(lengths, coding))

    @classmethod
    def from_frequencies(cls, freqs, coding: int = CODING_DELTA) -> "HuffmanCode":
        """Make the optimal length-limited code for 64 symbol frequencies."""
        if len(freqs) != CODE_SYMBOLS:
            raise ValueError(f"expected {CODE_SYMBOLS} frequencies, got {len(freqs)}")
        return cls.from_lengths(limited_code_lengths(list(freqs)), coding)

    @classmethod
    def from_values(cls, values: np.ndarray, coding: int = CODING_DELTA,
                    expected_n: int | None = None) -> "HuffmanCode":
        """Make the code for a sorted table, blended with the random-data prior.

        A table's own h histogram is what it will cost; the prior for
        ``max(expected_n, len(values))`` random fingerprints keeps a small
        table's code sensible for the inserts that follow it.
        """
        values = np.ascontiguousarray(values, dtype=np.uint64)
        hist = np.array(_core.delta_histogram(values, coding), dtype=np.float64)
        n = max(int(expected_n or 0), len(values), 2)
        prior = _density_histogram(_quantized(n), coding)
        # The prior counts as _PRIOR_SAMPLE observations; real data dominates
        # once the table is larger than that.
        return cls.from_frequencies(hist + prior, coding)

    @classmethod
    def for_density(cls, n: int, coding: int = CODING_DELTA) -> "HuffmanCode":
        """Make the code expected for n uniformly random distinct fingerprints."""
        return cls.from_frequencies(_density_histogram(_quantized(max(int(n), 2)), coding), coding)

    def to_bytes(self) -> bytes:
        """Serialise as in FORMAT.md "Huffman code record" (without checksum)."""
        return bytes([self.coding, CODE_MAX_BITS]) + self.lengths

    @classmethod
    def from_bytes(cls, data: bytes) -> "HuffmanCode":
        """Load a serialised code; FormatError naming the problem if invalid."""
        data = bytes(data)
        if len(data) != CODE_RECORD_BYTES:
            raise FormatError(f"code record is {len(data)} bytes, expected {CODE_RECORD_BYTES}")
        coding, max_bits, lengths = data[0], data[1], data[2:]
        if coding not in CODING_NAMES:
            raise FormatError(f"code coding {coding} unknown (expected 0, 1 or 2)")
        if max_bits != CODE_MAX_BITS:
            raise FormatError(f"code max bits {max_bits}, expected {CODE_MAX_BITS}")
        bad = [s for s, ln in enumerate(lengths) if not 1 <= ln <= CODE_MAX_BITS]
        if bad:
            raise FormatError(f"code length of h={bad[0]} is {lengths[bad[0]]}, expected 1..{CODE_MAX_BITS}")
        kraft = sum(1 << (CODE_MAX_BITS - ln) for ln in lengths)
        if kraft != 1 << CODE_MAX_BITS:
            raise FormatError(f"code is not complete: Kraft sum {kraft / (1 << CODE_MAX_BITS):.6f}, expected 1")
        return cls.from_lengths(lengths, coding)

    def __eq__(self, other):
        return (isinstance(other, HuffmanCode) and self.coding == other.coding
                and self.lengths == other.lengths)

    def __hash__(self):
        return hash((self.coding, self.lengths))


def _quantized(n: int) -> int:
    """n rounded to a power of 2**(1/4): the prior barely moves within that step,
    and the cache of priors stays small."""
    return max(2, int(round(2 ** (round(math.log2(n) * 4) / 4))))


@functools.lru_cache(maxsize=64)
def _density_histogram(n: int, coding: int) -> np.ndarray:
    """Return the h histogram of a deterministic sample at the density of n random values."""
    m = min(n, _PRIOR_SAMPLE)
    rng = np.random.default_rng(0x6e646978)
    # m values spread over m/n of the key space have n's gap distribution.
    span = 2.0 ** 64 * (m / n)
    sample = np.unique((rng.random(m) * span).astype(np.uint64))
    if len(sample) < 2:
        sample = np.array([0, 1], dtype=np.uint64)
    hist = np.array(_core.delta_histogram(sample, coding), dtype=np.float64)
    hist.flags.writeable = False  # shared through the cache
    return hist


@dataclasses.dataclass(frozen=True)
class EncodedTable:
    """Blocks of one table: ``blocks`` (uint8, n_blocks x 1024) and ``keys``.

    ``keys[i]`` is the last fingerprint of block i, the key the directory
    searches (FORMAT.md [B9]).
    """

    blocks: np.ndarray
    keys: np.ndarray

    @property
    def n_blocks(self) -> int:
        return len(self.keys)

    def block(self, i: int) -> memoryview:
        """Return block i as a 1024-byte memoryview."""
        return memoryview(self.blocks)[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES]


def _as_sorted_uint64(values) -> np.ndarray:
    arr = np.ascontiguousarray(values)
    if arr.dtype != np.uint64:
        if arr.dtype.kind not in "iu" and not (arr.dtype == object or arr.size == 0):
            raise TypeError(f"fingerprints must be uint64, got dtype {arr.dtype}")
        arr = np.ascontiguousarray(np.asarray(values, dtype=np.uint64))
    return arr


def encode(values, code: HuffmanCode) -> EncodedTable:
    """Encode a strictly increasing uint64 array into blocks.

    Raises ValueError if the values are not strictly increasing (duplicates
    included): tables hold distinct fingerprints.  Cost: O(n), in C, GIL
    released for large inputs.
    """
    values = _as_sorted_uint64(values)
    n = len(values)
    capacity = n // BLOCK_MIN_ENTRIES + 1
    blocks = np.empty(capacity * BLOCK_BYTES, dtype=np.uint8)
    keys = np.empty(capacity, dtype=np.uint64)
    nb = _core.encode(code.compiled, values, blocks, keys)
    # Views, not copies: copying ~1 byte in 2 of a large table costs more
    # than the unused tail of the capacity estimate keeps alive.
    return EncodedTable(blocks[:nb * BLOCK_BYTES], keys[:nb])


def block_counts(blocks) -> np.ndarray:
    """Return the entry count in each block's header (not verified)."""
    blocks = np.frombuffer(blocks, dtype=np.uint8) if not isinstance(blocks, np.ndarray) else blocks
    counts = np.empty(len(blocks) // BLOCK_BYTES, dtype=np.uint16)
    _core.block_counts(blocks, counts)
    return counts


def decode(blocks, code: HuffmanCode) -> np.ndarray:
    """Decode consecutive blocks to one uint64 array.

    Verifies every checksum, bound, ordering and padding bit; raises
    CorruptionError naming the first bad block.  Cost: O(total entries).
    """
    buf = blocks.blocks if isinstance(blocks, EncodedTable) else blocks
    total = int(block_counts(buf).astype(np.int64).sum())
    out = np.empty(total, dtype=np.uint64)
    n = _core.decode(code.compiled, buf, out)
    if n != total:  # cannot happen: decode checks each count it reads
        raise CorruptionError(f"decoded {n} values, headers promised {total}", database="block")
    return out


def probe(block, code: HuffmanCode, q: int, p: int, k: int) -> list[int]:
    """Return entries of one block with q's top p bits and within distance k of q."""
    return _core.probe(code.compiled, block, int(q), int(p), int(k))


def probe_blocks(blocks, codes, qs, ps, ks, *, verified: bool = False,
                 cap: int = 1 + (BLOCK_BYTES - BLOCK_HEADER_BYTES) * 8) -> list:
    """Probe many blocks side by side, as queries do; one result per block.

    Block i (of ``blocks``, whole 1024-byte blocks) is probed with codes[i]
    (a HuffmanCode), qs[i], ps[i] and ks[i] as :func:`probe` does.  With
    verified, checksums are not checked (as for blocks a query checked
    before), so damage reaches the decoder.  Returns per block its list of
    matches, or a CorruptionError (not raised) naming its damage; a block
    with more than cap matches gets the CorruptionError "more than cap".
    For differential tests of the query kernel's decoder.
    """
    got = _core.probe_lanes([c.compiled for c in codes], blocks, [int(q) for q in qs],
                            [int(p) for p in ps], [int(k) for k in ks], bool(verified), int(cap))
    return [r if isinstance(r, list) else CorruptionError(f"block {i}: {r}", database="block")
            for i, r in enumerate(got)]


def entropy_bound_bits(n: int) -> float:
    """Return 64 - log2 n + log2 e, the minimum bits per fingerprint of an n-set."""
    return 64 - math.log2(n) + math.log2(math.e)
