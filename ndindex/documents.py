"""Texts in, verified near-duplicates out: the document pipeline.

    text -> word 3-shingles -> bottom-k sketch (the record: what verification needs)
                            -> lookup keys (exact key + banded bottom-r super-shingles)
    keys -> candidate pairs (documents sharing a key) -> verified by the sketches

:func:`near_duplicate_pairs` and :func:`near_duplicate_clusters` run it on a
list of texts in memory, no file needed; they are the reference that an
index holding the same records and keys must agree with.  Each stage is a
function of its own so that storage can run it in pieces:
:func:`fingerprint_documents` (text -> :class:`DocumentSketches`, in
parallel), a candidate generator (:func:`band_candidates`, or any function
from DocumentSketches to index pairs, such as probabilistic simhash
matching), :func:`verify` (the bottom-k similarity of each candidate pair,
in C).  The record is in :mod:`ndindex.docrecord`, the keys in
:mod:`ndindex.fingerprint.bands`; both are specified in
format-spec/documents.md.

Short texts.  Band keys need ``rows`` (5) distinct shingles, and are weak
below about 10; texts of 5 to 9 shingles (7 to 11 words) also get deletion
keys, which find every pair of short texts at Jaccard >= 0.8 for certain
(:mod:`ndindex.fingerprint.bands`).  Below s / (s + 1) >= threshold, that
is fewer than 4 shingles (6 words) at 0.8 or 9 (11 words) at 0.9, no
other set can reach the threshold: such a text matches only texts with the
same shingles, an exact match after normalisation.  The results list
those texts in ``exact_only`` with a note.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ndindex import _core, procs
from ndindex.arrays import sorted_unique
from ndindex.cluster import clusters_from_pairs
from ndindex.fingerprint import Fingerprinter, bottom_k, extract
from ndindex.fingerprint import features as feature_pieces
from ndindex.fingerprint.bands import KeyDesign, KeyMaker, min_values_for
from ndindex.fingerprint.normalize import many_texts
from ndindex.fingerprint.minhash import bottom_k_more

__all__ = ["DocumentSketches", "NearDuplicatePairs", "NearDuplicateClusters", "PAIR_DTYPE",
           "fingerprint_documents", "band_candidates", "verify", "near_duplicate_pairs",
           "near_duplicate_clusters", "pairs_of", "clusters_of", "DEFAULT_THRESHOLD"]

DEFAULT_THRESHOLD = 0.8
#: Verified pairs: document indices a < b and the estimated Jaccard similarity.
PAIR_DTYPE = np.dtype([("a", np.int64), ("b", np.int64), ("jaccard", np.float64)])
#: Texts per task of a worker process: enough to amortise pickling and the
#: task's round trip (about a millisecond), few enough to balance the load.
TEXTS_PER_TASK = 1024
#: Below this many texts one process is faster than starting a pool.
MIN_TEXTS_PER_WORKER = 4096
#: Candidate pairs verified per kernel call (bounds the temporaries).
VERIFY_BATCH_PAIRS = 1 << 20

CandidateGenerator = Callable[["DocumentSketches"], "tuple[np.ndarray, np.ndarray]"]


@dataclasses.dataclass
class DocumentSketches:
    """The records and lookup keys of n documents, as CSR arrays.

    Document i's sketch is ``values[offsets[i]:offsets[i + 1]]`` (sorted
    distinct uint32, at most bottom_k) and its lookup keys are
    ``keys[key_offsets[i]:key_offsets[i + 1]]`` (uint64, in the order of
    [DK23]: the exact key, band keys, deletion keys).  ``simhashes`` holds
    each document's 64-bit simhash when it was asked for (what an index
    stores in its tables), else None.
    """

    values: np.ndarray
    offsets: np.ndarray
    keys: np.ndarray
    key_offsets: np.ndarray
    bottom_k: int
    design: KeyDesign
    simhashes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sketch(self, i: int) -> np.ndarray:
        """Return document i's bottom-k sketch."""
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def lookup_keys(self, i: int) -> np.ndarray:
        """Return document i's lookup keys (exact key first)."""
        return self.keys[self.key_offsets[i]:self.key_offsets[i + 1]]

    @property
    def exact_keys(self) -> np.ndarray:
        """Return every document's exact key (uint64, one per document)."""
        return self.keys[self.key_offsets[:-1]]

    def exact_only(self, threshold: float) -> np.ndarray:
        """Return a mask of the documents whose sketches are too small for any
        other shingle set to reach threshold (see :func:`min_values_for`)."""
        return np.diff(self.offsets) < min_values_for(threshold)

    def take(self, indices) -> DocumentSketches:
        """Return the sketches and keys of the given documents, in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        values, offsets = _take_csr(self.values, self.offsets, indices)
        keys, key_offsets = _take_csr(self.keys, self.key_offsets, indices)
        simhashes = None if self.simhashes is None else self.simhashes[indices]
        return DocumentSketches(values, offsets, keys, key_offsets, self.bottom_k, self.design,
                                simhashes)

    @classmethod
    def concatenate(cls, parts: Sequence[DocumentSketches], bottom_k: int,
                    design: KeyDesign) -> DocumentSketches:
        """Return the documents of several parts, in order."""
        if not parts:
            return cls(np.empty(0, np.uint32), np.zeros(1, np.int64), np.empty(0, np.uint64),
                       np.zeros(1, np.int64), bottom_k, design)
        values = np.concatenate([p.values for p in parts])
        keys = np.concatenate([p.keys for p in parts])
        offsets = _concat_offsets([p.offsets for p in parts])
        key_offsets = _concat_offsets([p.key_offsets for p in parts])
        simhashes = None if any(p.simhashes is None for p in parts) else \
            np.concatenate([p.simhashes for p in parts])
        return cls(values, offsets, keys, key_offsets, bottom_k, design, simhashes)


def _take_csr(values, offsets, indices):
    lengths = (offsets[indices + 1] - offsets[indices]) if len(indices) else np.empty(0, np.int64)
    out_offsets = np.zeros(len(indices) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    starts = np.repeat(offsets[indices] - out_offsets[:-1], lengths)
    return values[starts + np.arange(out_offsets[-1])], out_offsets


def _concat_offsets(parts) -> np.ndarray:
    out = [np.zeros(1, np.int64)]
    base = 0
    for off in parts:
        out.append(off[1:] + base)
        base += int(off[-1])
    return np.concatenate(out)


# -- fingerprinting ------------------------------------------------------------------


def _sketch_texts(texts, fingerprinter: Fingerprinter, design: KeyDesign,
                  simhash: bool = False) -> DocumentSketches:
    """Fingerprint texts in this process."""
    maker = KeyMaker(design, fingerprinter.minhash_seed)
    spec, k = fingerprinter.minhash_features, fingerprinter.bottom_k
    sketches, keys, simhashes = [], [], []
    for text in texts:
        text = fingerprinter.text(text)
        # A long text's features come a piece at a time (see _sketch_of)
        features = extract(text, spec) if len(text) <= feature_pieces.PIECE_CHARS else None
        if features is not None:
            sketch, state = bottom_k(features, k), None
        else:
            sketch, state, features = _sketch_of(text, spec, k, maker)
        sketches.append(sketch)
        keys.append(maker.lookup_keys(features, sketch, state))
        if simhash:
            simhashes.append(fingerprinter.simhash_of_text(text))
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum([len(s) for s in sketches], out=offsets[1:])
    key_offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum([len(x) for x in keys], out=key_offsets[1:])
    values = np.concatenate(sketches) if sketches else np.empty(0, np.uint32)
    flat = np.concatenate(keys) if keys else np.empty(0, np.uint64)
    return DocumentSketches(values.astype(np.uint32, copy=False), offsets, flat, key_offsets,
                            k, design, np.array(simhashes, dtype=np.uint64) if simhash else None)


def _sketch_of(text: str, spec, k: int, maker: KeyMaker):
    """(bottom-k sketch, band state, no features) of a long text, read in
    pieces: bottom_k_more, and the band state keeps each band's smallest
    values across pieces.
    Memory: a piece's features, where all of them took 8 bytes a shingle
    (a 200 MB text's 240 MB, twice over while they were joined)."""
    sketch, state = np.empty(0, np.uint32), maker.band_state()
    for features in feature_pieces.extract_pieces(text, spec):
        sketch = bottom_k_more(sketch, features, k)
        maker.band_keys(features, state)
    return sketch, state, np.empty(0, np.uint64)


def fingerprint_documents(texts: Sequence, fingerprinter: Fingerprinter | None = None,
                          design: KeyDesign | None = None, *,
                          workers: int | None = None, simhash: bool = False) -> DocumentSketches:
    """Return the bottom-k sketches and lookup keys of texts.

    Parameters: texts, a sequence of str or bytes (UTF-8); fingerprinter, the
    shingles, sketch size and MinHash seed (default ``Fingerprinter()``:
    word 3-shingles, bottom-1024); design, the band keys (default
    ``KeyDesign()``: 20 bands of 5 rows); workers, processes fingerprinting
    in parallel (default: one per core when there are at least
    MIN_TEXTS_PER_WORKER texts per core, else 1; 1 runs in this process);
    simhash, also compute each text's 64-bit simhash (``simhashes``).

    Raises: TypeError for a text that is neither str nor bytes;
    BinaryDataError for bytes that look binary (unless the fingerprinter
    has ``binary="text"``).

    Cost: per text, linear in its length plus O(shingles * bands) in C.
    """
    fingerprinter = Fingerprinter() if fingerprinter is None else fingerprinter
    design = KeyDesign() if design is None else design
    texts = list(many_texts(texts, "texts"))
    workers = _worker_count(len(texts), workers)
    if workers <= 1:
        return _sketch_texts(texts, fingerprinter, design, simhash)
    chunks = [texts[i:i + TEXTS_PER_TASK] for i in range(0, len(texts), TEXTS_PER_TASK)]
    pool = _pool(workers)
    try:
        tasks = [procs.PoolTask(pool, _sketch_texts, chunk, fingerprinter, design, simhash)
                 for chunk in chunks]
        try:
            parts = [task.result() for task in tasks]
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
    except procs.WorkersDied:
        _drop_pool(workers)
        raise
    finally:
        if procs.forked():
            # A child of fork() leaves by os._exit, as multiprocessing's
            # children do, and nothing would shut a kept pool down: its
            # workers stayed, orphans, for ever.
            with _pools_lock:
                _pools.pop(workers, None)
            pool.shutdown(wait=True)
    return DocumentSketches.concatenate(parts, fingerprinter.bottom_k, design)


_pools: dict = {}
_pools_lock = threading.Lock()


def _pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of worker processes kept for the next call (starting one costs about a
    second), started as procs.context() says."""
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=procs.context())
        return pool


@atexit.register
def _shutdown_pools() -> None:
    # Before the interpreter tears modules down: an executor collected later
    # reports an AttributeError from its weakref callback.
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


def _forget_pools() -> None:
    # A child of fork() has none of the pools' threads: a call there waited
    # for ever on the parent's pool.  Its own pools start afresh; the
    # parent's stay referenced, so that nothing here touches them.
    global _pools, _pools_lock
    _inherited_pools.extend(_pools.values())
    _pools, _pools_lock = {}, threading.Lock()


_inherited_pools: list = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _drop_pool(workers: int) -> None:
    with _pools_lock:
        pool = _pools.pop(workers, None)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


def _worker_count(n_texts: int, workers: int | None) -> int:
    if workers is None:
        return max(1, min(os.cpu_count() or 1, n_texts // MIN_TEXTS_PER_WORKER))
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    return workers


# -- candidates and verification --------------------------------------------------------


def band_candidates(docs: DocumentSketches) -> tuple[np.ndarray, np.ndarray]:
    """Return the candidate pairs (left < right, int64, distinct): documents that
    share at least one lookup key.

    This is the default candidate generator; any function with this
    signature can replace it.  Cost: one sort of all keys, plus a key
    shared by m documents yields m(m-1)/2 pairs (the pipeline groups
    identical sketches first, so m counts distinct near-duplicates).
    """
    n = len(docs)
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(docs.key_offsets))
    order = np.argsort(docs.keys, kind="stable")
    keys, owner = docs.keys[order], owner[order]
    if len(keys) < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    lengths = np.diff(np.r_[starts, len(keys)])
    shared = lengths > 1
    starts, lengths = starts[shared], lengths[shared]
    if not len(starts):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    # Every pair (x, y), x before y, inside each group of equal keys.
    member = np.repeat(starts, lengths) + _ranges(lengths)
    later = np.repeat(lengths, lengths) - _ranges(lengths) - 1
    left_pos = np.repeat(member, later)
    right_pos = left_pos + 1 + _ranges(later)
    a, b = owner[left_pos], owner[right_pos]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    keep = lo != hi
    codes = sorted_unique(lo[keep].astype(np.uint64) * np.uint64(n) + hi[keep].astype(np.uint64))
    return (codes // np.uint64(n)).astype(np.int64), (codes % np.uint64(n)).astype(np.int64)


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """Return concatenated aranges: 0..lengths[0]-1, 0..lengths[1]-1, ..."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, np.int64)
    starts = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)


