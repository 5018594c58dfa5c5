"""Probabilistic simhash matching (Sood and Loguinov, CIKM 2011): one table.

Manku et al. answer "every stored fingerprint within k bits" exactly from t
permuted copies of the data (``ndindex.plan``).  PSM keeps ONE sorted copy
and a directory over its top p bits, the *headers*.  A stored near-duplicate
of q differs from q in some set S of header bits; PSM probes q's header XOR
each likely S, most likely first (``ndindex.vosh``, ordered by the query's
flip probabilities, ``Fingerprinter.flip_probabilities``), and compares the
remaining bits of every entry under a probed header by popcount.  Probing
every set of at most k header bits is exact; ``max_probes`` stops early and
trades recall for time, never precision.

Three ways in, all exact within the headers they probe:

* online: :class:`PsmTable` over an in-memory array (``query``,
  ``query_many``); :func:`probe_headers` alone gives the ordered headers, so
  the same order can probe any sorted store (runs of blocks on disk);
* batch mode (:func:`join`, :class:`PsmCollection`): the new fingerprints Q
  accumulate until there are m of them; each is expanded into its first
  ``max_probes`` headers, the expansion is sorted, and the stored collection,
  sorted, is merged against it chunk by chunk (one sequential pass, no
  random access: a stored f meets every q that probes f's header); then Q is
  sorted into the collection;
* :func:`candidate_pairs`: near-duplicate candidates among n documents, the
  pluggable candidate generator of the document pipeline.

Pairs use ``fpfile.PAIR_DTYPE`` (q, f, distance) as ``ndindex.batch`` does;
matches of many queries use ``MATCH_DTYPE`` (query, fingerprint, distance)
as ``Index.query_many`` does.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator

import numpy as np

from ndindex import _core, plan as plans
from ndindex.arrays import merge_unique, sorted_unique
from ndindex.fpfile import PAIR_DTYPE
from ndindex.index_queries import MATCH_DTYPE
from ndindex.validate import fingerprints as _as_fingerprints

__all__ = ["MAX_HEADER_BITS", "MAX_DIRECTORY_BITS", "default_header_bits", "flip_set_count",
           "probe_headers", "PsmTable", "join", "PsmCollection", "candidate_pairs"]

#: Header bits a table may use: 2^40 headers is far past any embedded index.
MAX_HEADER_BITS = 40
#: The in-memory directory has 2^b + 1 uint32 offsets, b <= this (64 MiB);
#: with more header bits a probe binary-searches its directory slot.
MAX_DIRECTORY_BITS = 24
#: Largest number of probes one query may ask for (the headers are an array).
MAX_PROBES = 1 << 31


def default_header_bits(n: int) -> int:
    """Return round(log2 n), at least 1: about one stored fingerprint per header,
    the paper's choice, so a probe costs one directory read and ~1 popcount."""
    return max(1, min(MAX_HEADER_BITS, round(math.log2(max(n, 2)))))


#: The number of flip sets of at most k of p header bits: the probes of an
#: exhaustive (exact) query.
flip_set_count = plans.flip_set_count


def _check_query_args(header_bits: int, k, max_probes) -> tuple[int, int]:
    k = _check_k(k)
    total = flip_set_count(header_bits, k)
    if max_probes is None:
        if total > MAX_PROBES:
            raise ValueError(f"{total} flip sets of at most {k} of {header_bits} header bits: "
                             "give max_probes")
        return k, total
    if type(max_probes) is not int:
        max_probes = operator.index(max_probes)
    if not 0 <= max_probes <= MAX_PROBES:
        raise ValueError(f"max_probes must be in 0..{MAX_PROBES}, got {max_probes}")
    return k, min(max_probes, total)


