"""The methods of Index that read: query, query_many, query_text, keys.

A query probes every table's runs, the log and the writer's pending
operations (Index._view gives them, consistent) through the C kernel
(:mod:`ndindex.reader`'s snapshots hold its view of the file); a PSM query
probes table 0 at flip sets of the query's prefix (:mod:`ndindex.psm`).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ndindex import _core, plan as plans, records as rec, validate
from ndindex.errors import ClosedError

#: query_many splits batches of at least this many queries across threads.
PARALLEL_QUERY_MIN = 4096

#: The flip probability of every bit in a PSM query given none: any value
#: below 1/2 orders flip sets by size, fewest flipped bits first.
UNIFORM_FLIP_PROBABILITY = 0.25

#: Most flip sets one PSM query may probe: the kernel holds them in one
#: buffer (128 MiB), and at about a microsecond a probe more would take
#: minutes per query.
MAX_PROBES = 1 << 24


class Match(NamedTuple):
    """One query result: a stored fingerprint, its distance, its document keys."""

    fingerprint: int
    distance: int
    keys: tuple


#: The first queries after open ask the page cache for the pages they will
#: read one tree level at a time (Snapshot.prefetch): on a cold file their
#: reads then overlap, where a query's descents through four tables' runs
#: would otherwise wait for each page in turn (65 reads one after another
#: on a streamed and churned 30M file).  Later queries find the upper
#: levels cached, and the prefetch's madvise calls (tens of microseconds)
#: would cost more than they save.
COLD_QUERIES = 8

MATCH_DTYPE = np.dtype([("query", np.int64), ("fingerprint", np.uint64), ("distance", np.uint8)])


class QueryMethods:
    """query, query_many, query_text, keys, keys_many, fingerprints_of, ``in``."""

    def query(self, fingerprint: int, k: int | None = None, *, keys: bool = True,
              probabilities=None, margins=None, max_probes: int | None = None) -> list[Match]:
        """Return every stored fingerprint within Hamming distance k, nearest first.

        Parameters: fingerprint, a 64-bit int; k, at most the index's k
        (default: the index's k); keys, whether to fetch document keys.
        Probabilistic simhash matching (PSM; ``docs/psm.md``): probabilities,
        the 64 flip probabilities of the query's bits (p_j of bit j), or
        margins, its simhash weight vector V (turned into probabilities by
        the stored fingerprinter's flip model); max_probes, how many flip
        sets to probe (default ``plan.psm_max_probes(k)``: 64 at k = 3, 256
        at k = 10).  With either, or on an index created with plan="psm",
        only table 0 is probed: at the prefixes of the query XOR each flip
        set of at most k prefix bits, most probable first (without
        probabilities: by size), up to max_probes of them; a fingerprint is
        found when it is within k and its prefix is probed.  max_probes >=
        ``plan.flip_set_count(p, k)`` probes every set and finds all.
        Returns a list of Match(fingerprint, distance, keys), ordered by
        (distance, fingerprint).  Uncommitted operations of this index's
        open transaction (or normal-durability journal) are included.
        Raises TypeError/ValueError for bad arguments, CorruptionError if a
        page, chunk or block read fails its checks.  Cost: one probe per
        run of each table (PSM: of table 0, per flip set probed), each
        decoding about one block.
        """
        q = validate.fingerprint(fingerprint)
        k = validate.query_k(k, self._header.k)
        probs = self._flip_probabilities(probabilities, margins, None, max_probes)
        snap, pend = self._view()
        return _matches(snap, pend, self._found(snap, pend, q, k, probs, max_probes), keys)

    def _found(self, snap, pend, q: int, k: int, probs, max_probes) -> list:
        """(fingerprint, distance) within k of q: the tables' exact query, or PSM
        with flip probabilities probs."""
        if probs is None:
            if self._queries <= COLD_QUERIES and not self._directories.warm:
                snap.prefetch(q, k)
            if pend is None:
                return _core.query(snap.kernel, q, k)
            return _core.query(snap.kernel, q, k, *pend.query_view(self.plan))
        return snap.query_psm(q, k, probs, self._probe_budget(k, max_probes), pend)

    def query_many(self, fingerprints, k: int | None = None, *, probabilities=None,
                   margins=None, max_probes: int | None = None) -> np.ndarray:
        """Answer query() for a batch; return one structured array of all matches.

        The result has fields ``query`` (index into the batch),
        ``fingerprint`` and ``distance``, grouped by query and ordered by
        (distance, fingerprint) within each.  probabilities or margins, an
        (n, 64) array (one row per query), and max_probes: as in
        :meth:`query`.  Large batches are split across threads (the kernel
        releases the GIL).  Use :meth:`keys` for document keys.  Raises
        ValueError for input that is not 1-D.
        """
        qs = validate.fingerprints(fingerprints)
        k = validate.query_k(k, self._header.k)
        probs = self._flip_probabilities(probabilities, margins, len(qs), max_probes)
        snap, pend = self._view()
        return self._query_batch(snap, pend, qs, k, probs, max_probes)

    def _query_batch(self, snap, pend, qs, k: int, probs, max_probes) -> np.ndarray:
        """query_many's answer from snap and pend, split across threads when large."""
        if probs is None:
            def run(a, b):
                return snap.query_many(qs[a:b], k, pend)
        else:
            budget = self._probe_budget(k, max_probes)

            def run(a, b):
                return snap.query_psm_many(qs[a:b], k, probs[a:b], budget, pend)
        workers = min(os.cpu_count() or 1, 8)
        if len(qs) < PARALLEL_QUERY_MIN or workers == 1:
            return _to_matches(*run(0, len(qs)), offset=0)
        bounds = np.linspace(0, len(qs), workers + 1).astype(np.int64)
        with self._pool_lock:
            futures = [self._batch_pool(workers).submit(run, a, b)
                       for a, b in zip(bounds[:-1], bounds[1:])]
        return np.concatenate([_to_matches(*f.result(), offset=int(a))
                               for f, a in zip(futures, bounds[:-1])])

    def _batch_pool(self, workers: int):
        """query_many's thread pool (self._pool_lock held), made at first use.

        close() in another thread sets it to False under the same lock: a
        batch that comes after raises ClosedError, where submitting to the
        pool raised RuntimeError ("cannot schedule new futures after
        shutdown"), and a new pool would have outlived the index.
        """
        if self._pool is False:
            raise ClosedError(f"{self.path}: index is closed")
        if self._pool is None:
            from ndindex.threadpool import ThreadPool  # Ctrl-C safe; see its module
            self._pool = ThreadPool(workers, "ndindex")
        return self._pool

    def query_text(self, text, k: int | None = None, *, keys: bool = True,
                   max_probes: int | None = None) -> list[Match]:
        """Return the stored fingerprints within k of a text's simhash, nearest first.

        The text (str or bytes) is fingerprinted by the index's stored
        fingerprinter.  On a plan="psm" index, or when max_probes is given,
        the query is probabilistic with the text's own flip probabilities
        (its margins through the fingerprinter's flip model); otherwise it
        is :meth:`query` of the simhash.  A text without a word to
        fingerprint matches nothing (its simhash, 0, says nothing of it).
        Raises ValueError if the index stores no fingerprinter; otherwise as
        :meth:`query`.
        """
        fpr = self._fingerprinter()
        simhash, margins = fpr.simhash_with_weights(text)
        if not margins.any():
            return []
        if not self.plan.probabilistic and max_probes is None:
            return self.query(simhash, k, keys=keys)
        return self.query(simhash, k, keys=keys, margins=margins, max_probes=max_probes)

    def _fingerprinter(self, required: bool = True):
        """The stored Fingerprinter (parsed once, with the document configuration);
        if there is none, ValueError when required, else None."""
        if self.fingerprinter is None:
            if not required:
                return None
            raise ValueError(f"{self.path}: the index stores no fingerprinter (it stores "
                             "fingerprints only): texts need Index.create(..., "
                             "fingerprinter=Fingerprinter()); query() takes fingerprints")
        return self._doc_config.fingerprinter

    def _flip_probabilities(self, probabilities, margins, rows: int | None, max_probes):
        """The flip probabilities a PSM query uses, or None for the tables' exact query.

        rows: None for one query ((64,) arrays), else the batch size ((rows, 64)).
        """
        if probabilities is None and margins is None and max_probes is None and \
                not self.plan.probabilistic:
            return None  # the common case, first: check_and_add asks per item
        if probabilities is not None and margins is not None:
            raise TypeError("give probabilities or margins, not both")
        shape = (64,) if rows is None else (rows, 64)
        if margins is not None:
            from ndindex.fingerprint import DEFAULT_FLIP_MODEL
            fpr = self._fingerprinter(required=False)
            model = (fpr.flip_model if fpr is not None else None) or DEFAULT_FLIP_MODEL
            probabilities = model.probabilities(_float_array(margins, shape, "margins"))
        elif probabilities is None:
            if self.plan.probabilistic:
                # Every bit alike: flip sets come out by size, fewest bits first.
                return np.full(shape, UNIFORM_FLIP_PROBABILITY)
            if max_probes is not None:
                raise ValueError("max_probes needs probabilities or margins on an index of "
                                 "permuted tables (its plain queries are exact)")
            return None
        return _float_array(probabilities, shape, "probabilities")

    def _probe_budget(self, k: int, max_probes) -> int:
        """max_probes checked (default plan.psm_max_probes(k)), at most every flip set."""
        if max_probes is None:
            return plans.psm_max_probes(k)
        if isinstance(max_probes, bool) or not isinstance(max_probes, (int, np.integer)):
            raise TypeError(f"max_probes must be an int, got {type(max_probes).__name__}")
        if max_probes < 1:
            raise ValueError(f"max_probes must be >= 1, got {max_probes}")
        budget = int(min(max_probes, plans.flip_set_count(self.plan.tables[0].prefix_bits, k)))
        if budget > MAX_PROBES:
            raise ValueError(f"max_probes {budget:,} is more than {MAX_PROBES:,} flip sets: "
                             "probe fewer")
        return budget

    def keys(self, fingerprint: int) -> tuple:
        """Return the document keys stored with a fingerprint (empty if none)."""
        fp = validate.fingerprint(fingerprint)
        snap, pend = self._view()
        return snap.keys_of([fp], pend)[0]

    def keys_many(self, fingerprints) -> list:
        """Return keys() of each fingerprint of a batch, in order: one pass over
        the key records (query_many's matches, say), not a lookup each."""
        fps = validate.fingerprints(fingerprints)
        snap, pend = self._view()
        return snap.keys_of(fps.tolist(), pend)

    def fingerprints_of(self, keys):
        """Return the fingerprints stored with a document key (a sorted list of
        ints, empty if none), or with each key of a list (a list of them):
        keys() the other way.  One batched pass over the key records."""
        one = isinstance(keys, (str, bytes))
        raws = [rec.encode_doc_key(key) for key in ([keys] if one else list(keys))]
        snap, pend = self._view()
        found = snap.fps_of_keys(raws, pend)
        return found[0] if one else found

    def __contains__(self, fingerprint) -> bool:
        return bool(self.query(validate.fingerprint(fingerprint), 0, keys=False))


def _float_array(values, shape: tuple, name: str) -> np.ndarray:
    """values as a C-contiguous float64 array of the given shape, else ValueError."""
    try:
        out = np.ascontiguousarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numbers of shape {shape}: {exc}") from None
    if out.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {out.shape}")
    return out


def _matches(snap, pend, found: list, keys: bool) -> list:
    """Match objects for found (fingerprint, distance) pairs, with keys if asked."""
    if not found:
        return []
    if not keys:
        return [Match(f, d, ()) for f, d in found]
    return [Match(f, d, ks) for (f, d), ks in zip(found, snap.keys_of([f for f, _ in found], pend))]


def _to_matches(qidx: bytes, fps: bytes, dists: bytes, offset: int) -> np.ndarray:
    out = np.empty(len(dists), dtype=MATCH_DTYPE)
    out["query"] = np.frombuffer(qidx, dtype=np.int64) + offset
    out["fingerprint"] = np.frombuffer(fps, dtype=np.uint64)
    out["distance"] = np.frombuffer(dists, dtype=np.uint8)
    return out