def verify(docs: DocumentSketches, left, right, threshold: float = 0.0) -> np.ndarray:
    """Return the bottom-k similarity ([DV30]) of each pair (left[i], right[i]).

    Exact Jaccard of the shingle sets when both sketches hold fewer than
    bottom_k values; otherwise the bottom-k estimate.  With a threshold > 0,
    a pair that cannot reach it may stop early and get an upper bound of its
    similarity instead (still below the threshold): what is >= threshold is
    exact.  Raises ValueError for an index outside the documents.
    Cost: O(bottom_k) per pair in C; false candidates stop after a part.
    """
    left = np.ascontiguousarray(left, dtype=np.int64)
    right = np.ascontiguousarray(right, dtype=np.int64)
    if left.shape != right.shape:
        raise ValueError(f"left and right differ in length: {len(left)} and {len(right)}")
    out = np.empty(len(left), dtype=np.float64)
    for start in range(0, len(left), VERIFY_BATCH_PAIRS):
        part = slice(start, start + VERIFY_BATCH_PAIRS)
        out[part] = np.frombuffer(_core.similarity(docs.values, docs.offsets, left[part],
                                                   right[part], docs.bottom_k, float(threshold)),
                                   dtype=np.float64)
    return out


# -- the one-call functions ------------------------------------------------------------


