"""The document methods of Index: texts in, verified near-duplicates out (FORMAT.md 7.9).

A mixin of :class:`ndindex.index.Index`, kept apart so that each reads in
one sitting: an index created with a fingerprinter stores per document its
simhash (in the tables, with its key), its bottom-k sketch and lookup keys
(:mod:`ndindex.docstore`), under the same log, transactions and
compaction as the fingerprints.  The methods use Index's writer and
snapshots (``_writer``, ``_view``, ``_check_writable``).
"""

from __future__ import annotations

import functools

from ndindex import docstore, records as rec, removal, validate
from ndindex.arrays import sorted_unique
from ndindex.errors import NdindexError
from ndindex.overlay import RecordOps
from ndindex.records import LogRecord


class DocumentMethods:
    """add_documents, similar, near_duplicate_pairs, clusters, document_data, documents."""

    @functools.cached_property
    def _doc_config(self) -> "docstore.DocConfig":
        """The stored fingerprinter and key design (documents need both)."""
        snap = self._snapshot()
        raw = snap.view.get(rec.DB_META, rec.KEY_FINGERPRINTER)
        if raw is None:
            raise NdindexError(f"{self.path}: this index stores fingerprints only (it was "
                               "created without a fingerprinter); documents need "
                               "Index.create(..., fingerprinter=Fingerprinter())")
        design = snap.view.get(rec.DB_META, rec.KEY_KEY_DESIGN)
        return docstore.DocConfig.from_records(
            rec.unframe(raw, rec.DB_META, rec.KEY_FINGERPRINTER),
            None if design is None else rec.unframe(design, rec.DB_META, rec.KEY_KEY_DESIGN))

    def add_documents(self, texts, keys, *, data=None, workers: int | None = None,
                      skip_empty: bool = False) -> int:
        """Add texts as documents under their keys (one text and key, or sequences
        or other iterables of them, read whole: the call is one commit).

        Each document's simhash goes into the tables with its key (as
        :meth:`add`), and its sketch and lookup keys into the file, so that
        :meth:`similar` and :meth:`near_duplicate_pairs` verify candidates.
        A key names one document: a text added under a key that holds one
        replaces it.  Many texts are fingerprinted in parallel (workers, as
        in :func:`ndindex.documents.fingerprint_documents`).  data: optional
        bytes per document (at most 1 KiB each; None for none) kept with it
        (:meth:`document_data`).

        Returns the number of documents added.  Raises NdindexError if the
        index was created without a fingerprinter; TypeError for a text that
        is not str or bytes or data that is not bytes, BinaryDataError for binary bytes; ValueError for
        mismatched lengths, a key given twice, or a text without a single
        word to fingerprint (unless skip_empty, which skips it).  Nothing
        is written when it raises.
        """
        self._check_writable()
        config = self._doc_config
        texts, raws, data = docstore.check_batch(texts, keys, data)
        try:
            docs = config.fingerprint(texts, workers)
        except ValueError as exc:
            from ndindex.fingerprint.normalize import BinaryDataError, looks_binary
            if not isinstance(exc, BinaryDataError):
                raise
            # Which of the call's texts: the batch's error named none.
            binary = [raw for text, raw in zip(texts, raws)
                      if not isinstance(text, str) and looks_binary(text)]
            if not binary:
                raise
            raise BinaryDataError(
                f"document {rec.decode_doc_key(binary[0], 'documents')!r} looks binary "
                f"({len(binary)} such text(s) in this call): documents must be text, or the "
                "index's fingerprinter made with Fingerprinter(binary='text')") from exc
        keep = docstore.non_empty(docs, raws, skip_empty)
        if len(keep) < len(raws):
            docs = docs.take(keep)
            raws = [raws[i] for i in keep.tolist()]
            data = [data[i] for i in keep.tolist()] if data else data
        if not raws:
            return 0
        fps = docs.simhashes
        with self._writer.lock:
            snap, pend = self._view()
            # Documents already under these keys are replaced.
            deletes, gone = removal.key_deletions(snap, pend, [], raws)
            ops = RecordOps()
            for fp, old in deletes.items():
                for raw in old:
                    ops.set_key(fp, raw, False)
            for space, key, flag, value in docstore.replaced_lookups(
                    docstore.removal_records(snap, pend, deletes),
                    docstore.addition_records(fps, docs, raws, data)):
                ops.set(space, key, flag, value)
            for fp, raw in zip(fps.tolist(), raws):
                ops.set_key(fp, raw, True)
            adds = sorted_unique(fps)
            removes = removal.live(snap, pend, gone - set(adds.tolist()))
            puts, key_deletes, records = ops.to_record_parts()
            self._writer.apply(LogRecord(adds, removes, puts, key_deletes, records))
        return len(raws)

    def similar(self, text=None, *, key=None, threshold: float | None = None,
                limit: int | None = None) -> list:
        """Return the stored documents near-duplicate to a text (or to a stored document).

        Give text (str or bytes), or key= of a stored document (which is
        then left out of its own results).  Candidates share a lookup key
        with it (whatever their simhash distance); each is verified by its
        bottom-k sketch.  Returns DocumentMatch(key, similarity,
        fingerprint) with estimated Jaccard similarity >= threshold
        (default: the fingerprinter's, 0.8), most similar first, at most
        limit of them.  Raises KeyError for an unknown key, ValueError for a
        threshold below the one the index's lookup keys were designed for.
        """
        config = self._doc_config
        threshold = config.check_threshold(threshold)
        if (text is None) == (key is None):
            raise TypeError("similar() needs a text or key=, not both")
        snap, pend = self._view()
        exclude = None
        if key is not None:
            raw = rec.encode_doc_key(key)
            found = [(fp, docstore.documents_of(snap, pend, fp).get(raw))
                     for fp in snap.fps_of_key(raw, pend)]
            found = [(fp, doc) for fp, doc in found if doc is not None]
            if not found:
                raise KeyError(key)
            fp, doc = found[0]
            sketch, lookup_keys, exclude = doc.sketch, doc.lookup_keys, (fp, raw)
        else:
            docs = config.fingerprint([text], 1, simhash=False)
            sketch, lookup_keys = docs.sketch(0), docs.lookup_keys(0)
        hits = docstore.similar(snap, pend, sketch, lookup_keys, config.fingerprinter.bottom_k,
                                threshold, exclude)
        return hits if limit is None else hits[:validate.positive_int(limit, "limit")]

    def near_duplicate_pairs(self, threshold: float | None = None) -> list:
        """Return every pair of stored documents at similarity >= threshold.

        A list of (key_a, key_b, similarity), sorted.  Reads every document
        record: O(documents) time and memory (the in-memory pipeline of
        :func:`ndindex.near_duplicate_pairs` over the stored sketches).
        """
        config = self._doc_config
        threshold = config.check_threshold(threshold)
        from ndindex.documents import pairs_of
        stored = self._stored_documents(config)
        found = pairs_of(stored.docs, threshold).pairs
        names = [rec.decode_doc_key(raw, "documents") for raw in stored.keys]
        return [(names[a], names[b], float(j))
                for a, b, j in zip(found["a"].tolist(), found["b"].tolist(),
                                   found["jaccard"].tolist())]

    def clusters(self, threshold: float | None = None, min_size: int = 2) -> list:
        """Return groups of stored documents joined by near-duplicate pairs (union-find).

        A list of lists of document keys, each sorted by key order in the
        file, largest cluster first; documents without a near-duplicate are
        left out (min_size=1 keeps them).  Cost as :meth:`near_duplicate_pairs`.
        """
        config = self._doc_config
        threshold = config.check_threshold(threshold)
        stored = self._stored_documents(config)
        names = [rec.decode_doc_key(raw, "documents") for raw in stored.keys]
        from ndindex.documents import clusters_of
        groups = clusters_of(stored.docs, threshold, min_size).clusters
        out = [[names[i] for i in g.tolist()] for g in groups]
        out.sort(key=len, reverse=True)
        return out

    def document_data(self, key) -> bytes:
        """Return the data stored with a document (see add_documents); KeyError if none."""
        self._doc_config
        raw = rec.encode_doc_key(key)
        snap, pend = self._view()
        for fp in snap.fps_of_key(raw, pend):
            doc = docstore.documents_of(snap, pend, fp).get(raw)
            if doc is not None:
                return doc.data
        raise KeyError(key)

    def documents(self):
        """Yield (key, fingerprint, data) of every stored document, in (fingerprint, key) order.

        One snapshot serves the whole iteration; O(documents) time, a few
        chunks of memory at a time.
        """
        self._doc_config
        snap, pend = self._view()
        for key, value in snap.space_records(rec.SPACE_DOCS, pend):
            doc = docstore.unpack_document(value, key)
            yield (rec.decode_doc_key(key[8:], "documents"), rec.U64_BE.unpack_from(key)[0],
                   doc.data)

    def _stored_documents(self, config) -> "docstore.StoredSet":
        snap, pend = self._view()
        return docstore.load_all(snap, pend, config.fingerprinter.bottom_k, config.design)