def _probabilities(probabilities, rows: int | None) -> np.ndarray:
    p = probabilities
    if rows is None and type(p) is np.ndarray and p.dtype == np.float64 and p.shape == (64,) \
            and p.flags.c_contiguous:
        return p  # the common case, checked cheaply (the kernel checks each value)
    p = np.ascontiguousarray(probabilities, dtype=np.float64)
    want = (64,) if rows is None else (rows, 64)
    if p.shape != want:
        raise ValueError(f"probabilities must have shape {want}, got {p.shape}")
    return p


def _check_header_bits(header_bits) -> int:
    header_bits = operator.index(header_bits)
    if not 0 <= header_bits <= MAX_HEADER_BITS:
        raise ValueError(f"header_bits must be in 0..{MAX_HEADER_BITS}, got {header_bits}")
    return header_bits


def probe_headers(q: int, probabilities, header_bits: int, k: int,
                  max_probes: int | None = None) -> np.ndarray:
    """Return q's flipped headers in the order PSM probes them.

    Parameters:
        q: the query fingerprint.
        probabilities: 64 flip probabilities, p_j for bit j.
        header_bits: p, the length of a header (the top p bits).
        k: the largest number of header bits flipped.
        max_probes: at most this many headers (default all: exact).

    Returns:
        uint64 array of header values (q >> (64 - p)) ^ S for the flip sets
        S of at most k header bits, most probable first.  A stored value
        whose top p bits equal one of them is a candidate; every stored
        value within k of q has one of the exhaustive list's headers.

    Raises:
        ValueError: bad probabilities, header_bits, k or max_probes.

    Cost: about 50 ns per header (C).
    """
    header_bits = _check_header_bits(header_bits)
    k, count = _check_query_args(header_bits, k, max_probes)
    out = np.empty(count, dtype=np.uint64)
    n = _core.psm_headers(_check_u64(q), _probabilities(probabilities, None), header_bits, k,
                          out)
    return out[:n]


def _check_u64(q) -> int:
    if type(q) is int and 0 <= q < 1 << 64:  # the common case, checked cheaply
        return q
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)):
        raise TypeError(f"a fingerprint must be an int, got {type(q).__name__}")
    q = int(q)
    if not 0 <= q < 1 << 64:
        raise ValueError(f"fingerprint {q} is outside 0..2^64-1")
    return q