@dataclasses.dataclass
class _Verified:
    """Verified pairs between representatives of groups of identical sketches."""

    n: int
    group: np.ndarray        # group of each document (its representative's index)
    rep_a: np.ndarray
    rep_b: np.ndarray
    jaccard: np.ndarray
    exact_only: np.ndarray   # indices of the texts matched exactly only
    threshold: float


def _group_identical(docs: DocumentSketches) -> np.ndarray:
    """Return each document's representative: the first document with the same
    sketch (same exact key, confirmed value by value)."""
    n = len(docs)
    exact = docs.exact_keys
    order = np.argsort(exact, kind="stable")
    rep = np.arange(n, dtype=np.int64)
    if n < 2:
        return rep
    k = exact[order]
    same = np.r_[False, k[1:] == k[:-1]]
    first = order[np.maximum.accumulate(np.where(~same, np.arange(n), 0))]
    rep[order] = first
    # A 64-bit key collision between different sketches is not trusted:
    # such a document stays its own representative.
    moved = np.flatnonzero(rep != np.arange(n))
    if len(moved):
        identical = verify(docs, moved, rep[moved]) == 1.0
        identical &= np.diff(docs.offsets)[moved] == np.diff(docs.offsets)[rep[moved]]
        rep[moved[~identical]] = moved[~identical]
    return rep


def _check_threshold(threshold) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or \
            not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    return float(threshold)


def _run(texts, threshold, workers, fingerprinter, design, candidates) -> _Verified:
    threshold = _check_threshold(threshold)
    if design is None:
        design = KeyDesign() if threshold >= 0.8 else KeyDesign.for_threshold(threshold)
    docs = fingerprint_documents(texts, fingerprinter, design, workers=workers)
    return _verify_all(docs, threshold, candidates)


def _verify_all(docs: DocumentSketches, threshold: float, candidates=None) -> _Verified:
    """Candidates among the documents' representatives, verified."""
    group = _group_identical(docs)
    reps = np.flatnonzero(group == np.arange(len(docs)))
    rep_docs = docs.take(reps)
    left, right = (candidates or band_candidates)(rep_docs)
    sims = verify(rep_docs, left, right, threshold)
    ok = sims >= threshold
    return _Verified(len(docs), group, reps[left[ok]], reps[right[ok]], sims[ok],
                     np.flatnonzero(docs.exact_only(threshold)), threshold)


def _note(verified: _Verified) -> str | None:
    if not len(verified.exact_only):
        return None
    s = min_values_for(verified.threshold)
    return (f"{len(verified.exact_only)} text(s) have fewer than {s} distinct word 3-shingles "
            f"(fewer than {s + 2} words): no other text can reach Jaccard "
            f"{verified.threshold:g} with them, so they are matched as exact duplicates only "
            "(the same words after normalisation); see exact_only")