class PsmTable:
    """One sorted copy of the fingerprints, probed through its top header bits.

    Parameters:
        fingerprints: uint64 values (duplicates collapse).
        header_bits: p (default :func:`default_header_bits` of the count).
        directory_bits: b <= p bits of the in-memory directory (default
            min(p, MAX_DIRECTORY_BITS)); 2^b + 1 uint32 offsets.

    Memory: 8 bytes per distinct fingerprint plus 4 * 2^b bytes.  What PSM
    stores on disk is only the sorted values (one table of ``ndindex.codec``
    blocks); the directory is rebuilt from them.

    Raises:
        ValueError, TypeError: bad fingerprints or bit counts.
    """

    def __init__(self, fingerprints, header_bits: int | None = None, *,
                 directory_bits: int | None = None):
        self.values = sorted_unique(_as_fingerprints(fingerprints))
        if len(self.values) >= 1 << 32:
            raise ValueError("a table holds fewer than 2^32 fingerprints")
        self.header_bits = (default_header_bits(len(self.values)) if header_bits is None
                            else _check_header_bits(header_bits))
        if directory_bits is None:
            directory_bits = min(self.header_bits, MAX_DIRECTORY_BITS)
        directory_bits = operator.index(directory_bits)
        if not 0 <= directory_bits <= min(self.header_bits, MAX_DIRECTORY_BITS):
            raise ValueError(f"directory_bits must be in 0..{min(self.header_bits, MAX_DIRECTORY_BITS)}"
                             f", got {directory_bits}")
        self.directory_bits = directory_bits
        self._capsule = _core.psm_table(self.values, self.header_bits, directory_bits)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def nbytes(self) -> int:
        """Bytes of memory held: the values and the directory."""
        return self.values.nbytes + 4 * ((1 << self.directory_bits) + 1)

    def headers(self, q: int, probabilities, k: int, max_probes: int | None = None) -> np.ndarray:
        """Return q's flipped headers for this table (see :func:`probe_headers`)."""
        return probe_headers(q, probabilities, self.header_bits, k, max_probes)

    def probe(self, q: int, headers, k: int) -> list[tuple[int, int]]:
        """Return the stored values within k of q under the given headers.

        headers: uint64 header values (top header_bits bits), in any order.
        Returns (fingerprint, distance) pairs, distinct, ordered by (distance,
        fingerprint).  Cost: one directory read and a popcount per entry
        under each header.
        """
        h = np.ascontiguousarray(headers, dtype=np.uint64)
        return _core.psm_probe(self._capsule, _check_u64(q), h, _check_k(k))

    def query(self, q: int, probabilities, k: int, max_probes: int | None = None
              ) -> tuple[list[tuple[int, int]], int]:
        """Return (matches, probes): the online PSM query.

        Parameters:
            q: the query fingerprint.
            probabilities: its 64 flip probabilities.
            k: Hamming radius; also the most header bits a probe flips.
            max_probes: headers to probe, most probable first (default all
                flip sets of at most k header bits: every value within k).

        Returns:
            matches, (fingerprint, distance) ordered by (distance,
            fingerprint); probes, the headers probed.

        Raises:
            ValueError: bad probabilities, k or max_probes.
            TypeError: q is not an int.
        """
        k, count = _check_query_args(self.header_bits, k, max_probes)
        return _core.psm_query(self._capsule, _check_u64(q), _probabilities(probabilities, None),
                               k, count)

    def query_many(self, queries, probabilities, k: int, max_probes: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Return (matches, probes) of many queries in one C call (GIL released).

        queries: n fingerprints; probabilities: (n, 64).  matches is a
        MATCH_DTYPE array (query index, fingerprint, distance), by query,
        then (distance, fingerprint); probes holds each query's count.
        """
        qs = _as_fingerprints(queries)
        k, count = _check_query_args(self.header_bits, k, max_probes)
        qidx, fps, dist, probes = _core.psm_query_many(
            self._capsule, qs, _probabilities(probabilities, len(qs)), k, count)
        out = np.empty(len(dist), dtype=MATCH_DTYPE)
        out["query"] = np.frombuffer(qidx, dtype=np.int64)
        out["fingerprint"] = np.frombuffer(fps, dtype=np.uint64)
        out["distance"] = np.frombuffer(dist, dtype=np.uint8)
        return out, np.frombuffer(probes, dtype=np.int64).copy()


def _check_k(k) -> int:
    if type(k) is not int:
        k = operator.index(k)
    if not 0 <= k <= 64:
        raise ValueError(f"k must be in 0..64, got {k}")
    return k


# -- batch mode ------------------------------------------------------------------


def _expand(queries: np.ndarray, probabilities: np.ndarray, header_bits: int, k: int,
            max_probes: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(headers, owners) of every query's first max_probes flipped headers, sorted by header."""
    k, count = _check_query_args(header_bits, k, max_probes)
    headers, owners = _core.psm_expand(queries, probabilities, header_bits, k, count)
    headers = np.frombuffer(headers, dtype=np.uint64)
    owners = np.frombuffer(owners, dtype=np.uint64)
    order = np.argsort(headers, kind="stable")
    return headers[order], owners[order]


def _pairs(raw) -> np.ndarray:
    """Kernel pairs as a PAIR_DTYPE array, distinct, sorted by (q, f): a value
    repeated in Q (two documents, one simhash) probes for both, once."""
    q, f, d = raw
    out = np.empty(len(d), dtype=PAIR_DTYPE)
    out["q"] = np.frombuffer(q, dtype=np.uint64)
    out["f"] = np.frombuffer(f, dtype=np.uint64)
    out["distance"] = np.frombuffer(d, dtype=np.uint8)
    return np.unique(out) if len(out) > 1 else out


def _chunks(stored, chunk_size: int) -> Iterator[np.ndarray]:
    """Sorted uint64 chunks of the stored collection (an array or an iterable of arrays)."""
    if isinstance(stored, np.ndarray):
        stored = [stored]
    for part in stored:
        part = _as_fingerprints(part)
        for start in range(0, len(part), chunk_size):
            chunk = part[start:start + chunk_size]
            if len(chunk) > 1 and np.any(chunk[1:] < chunk[:-1]):
                chunk = np.sort(chunk)
            yield chunk


def join(queries, probabilities, stored, k: int, *, header_bits: int,
         max_probes: int | None = None, chunk_size: int = 1 << 20) -> Iterator[np.ndarray]:
    """Yield the pairs of a query batch Q and a stored collection, chunk by chunk.

    Parameters:
        queries: the batch Q (n uint64).  Q is a set: a repeated value
            probes the headers of each occurrence and its pairs come once.
        probabilities: (n, 64) flip probabilities of the queries.
        stored: the collection F: a uint64 array or an iterable of arrays
            (chunks; each is sorted here unless it already is).
        k: Hamming radius.
        header_bits: p, the header length.
        max_probes: headers per query (default all: every pair within k).
        chunk_size: F values per merge pass.

    Yields:
        One PAIR_DTYPE array (q, f, distance <= k) per chunk of F, sorted by
        (q, f): every f of the chunk whose header is one of q's first
        max_probes flipped headers.  A value that occurs in two chunks of
        F yields its pairs in both.

    Raises:
        ValueError, TypeError: bad arguments (at the call, before any pair).

    Cost: one sort of n * max_probes (header, query) entries, then per chunk
    one merge of the entries with the chunk: O(entries + chunk) and a
    popcount per (entry, stored value under its header).
    """
    qs = _as_fingerprints(queries)
    probs = _probabilities(probabilities, len(qs))
    header_bits = _check_header_bits(header_bits)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    headers, owners = _expand(qs, probs, header_bits, k, max_probes)
    return (_pairs(_core.psm_join(headers, owners, chunk, header_bits, k, False))
            for chunk in _chunks(stored, chunk_size))


class PsmCollection:
    """A stored collection kept as one sorted array, grown by PSM's batch mode.

    New fingerprints accumulate in a batch Q; when Q holds ``batch_size`` of
    them, :meth:`flush` runs: Q is matched against the stored collection,
    chunk by chunk (:func:`join`), and against itself, then sorted into the
    collection.

    Parameters:
        fingerprints: the initial collection (uint64; duplicates collapse).
        k: Hamming radius.
        batch_size: m, the batch that triggers a flush (>= 1).
        max_probes: headers per query (default all: exact).
        header_bits: p (default :func:`default_header_bits` of the
            collection's size at each flush).
        chunk_size: stored values per merge pass.
    """

    def __init__(self, fingerprints=(), *, k: int, batch_size: int,
                 max_probes: int | None = None, header_bits: int | None = None,
                 chunk_size: int = 1 << 20):
        self.values = sorted_unique(_as_fingerprints(fingerprints))
        self.k = _check_k(k)
        if operator.index(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = operator.index(batch_size)
        self.max_probes = max_probes
        self.header_bits = None if header_bits is None else _check_header_bits(header_bits)
        self.chunk_size = chunk_size
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._n_pending = 0

    def __len__(self) -> int:
        """Stored fingerprints, the pending batch excluded."""
        return len(self.values)

    @property
    def pending(self) -> int:
        """Fingerprints waiting in the batch Q."""
        return self._n_pending

    def add(self, fingerprints, probabilities) -> np.ndarray:
        """Add fingerprints with their (n, 64) flip probabilities to the batch.

        Returns the pairs of every batch this call completed (PAIR_DTYPE;
        see :meth:`flush`), or an empty array.
        Raises ValueError/TypeError for bad input, adding nothing.
        """
        fps = _as_fingerprints(fingerprints)
        probs = _probabilities(probabilities, len(fps)).copy()
        found = []
        start = 0
        while start < len(fps):
            room = self.batch_size - self._n_pending
            self._pending.append((fps[start:start + room], probs[start:start + room]))
            self._n_pending += len(self._pending[-1][0])
            start += room
            if self._n_pending >= self.batch_size:
                found.append(self.flush())
        return np.concatenate(found) if found else np.empty(0, dtype=PAIR_DTYPE)

    def flush(self) -> np.ndarray:
        """Match the batch Q and sort it into the collection; return its pairs.

        Returns a PAIR_DTYPE array sorted by (q, f), each pair once: (q, f)
        for q in Q and f stored (f may equal q when q was stored already)
        and (q, q') for two distinct fingerprints of Q with q < q'.  A pair
        is found when f's header is among q's first max_probes flipped
        headers (for two new ones: either's; for a value added twice in
        one batch: either occurrence's).
        """
        if not self._n_pending:
            return np.empty(0, dtype=PAIR_DTYPE)
        qs = np.concatenate([f for f, _ in self._pending])
        probs = np.concatenate([p for _, p in self._pending])
        p = self.header_bits if self.header_bits is not None \
            else default_header_bits(len(self.values) + len(qs))
        headers, owners = _expand(qs, probs, p, self.k, self.max_probes)
        found = [_pairs(_core.psm_join(headers, owners, chunk, p, self.k, False))
                 for chunk in _chunks(self.values, self.chunk_size)]
        batch = sorted_unique(qs)
        inner = _pairs(_core.psm_join(headers, owners, batch, p, self.k, True))
        lo, hi = np.minimum(inner["q"], inner["f"]), np.maximum(inner["q"], inner["f"])
        inner["q"], inner["f"] = lo, hi
        found.append(inner)
        self.values = merge_unique([self.values, batch])
        self._pending, self._n_pending = [], 0
        return np.unique(np.concatenate(found))


# -- candidates for the document pipeline -----------------------------------------


def candidate_pairs(fingerprints, probabilities, k: int, max_probes: int | None = None, *,
                    header_bits: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return near-duplicate candidates (left, right) among n documents, left < right.

    The PSM candidate generator of the document pipeline: each document
    queries one table of all the fingerprints with its own flip
    probabilities; (i, j) is a candidate when their simhashes are within k
    and j's header is among i's first max_probes flipped headers, or the
    other way round.  Documents with equal simhashes are always candidates
    of each other (the empty flip set is probed first unless a bit's p
    exceeds 1/2).

    Parameters:
        fingerprints: n simhashes (uint64).
        probabilities: (n, 64) flip probabilities, e.g.
            ``Fingerprinter.flip_probabilities(V)`` of the margins V.
        k: Hamming radius (the pipeline's query_k).
        max_probes: headers per document (default all: every pair within k).
        header_bits: p (default :func:`default_header_bits` of n).

    Returns:
        (left, right) int64 index arrays, sorted by (left, right), distinct.

    Cost: n queries of max_probes probes each, in C.
    """
    fps = _as_fingerprints(fingerprints)
    n = len(fps)
    probs = _probabilities(probabilities, n)
    table = PsmTable(fps, header_bits)
    matches, _ = table.query_many(fps, probs, k, max_probes)
    # Every document whose simhash is the matched value: documents sorted by
    # simhash, each distinct value owning a run of them.
    by_value = np.argsort(fps, kind="stable")
    starts = np.searchsorted(fps[by_value], matches["fingerprint"], side="left")
    ends = np.searchsorted(fps[by_value], matches["fingerprint"], side="right")
    counts = ends - starts
    left = np.repeat(matches["query"], counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    right = by_value[np.repeat(starts, counts) + offsets]
    keep = left != right
    a, b = np.minimum(left, right)[keep], np.maximum(left, right)[keep]
    codes = np.unique(a.astype(np.int64) * n + b)
    return codes // n, codes % n