@dataclasses.dataclass
class NearDuplicatePairs:
    """Verified near-duplicate pairs of a list of texts.

    Attributes:
        pairs: PAIR_DTYPE array (a < b, indices into the texts; jaccard, the
            bottom-k estimate, exact for texts of under bottom_k shingles),
            sorted by (a, b).
        exact_only: indices of the texts too short for any other text to
            reach the threshold: matched exactly only.
        note: a sentence about exact_only, or None when it is empty.
    """

    pairs: np.ndarray
    exact_only: np.ndarray
    note: str | None

    def __len__(self) -> int:
        return len(self.pairs)

    def __iter__(self):
        return iter(self.pairs)


@dataclasses.dataclass
class NearDuplicateClusters:
    """Clusters (connected components of verified pairs) of a list of texts.

    Attributes:
        clusters: sorted int64 arrays of text indices, each of at least
            min_size texts, ordered by their smallest member.
        exact_only, note: as in :class:`NearDuplicatePairs`.
    """

    clusters: list
    exact_only: np.ndarray
    note: str | None

    def __len__(self) -> int:
        return len(self.clusters)

    def __iter__(self):
        return iter(self.clusters)


def near_duplicate_pairs(texts: Sequence, threshold: float = DEFAULT_THRESHOLD, *,
                         workers: int | None = None,
                         fingerprinter: Fingerprinter | None = None,
                         design: KeyDesign | None = None,
                         candidates: CandidateGenerator | None = None) -> NearDuplicatePairs:
    """Return every pair of texts whose word 3-shingle Jaccard similarity, as the
    bottom-k sketches estimate it, is at least threshold.

    Parameters: texts, a sequence of str or bytes; threshold in (0, 1];
    workers, processes that fingerprint (see :func:`fingerprint_documents`);
    fingerprinter and design, the pipeline's choices (defaults: word
    3-shingles, bottom-1024, 20 bands of 5 rows; below threshold 0.8 more
    bands, :meth:`KeyDesign.for_threshold`); candidates, a candidate
    generator replacing :func:`band_candidates`.

    Returns: :class:`NearDuplicatePairs`.  Texts with identical sketches are
    paired with jaccard 1.0; a group of m identical texts yields m(m-1)/2
    pairs (use :func:`near_duplicate_clusters` to avoid the expansion).

    Raises: ValueError for a threshold outside (0, 1] or a bad workers
    count; TypeError / BinaryDataError for a text that is not text.
    """
    return _pairs(_run(texts, threshold, workers, fingerprinter, design, candidates))


def pairs_of(docs: DocumentSketches, threshold: float = DEFAULT_THRESHOLD,
             candidates: CandidateGenerator | None = None) -> NearDuplicatePairs:
    """:func:`near_duplicate_pairs` of documents already fingerprinted
    (an index's stored documents, say)."""
    return _pairs(_verify_all(docs, _check_threshold(threshold), candidates))


def _pairs(v: _Verified) -> NearDuplicatePairs:
    size = np.bincount(v.group, minlength=v.n)
    members = {int(g[0]): g for g in _members(v.group, size)}
    # Most texts have no identical twin: their verified pairs are the output.
    single = (size[v.rep_a] == 1) & (size[v.rep_b] == 1)
    parts_a, parts_b, parts_j = [v.rep_a[single]], [v.rep_b[single]], [v.jaccard[single]]
    # Pairs inside a group of identical sketches.
    for group in members.values():
        i, j = np.triu_indices(len(group), 1)
        parts_a.append(group[i])
        parts_b.append(group[j])
        parts_j.append(np.ones(len(i)))
    # Every member of one group with every member of the other.
    for ra, rb, s in zip(v.rep_a[~single].tolist(), v.rep_b[~single].tolist(),
                         v.jaccard[~single].tolist()):
        ga = members.get(ra, np.array([ra]))
        gb = members.get(rb, np.array([rb]))
        parts_a.append(np.repeat(ga, len(gb)))
        parts_b.append(np.tile(gb, len(ga)))
        parts_j.append(np.full(len(ga) * len(gb), s))
    a, b = np.concatenate(parts_a).astype(np.int64), np.concatenate(parts_b).astype(np.int64)
    out = np.empty(len(a), dtype=PAIR_DTYPE)
    out["a"], out["b"] = np.minimum(a, b), np.maximum(a, b)
    out["jaccard"] = np.concatenate(parts_j)
    out = out[np.lexsort((out["b"], out["a"]))]
    return NearDuplicatePairs(out, v.exact_only, _note(v))


def _members(group: np.ndarray, size: np.ndarray) -> list[np.ndarray]:
    """Return the documents (sorted) of each group of two or more; the first is
    the group's representative."""
    docs = np.flatnonzero(size[group] > 1)
    if not len(docs):
        return []
    order = docs[np.argsort(group[docs], kind="stable")]
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    return np.split(order, starts[1:])


def near_duplicate_clusters(texts: Sequence, threshold: float = DEFAULT_THRESHOLD, *,
                            min_size: int = 2, workers: int | None = None,
                            fingerprinter: Fingerprinter | None = None,
                            design: KeyDesign | None = None,
                            candidates: CandidateGenerator | None = None
                            ) -> NearDuplicateClusters:
    """Return the clusters of texts linked by verified near-duplicate pairs
    (union-find over the pairs of :func:`near_duplicate_pairs`, without
    expanding groups of identical texts into their pairs).

    Parameters as for :func:`near_duplicate_pairs`; min_size, the smallest
    cluster reported (2: texts without a near-duplicate are left out).
    Returns: :class:`NearDuplicateClusters`.
    """
    _check_min_size(min_size)
    return _clusters(_run(texts, threshold, workers, fingerprinter, design, candidates), min_size)


def clusters_of(docs: DocumentSketches, threshold: float = DEFAULT_THRESHOLD,
                min_size: int = 2) -> NearDuplicateClusters:
    """:func:`near_duplicate_clusters` of documents already fingerprinted."""
    _check_min_size(min_size)
    return _clusters(_verify_all(docs, _check_threshold(threshold)), min_size)


def _check_min_size(min_size) -> None:
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
        raise ValueError(f"min_size must be a positive int, got {min_size!r}")


def _clusters(v: _Verified, min_size: int) -> NearDuplicateClusters:
    docs = np.arange(v.n, dtype=np.int64)
    left = np.concatenate([docs, v.rep_a])
    right = np.concatenate([v.group, v.rep_b])
    return NearDuplicateClusters(clusters_from_pairs(v.n, left, right, min_size),
                                 v.exact_only, _note(v))
