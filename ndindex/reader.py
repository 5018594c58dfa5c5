"""Reading an index: snapshots of the committed state, queries, keys, iteration.

A ``Snapshot`` is one committed state: an LMDB read transaction (which pins
its pages), the page view of it, the state and manifest records, the
tombstone run, the net effect of the append log, and the query kernel's
capsule over all of that.  Building one reads O(runs + log), never O(N):
the runs' chunks, and the tombstones of what a query finds, are looked up
by the kernel in the chunks tree at query time.  A new snapshot reuses
what did not change since the previous one (the manifest by generation,
the tombstone arrays, when read, by run, the log by extending it with only
the new records).
What outlives snapshots for as long as a run lasts (its directory, or its
values held in memory) is kept in :mod:`ndindex.dircache`.

Concurrency follows LMDB: any number of reader threads and processes, one
writer at a time; each call works on the snapshot current when it starts.
"""

from __future__ import annotations

import functools
import heapq
import os
import threading
from typing import NamedTuple

import numpy as np

from ndindex import _core, chunks as ch, dircache, runs as rn
from ndindex.arrays import (EMPTY_U64, add_recent, insert_sorted, isin_sorted, merge_unique,
                            sorted_unique)
from ndindex.errors import CorruptionError
from ndindex.overlay import LogOverlay, PendingOps
from ndindex.records import (DB_LOG, DB_META, KEY_MANIFEST, KEY_STATE, KIND_HUFFMAN, KIND_RAW,
                             MAX_TOMBSTONE_RUNS,
                             SPACE_DOCS, SPACE_FPS_BY_KEY, SPACE_KEYS_BY_FP, SPACE_LOOKUP,
                             SPACE_TOMBSTONES, U64_BE, LogRecord, Manifest, State, read_meta,
                             unframe)
from ndindex.records import DB_CHUNKS, decode_doc_key


#: Runs of at most this many chunks are listed once (a run directory) and
#: probed without the chunks tree; larger ones are looked up in the tree,
#: so that nothing on the open path reads in proportion to N.  A listed
#: run's probe is cheaper (no tree search, its blocks prefetched), which
#: matters most while a table has several runs.  2048 chunks list about
#: 130,000 blocks (2 MB) from 2048 pages, read once per run and kept while
#: the run lasts: a 10M index's main runs (about 830 chunks each) are
#: listed, 10% off its p50.  A merge output grows: its directory is
#: extended as it does (Snapshot._output_directory).
DIRECTORY_MAX_CHUNKS = 2048
#: The same limit for a probabilistic plan's table: a PSM query probes it
#: tens to hundreds of times, and a listed run saves each probe its tree
#: search and, after the first visit, its block checksum (a fifth of a probe
#: at 10M fingerprints).  2^14 chunks list about 10^6 blocks (16 MB) from
#: their headers alone, read once per run.
DIRECTORY_MAX_CHUNKS_PSM = 1 << 14
#: Listing reads one page per chunk, so until an index has answered
#: WARM_QUERIES queries only runs of at most DIRECTORY_COLD_CHUNKS are
#: listed: with 256, the first query on a cold 1M index read 354 pages
#: (37 ms) where the tree reads about 20 (3 ms); with 32, a streamed 10M
#: index (3 runs a table) read 125 pages (11 ms), with 8, 62 (6.6 ms;
#: tools/bench/bench_open.py).  A tree probe of a run reads about three
#: pages, a listing one a chunk: with 1 (a run of one chunk is read whole
#: either way), streamed and churned 10M and 30M files (4 runs a table)
#: read 48 and 65 pages where 8 read 65 and 77.
DIRECTORY_COLD_CHUNKS = 1
WARM_QUERIES = 256
#: Runs larger than DIRECTORY_MAX_CHUNKS, up to this many chunks (about a
#: million blocks, 17 MB of directory; a run of 100M fingerprints has about
#: 8,000 chunks a table), are listed once the index is warm by a background
#: thread (DirectoryCache.list_later), and found through the chunks tree
#: until their directory is ready.  Listed, a 30M index's query costs 6.8
#: us where the tree costs 9.6; listing its four main runs on the query
#: path stalled one query 42 ms with the file cached, 0.4 s cold.
DIRECTORY_MAX_CHUNKS_BACKGROUND = 1 << 14
#: A flush first counts from the newest count when at most this many log
#: operations came since it (one k = 0 probe each, about 1-2 us).
COUNT_BEFORE_FLUSH_OPS = 1 << 14


class Lineage(NamedTuple):
    """What a snapshot hands the next one, so that it need not read them anew:
    its state and manifest, and its log and per-table log (None if it never
    built them).  Holds no read transaction: an index that let go of its
    snapshot keeps this instead (Index._let_go_of_snapshot)."""
    state: State
    manifest: Manifest
    log: "LogOverlay | None"
    log_tables: list | None


def key_order(key):
    """The order of a fingerprint's keys as keys() gives them: bytes keys, then str."""
    return (isinstance(key, str), key)


class Snapshot:
    """One committed state of the index, as queries see it."""

    def __init__(self, store, plan, txn, view, prev: Lineage | None = None,
                 directories: dict | None = None, counts: "CountMemo | None" = None,
                 tombstones: "TombstoneMemo | None" = None):
        self._directories = directories if directories is not None else {}
        self._counts = counts if counts is not None else CountMemo()
        self._tombstone_memo = tombstones if tombstones is not None else TombstoneMemo()
        self.txn = txn
        self._pid = os.getpid()  # the process whose transaction it is (see close)
        self.view = view
        self.plan = plan
        self.txnid = view.txnid
        self.state = read_meta(view, KEY_STATE, State)
        if self.state.txnid != self.txnid:
            # Every commit rewrites the state with its own transaction id: a
            # mismatch means LMDB opened a meta page that no commit of ours
            # wrote as it stands ([F9]).
            raise CorruptionError(f"{store.path}: the state record was written by transaction "
                                  f"{self.state.txnid}, but the meta page names {self.txnid}: a "
                                  "meta page is damaged", database="lmdb")
        same_manifest = prev is not None and \
            prev.state.manifest_generation == self.state.manifest_generation
        self.manifest = prev.manifest if same_manifest else self._load_manifest()
        #: The tombstone runs, newest first (one in files before format 5):
        #: queries look candidates up in them (the kernel); their whole
        #: arrays are read only when asked for (compaction, checks).
        self.tombstone_runs = tuple(self.manifest.of(SPACE_TOMBSTONES))
        if len(self.tombstone_runs) > MAX_TOMBSTONE_RUNS:
            raise CorruptionError(f"manifest lists {len(self.tombstone_runs)} tombstone runs "
                                  f"(at most {MAX_TOMBSTONE_RUNS}, [M3])", database=DB_META,
                                  key=KEY_MANIFEST)
        self.table_runs = [self.manifest.of(t) for t in range(len(plan.tables))]
        # The log and the kernel are built on first use: compaction steps
        # take snapshots too and need neither.  Only the previous log is
        # kept, never the previous snapshot (its read transaction must end).
        self._prev = (prev.state, prev.log, prev.log_tables) \
            if prev is not None and prev.log is not None else None
        self._build_lock = threading.Lock()
        self._count = None
        #: Serialises lookups that share this snapshot's pages with threads.
        self.lock = threading.Lock()

    def lineage(self) -> Lineage:
        d = self.__dict__
        return Lineage(self.state, self.manifest, d.get("log"), d.get("log_tables"))

    @functools.cached_property
    def log(self) -> LogOverlay:
        with self._build_lock:
            if "log" not in self.__dict__:
                self._load_log(self._prev)
                self._prev = None
            return self.__dict__["log"]

    @functools.cached_property
    def log_tables(self) -> list:
        log = self.log  # extending an earlier snapshot's log builds both
        with self._build_lock:
            if "log_tables" not in self.__dict__:
                self.__dict__["log_tables"] = [
                    (np.sort(t.apply(log.adds)) if len(log.adds) else EMPTY_U64, EMPTY_U64, None)
                    for t in self.plan.tables]
            return self.__dict__["log_tables"]

    @functools.cached_property
    def _tombstone_arrays(self) -> tuple:
        """(fingerprints, stamps) of the tombstone runs together, sorted by
        fingerprint, each once with its newest stamp: read whole on first
        use, O(tombstones), each run once for all the snapshots that share
        its memo, then extended by each run a flush adds (TombstoneMemo.get);
        queries need them only where the writer holds them (the kernel
        otherwise looks candidates up in the runs)."""
        return self.tombstone_derived(
            "arrays",
            lambda: rn.union_tombstones([self.tombstone_run_arrays(r) for r in self.tombstone_runs]),
            lambda union, added: rn.add_tombstones(
                union, rn.union_tombstones([self.tombstone_run_arrays(r) for r in added])))

    def tombstone_run_arrays(self, run) -> tuple:
        """(fingerprints, stamps) of one of this snapshot's tombstone runs."""
        return self._tombstone_memo.arrays(run, lambda: rn.load_tombstones(self.view, run))

    def tombstone_table_parts(self, space: int) -> list:
        """Each tombstone run's fingerprints as table `space` holds them
        (permuted), sorted: one array a run, made once for the run's life."""
        table = self.plan.tables[space]
        return [self._tombstone_memo.arrays(
            run, lambda run=run: np.sort(table.apply(self.tombstone_run_arrays(run)[0])),
            ("table", space)) for run in self.tombstone_runs]

    def tombstone_derived(self, key, make, extend=None):
        """make(), a value computed from the tombstone runs, once per set of
        runs among the snapshots of one open index (they share a
        TombstoneMemo); extend: see TombstoneMemo.get."""
        if not self.tombstone_runs:
            return make()
        return self._tombstone_memo.get(self.tombstone_runs, key, make, extend,
                                        flushed=self.state.log_first_seq)

    @property
    def tombstones(self) -> np.ndarray:
        return self._tombstone_arrays[0]

    @property
    def tombstone_stamps(self) -> np.ndarray:
        """The tombstones' stamps (uint32), in the order of tombstones."""
        return self._tombstone_arrays[1]

    @functools.cached_property
    def hidden(self) -> np.ndarray:
        """Values never reported from a run: tombstones and the log's removals."""
        removes = self.log.removes
        return sorted_unique(np.concatenate([self.tombstones, removes])) if len(removes) \
            else self.tombstones

    @functools.cached_property
    def kernel(self):
        #: The background lister's count when this kernel was built (see Index._view).
        self.kernel_version = getattr(self._directories, "version", 0)
        return self._make_kernel(self.log_tables, self.log.removes)

    def _make_kernel(self, log_tables, log_removes):
        """The query kernel over this snapshot's runs and tombstones, with the
        given log (per table (log, recent, log_aid or None), and its removals).

        The search aid over a table's log is built once per log array and
        kept in log_tables, which the next snapshots extend: a commit then
        costs the kernel O(its records), not a pass over the log."""
        for i, (log, recent, aid) in enumerate(log_tables):
            if aid is None and len(log):
                log_tables[i] = (log, recent, _core.log_aid(log))
        if isinstance(self._directories, dircache.DirectoryCache) and self._directories.held:
            # Values held for runs merged away go (each up to 4 MB).
            self._directories.drop_stale({r.run_id for r in self.manifest.runs})
        view, plan = self.view, self.plan
        # Tombstones the index holds in memory already (compaction reads them
        # whole) are searched there, one search a candidate; else each run
        # is looked up through the chunks tree (a churned 10M index's six
        # runs made queries 1.32x slower: bench_tombstone_runs.py).
        held = self._tombstone_memo.peek(self.tombstone_runs, "arrays", self.state.log_first_seq) \
            if self.tombstone_runs else None
        return _core.make_snapshot(
            view.buf, view.psize, view.npages, tuple(view.trees[DB_CHUNKS]),
            [(d.prefix_bits, d.runs(), _inverse(d),
              [_kernel_run(r, self._held(r) or self._directory(r)) for r in runs if r.chunks],
              *log_tables[i])
             for i, (d, runs) in enumerate(zip(plan.tables, self.table_runs))],
            log_removes,
            [(r.run_id, r.last, r.chunks) for r in self.tombstone_runs] if held is None else [],
            None if held is None else held[0])

    def verify_listed(self) -> int:
        """Check the blocks of the runs this snapshot lists that no query has
        checked yet (run_directory_verify), so that queries find them verified;
        return how many.  Lists the runs as the kernel would (the kernel built
        next reuses the directories), and asks for the small ones to be held
        in memory (_held): after a compaction step (Index._compacted), so
        that they are ready before queries come."""
        n = 0
        for runs in self.table_runs:
            for run in runs:
                if run.chunks and self._held(run) is not None:
                    continue  # its values were checked as they were read
                cap = self._directory(run) if run.chunks else None
                if cap is not None:
                    n += _core.run_directory_verify(cap, run.kind, rn.live_start(run) or 0)
        return n

    def _held(self, run):
        """The run's values held in memory (a log_aid capsule) or None; asks
        the background lister for them if the index is warm and the run small
        (dircache.MEMORY_RUN_MAX_ENTRIES).  Values read for a later snapshot, from
        further into a merge input, do not serve this one; a merge output's
        serve snapshots whose cursor they reach (the compactor holds them as
        they grow: Compactor._hold)."""
        cache = self._directories
        if not isinstance(cache, dircache.DirectoryCache) or not cache.warm or \
                run.kind != KIND_RAW or run.entries > dircache.MEMORY_RUN_MAX_ENTRIES:
            return None
        hit = cache.held.get(run.run_id)
        if run.merge_output:
            return hit.aid if hit is not None and hit.upto is not None and run.cursor and \
                run.cursor <= hit.upto else None
        if hit is None:
            cache.hold_later(self, run)
            return None
        return hit.aid if hit.start <= (rn.live_start(run) or 0) and hit.upto is None else None

    def _directory(self, run):
        """The run's directory, or None (runs too large are found through the tree).

        Cached across snapshots while the run lasts: its chunks are never
        rewritten, and a merge input only loses chunks below its cursor.
        Not cached: runs with a chunk small enough to live inside a leaf page
        (it moves with the page).  Merge outputs grow: see _output_directory.
        """
        cache = self._directories
        warm = getattr(cache, "warm", True)
        if warm:
            limit = DIRECTORY_MAX_CHUNKS_PSM if self.plan.probabilistic else DIRECTORY_MAX_CHUNKS
        else:
            limit = DIRECTORY_COLD_CHUNKS
        if run.chunks > limit:
            if warm and isinstance(cache, dircache.DirectoryCache) and not run.merge_output and \
                    run.chunks <= DIRECTORY_MAX_CHUNKS_BACKGROUND:
                cap = cache.get(run.run_id)
                if cap is None:
                    cache.drop_stale({r.run_id for r in self.manifest.runs})
                    cache.list_later(self, run)
                return cap
            return None
        if run.merge_output:
            return self._output_directory(run)
        cap = cache.get(run.run_id)
        if cap is not None:
            return cap
        cap, _, inline, _ = self._finished_output(run) or \
            self._list_chunks(run, rn.live_start(run) or 0)
        if not inline:
            if isinstance(cache, dircache.DirectoryCache):
                cache.drop_stale({r.run_id for r in self.manifest.runs})
                with cache.lock:
                    cache[run.run_id] = cap
            else:
                cache[run.run_id] = cap
        return cap

    def _finished_output(self, run):
        """A finished merge's run listed as the extension of its output's
        directory (blocks checked meanwhile stay checked: see verify_listed),
        or None.  Only when the merge's last step wrote chunks past those
        listed: a last step that wrote none rewrote the last chunk, to mark
        it the run's last, and the copy lies elsewhere.  Not once the run is
        itself a merge input: its chunks below its cursor are gone (the
        entry outlives the merge until the run is first listed, which a
        run held in memory is not)."""
        outputs = getattr(self._directories, "outputs", None)
        hit = outputs.pop(run.run_id, None) if outputs else None
        if hit is None or hit[2] is None or run.last <= hit[2] or run.merge_input:
            return None
        return self._list_chunks(run, hit[2] + 1, hit[1])

    def _output_directory(self, run):
        """A merge output's directory.  The output grows by a merge step's
        chunks at a time and never changes below its cursor, so its directory
        is the one listed at an earlier cursor extended by the chunks written
        since, not the whole output listed again (a 10M index's main merge
        writes about 800 chunks a table, over hundreds of steps)."""
        outputs = getattr(self._directories, "outputs", None)
        hit = outputs.get(run.run_id) if outputs is not None else None
        if hit is not None and hit[0] == run.cursor:
            return hit[1]
        prev, start = (hit[1], hit[2] + 1) if hit is not None and hit[2] is not None else (None, 0)
        cap, _, inline, last = self._list_chunks(run, start, prev)
        if outputs is not None and not inline:
            # A finished merge's entry stays for _finished_output.
            live = {r.run_id for r in self.manifest.runs}
            for stale in [rid for rid in outputs if rid not in live]:
                del outputs[stale]
            outputs[run.run_id] = (run.cursor, cap, last)
        return cap

    def _list_chunks(self, run, start: int, prev=None):
        view = self.view
        return _core.run_directory(view.buf, view.psize, view.npages, tuple(view.trees[DB_CHUNKS]),
                                   run.space, run.run_id, run.kind, start, prev)

    def _load_manifest(self) -> Manifest:
        return read_meta(self.view, KEY_MANIFEST, Manifest)

    def _read_log(self, first: int, end: int) -> list:
        if first == end:
            return []
        rows = self.view.scan(DB_LOG, U64_BE.pack(first), limit=end - first)
        out = []
        for i, (key, value) in enumerate(rows):
            if key != U64_BE.pack(first + i):
                raise CorruptionError(f"log record {first + i} is missing", database=DB_LOG,
                                      key=key)
            out.append(LogRecord.unpack(unframe(value, DB_LOG, key), key))
        if len(out) != end - first:
            raise CorruptionError(f"log records {first + len(out)}..{end - 1} are missing",
                                  database=DB_LOG)
        return out

    def _load_log(self, prev) -> None:
        """Set self.log, extending prev's when only records were added (and then
        self.log_tables too, from prev's; otherwise the property builds them).

        log_tables: per table, (log, recent, log_aid), the log's additions
        permuted and sorted in two disjoint arrays, and the kernel's search
        aid over log (or None): the records added since the last fold go
        into recent, which is folded into log once it outgrows
        arrays.RECENT_FRACTION of it, so that a commit costs O(its records)
        here, not O(log), amortised.
        prev: (state, log, log_tables) of an earlier snapshot, or None.
        """
        st = self.state
        if prev is not None:
            prev_state, prev_log, prev_tables = prev
        extend = prev is not None and prev_state.log_first_seq == st.log_first_seq and \
            prev_state.log_next_seq <= st.log_next_seq
        d = self.__dict__
        if not extend:
            # log_tables is left to its property: a compaction step's
            # snapshot reads the log to flush it and never queries it.
            log = LogOverlay()
            log.apply_all(self._read_log(st.log_first_seq, st.log_next_seq))
            d["log"] = log
            return
        fresh = self._read_log(prev_state.log_next_seq, st.log_next_seq)
        if not fresh:
            d["log"] = prev_log
            if prev_tables is not None:
                d["log_tables"] = prev_tables
            return
        log = prev_log.copy()
        # The values the fresh records brought in, found among their own
        # additions (a commit's thousand), not by searching the whole log.
        new = log.apply_all(fresh)
        d["log"] = log
        if prev_tables is None:
            return  # log_tables, if asked for, from the whole log
        if new is None:
            # Removals too: the log's additions grew by the fresh records'
            # new ones only if none of them went.
            added = sorted_unique(np.concatenate([r.adds for r in fresh]))
            new = added[~prev_log.added(added)]
            if log.n_adds() != prev_log.n_adds() + len(new):
                return  # the log_tables property builds them from the whole log
        # Merged into the recent part of each table's log.
        d["log_tables"] = [_log_with(t, np.sort(p.apply(new))) if len(new) else t
                           for t, p in zip(prev_tables, self.plan.tables)]

    def close(self) -> None:
        txn, self.txn = self.txn, None
        # In a child of fork() the transaction is the parent's: aborting it
        # there cleared the parent's LMDB reader slot, and pages the
        # parent still read could be reused.  Dropped, py-lmdb frees nothing.
        if txn is not None and self._pid == os.getpid():
            try:
                txn.abort()
            except Exception:  # noqa: BLE001 - the environment may be closed already
                pass

    # -- queries ---------------------------------------------------------------

    def prefetch(self, q: int, k: int) -> None:
        """Ask the page cache for what query(q, k) will read, a tree level at a time."""
        _core.query_prefetch(self.kernel, q, k)

    def query_many(self, qs: np.ndarray, k: int, pending: PendingOps | None = None):
        if pending is not None:
            return _core.query_many(self.kernel, qs, k, *pending.query_view(self.plan))
        return _core.query_many(self.kernel, qs, k)

    def query_psm(self, q: int, k: int, probabilities: np.ndarray, max_probes: int,
                  pending: PendingOps | None = None) -> list:
        """PSM on table 0: its runs, log and pending operations at the prefixes of
        pi_0(q) XOR the first max_probes flip sets, in VOSH order of the 64
        probabilities (p_j of bit j); (value, distance) within k of q."""
        if pending is not None:
            return _core.query_psm(self.kernel, 0, q, probabilities, k, max_probes,
                                   *pending.query_view(self.plan))
        return _core.query_psm(self.kernel, 0, q, probabilities, k, max_probes)

    def query_psm_many(self, qs: np.ndarray, k: int, probabilities: np.ndarray,
                       max_probes: int, pending: PendingOps | None = None):
        """query_psm for each query (probabilities: (n, 64)), as query_many returns."""
        if pending is not None:
            return _core.query_psm_many(self.kernel, 0, qs, probabilities, k, max_probes,
                                        *pending.query_view(self.plan))
        return _core.query_psm_many(self.kernel, 0, qs, probabilities, k, max_probes)

    def __del__(self):
        self.close()

    # -- keys ------------------------------------------------------------------

    def record_group(self, space: int, group: bytes,
                     pending: PendingOps | None = None) -> dict:
        """The live records of one group of a record space: {key: value}.

        group is what the lookup names (``overlay.record_group``): a
        fingerprint (8 bytes BE) or lookup key for the fingerprint-keyed
        spaces, a typed document key for fingerprints-by-key.  The newest
        operation on a record decides it: pending, then the log, then the
        runs newest first.
        """
        return self.record_groups(space, [group], pending)[0]

    def may_hold_records(self, space: int, pending: PendingOps | None = None) -> bool:
        """False when neither the space's runs, the log nor pending hold a record: an
        index without keys then skips every key lookup (export, remove)."""
        return any(r.chunks for r in self.manifest.of(space)) or bool(len(self.log.ops)) or \
            (pending is not None and bool(len(pending.ops)))

    def record_groups(self, space: int, groups: list, pending: PendingOps | None = None) -> list:
        """record_group() of many groups at once: [{key: value}] in the order given.

        Runs are probed with all groups in one C call each (seeks, chunk
        checks and filters), so groups the filters rule out cost a few
        microseconds.
        """
        decided = [{} for _ in groups]
        if not self.may_hold_records(space, pending):
            return decided
        runs = [r for r in self.manifest.of(space) if r.chunks]
        if space == SPACE_LOOKUP:
            for i, group in enumerate(groups):
                lk = U64_BE.unpack(group)[0]
                hits = self.log.ops.lookup_hits(lk)
                if pending is not None:
                    hits.update(pending.ops.lookup_hits(lk))
                for fp in hits:
                    decided[i][group + U64_BE.pack(fp)] = (ch.RECORD_PUT, b"")
        else:
            for i, group in enumerate(groups):
                if pending is not None:
                    decided[i].update(pending.ops.group(space, group))
                for key, op in self.log.ops.group(space, group).items():
                    decided[i].setdefault(key, op)
        exact = space == SPACE_FPS_BY_KEY
        with self.lock:
            for run in runs:  # newest first
                for i, found in rn.record_lookup_many(self.view, run, groups).items():
                    for key, flag, value in found:
                        if not exact or len(key) == len(groups[i]) + 8:
                            decided[i].setdefault(key, (flag, value))
        return [{key: value for key, (flag, value) in d.items() if flag == ch.RECORD_PUT}
                for d in decided]

    def raw_keys_many(self, fps, pending: PendingOps | None = None) -> list[set]:
        """The typed document keys of each fingerprint (one batched lookup)."""
        groups = [U64_BE.pack(fp) for fp in fps]
        return [{key[8:] for key in found}
                for found in self.record_groups(SPACE_KEYS_BY_FP, groups, pending)]

    def keys_of(self, fps, pending: PendingOps | None = None) -> list[tuple]:
        """The document keys of each fingerprint, as sorted tuples."""
        if not self.may_hold_records(SPACE_KEYS_BY_FP, pending):
            return [()] * len(fps)
        out = []
        groups = [U64_BE.pack(fp) for fp in fps]
        for found in self.record_groups(SPACE_KEYS_BY_FP, groups, pending):
            keys = [decode_doc_key(key[8:]) for key in found]
            out.append(tuple(sorted(keys, key=key_order)))
        return out

    def fps_of_key(self, raw: bytes, pending: PendingOps | None = None) -> list[int]:
        """The fingerprints a typed document key is stored with."""
        return self.fps_of_keys([raw], pending)[0]

    def fps_of_keys(self, raws: list, pending: PendingOps | None = None) -> list[list[int]]:
        """fps_of_key() of each typed key (one batched lookup)."""
        return [sorted(U64_BE.unpack_from(key, len(raw))[0] for key in found)
                for raw, found in zip(raws, self.record_groups(SPACE_FPS_BY_KEY, raws,
                                                               pending))]

    def space_records(self, space: int, pending: PendingOps | None = None):
        """Yield (key, value) of every live record of a record space, in key order.

        A k-way merge of the runs (newest first) under the log and pending
        operations: the newest operation on a key decides it.  Reads the
        runs a few chunks at a time.
        """
        ops = self.log.ops.flattened()
        if pending is not None:
            ops.update(pending.ops)
        if space == SPACE_LOOKUP:
            from ndindex.docstore import lookup_records
            derived = lookup_records([(k, f, v) for _, k, f, v in ops.items(SPACE_DOCS)],
                                     [(k, f, v) for _, k, f, v in ops.items(SPACE_LOOKUP)])
            over = {key: (flag, value) for key, flag, value in _core.records_unpack(derived)}
        else:
            over = {key: (flag, value) for _, key, flag, value in ops.items(space)}
        sources = [iter([(key, flag, value) for key, (flag, value) in sorted(over.items())])]
        sources += [self._run_records(run) for run in self.manifest.of(space) if run.chunks]
        merged = heapq.merge(*[_ranked(src, rank) for rank, src in enumerate(sources)])
        last = None
        for key, _, flag, value in merged:
            if key != last:
                last = key
                if flag == ch.RECORD_PUT:
                    yield key, value

    def _run_records(self, run):
        above = None
        while True:
            with self.lock:
                recs, end, exhausted = rn.all_records(self.view, run, above, 16)
            yield from recs
            if exhausted or end is None:
                return
            above = end

    # -- counting and iterating ----------------------------------------------

    def table_values(self, table: int = 0, chunk_target: int = 1 << 20, lo: int = 0,
                     hi: int = (1 << 64) - 1):
        """Yield the live permuted values of one table in [lo, hi], sorted, in order,
        in pieces.

        The runs are read side by side (runs.union_slices), about
        chunk_target values a run at a time, each from its first chunk that
        reaches lo.  Tombstones and the log's removals are dropped; the log's
        additions are merged in.
        """
        runs = [r for r in self.table_runs[table] if r.chunks]
        design = self.plan.tables[table]
        hidden = np.sort(design.apply(self.hidden)) if len(self.hidden) else EMPTY_U64
        log = insert_sorted(*self.log_tables[table][:2])
        log = log[np.searchsorted(log, np.uint64(lo)):np.searchsorted(log, np.uint64(hi), "right")]
        per_chunk = max(1, chunk_target // (63 * 150))
        readers = [rn.RunReader(self.view, r, per_chunk, above=lo - 1 if lo else None)
                   for r in runs]
        below = -1  # the log's values up to it went out with an earlier piece
        for merged, upto in rn.union_slices(readers, hidden) if readers else [(EMPTY_U64, None)]:
            top = hi if upto is None or upto >= hi else upto
            if top == hi:  # the last piece: the runs' values past hi stay unread or untaken
                merged = merged[:np.searchsorted(merged, np.uint64(hi), "right")]
            a = np.searchsorted(log, np.uint64(below), side="right") if below >= 0 else 0
            b = np.searchsorted(log, np.uint64(top), side="right")
            if b > a:
                merged = merge_unique([merged, log[a:b]])
            if len(merged):
                yield merged
            if top == hi:
                return
            below = top

    def count(self) -> int:
        """Number of distinct live fingerprints (cached per snapshot).

        From the newest count of this index's snapshots (self._counts): the
        same when no content changed since, O(the log records since) when no
        flush came between (_count_since).  Else, for a compacted index, from
        its one run's entry count, O(the log) (_count_of_one_run).  Otherwise
        a pass over table 0's values, O(N).
        """
        if self._count is None:
            count = self._count_since(self._counts.newest)
            if count is None:
                count = self._count_of_one_run()
            self._count = sum(len(v) for v in self.table_values(0)) if count is None else count
        self._counts.offer(self.state, self._count, self._log_arrays)
        return self._count

    def _log_arrays(self) -> tuple:
        st = self.state
        if st.log_first_seq == st.log_next_seq:  # after a flush, as a rule: nothing to read
            return EMPTY_U64, EMPTY_U64
        return self.log.adds, self.log.removes

    def count_before_flush(self) -> None:
        """Count now if the newest count makes that cheap (at most
        COUNT_BEFORE_FLUSH_OPS log operations since it): once this log is
        flushed, the next count could not start from that one, and would
        read table 0 whole.  Beyond the bound, len() was not asked for a
        while, and the flush does not pay for it."""
        newest = self._counts.newest
        st = self.state
        if self._count is None and newest is not None and \
                newest[0].log_first_seq == st.log_first_seq and \
                st.log_ops - newest[0].log_ops <= COUNT_BEFORE_FLUSH_OPS:
            self.count()

    def _count_since(self, memo) -> int | None:
        """The count from a memo (state, count, log adds, log removes) of an
        earlier snapshot, or None when a flush came between.

        Every change of content appends to the log, and compaction changes
        none, so with the log's end where it was the count is the same.
        Between two flushes the log only grows, and the runs less their
        tombstones keep the same values (merges move them, never change
        them).  A value is live when its last log operation is an add, or,
        with none, when the runs hold it.  So only values the records since
        the memo touch can have changed, and each one's state then and now
        follows from the two logs and one look in the runs.
        """
        if memo is None:
            return None
        then, count, adds_then, removes_then = memo
        st = self.state
        if then.log_next_seq == st.log_next_seq:
            return count
        if then.log_first_seq != st.log_first_seq or then.log_next_seq > st.log_next_seq:
            return None
        fresh = self._read_log(then.log_next_seq, st.log_next_seq)
        touched = sorted_unique(np.concatenate([a for r in fresh for a in (r.adds, r.removes)]))
        if not len(touched):
            return count  # records of document keys only
        in_runs = self._in_runs(touched)

        def live(adds, removes):
            return np.where(isin_sorted(touched, adds), True,
                            np.where(isin_sorted(touched, removes), False, in_runs))
        log = self.log
        return count + int(live(log.adds, log.removes).sum()) - \
            int(live(adds_then, removes_then).sum())

    def _count_of_one_run(self) -> int | None:
        """The count of a compacted index, or None: when table 0 is one run
        and no tombstone hides any of it, its entries, plus the log's adds it
        lacks, less the log's removes it holds (O(the log))."""
        runs = [r for r in self.table_runs[0] if r.chunks]
        if len(runs) != 1 or runs[0].merge_input or runs[0].merge_output or \
                any(r.entries for r in self.tombstone_runs):
            return None
        adds, removes = self._log_arrays()
        in_runs = self._in_runs(np.concatenate([adds, removes]))
        return runs[0].entries + int((~in_runs[:len(adds)]).sum()) - \
            int(in_runs[len(adds):].sum())

    def _in_runs(self, values: np.ndarray) -> np.ndarray:
        """Which values the runs hold, less their tombstones (the log aside):
        one k = 0 look each, through a kernel without the log."""
        found = np.zeros(len(values), dtype=bool)
        if len(values):
            runs_only = self._make_kernel([(EMPTY_U64, EMPTY_U64, None)] * len(self.plan.tables),
                                          EMPTY_U64)
            found[np.frombuffer(_core.query_many(runs_only, values, 0)[0], dtype=np.int64)] = True
        return found


class TombstoneMemo:
    """The tombstone runs' arrays, and what merges derive from them, kept for
    the snapshots of one open index while the runs are the same.  A busy
    writer's snapshots come and go many times a second, and compaction
    takes one per step: each read the run anew when the chain of snapshots
    that passed it on broke, and each merge step permuted and sorted it for
    its table (a churned 30M file's 870,000 tombstones: 60 ms a read, nine
    reads in 100,000 check_and_add calls in transactions of 1,000).  Each
    run's own arrays (and each table's sorted tombstones of it) are kept
    while it is among the newest runs asked about: a flush adds a small
    run, and only that one is read then.  The union of the runs is
    extended by a flush's new run rather than made again (get's extend).
    In a churned 10M file, making the union of 1-3M tombstones and each
    table's sorted tombstones anew after every flush took 11 s of the
    compactor's CPU in 18 s of churn, and it fell behind the removals."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runs = None
        self._values: dict = {}
        self._arrays: dict = {}
        #: key -> (runs, value) computed for earlier runs, for extend.
        self._prior: dict = {}
        #: The values stand for runs they were not computed from (carry),
        #: while the log flushed is the one before this sequence number.
        self._carried = False
        self._carried_upto = 0

    def get(self, runs: tuple, key, make, extend=None, *, flushed: int):
        """make() for key of runs (a tuple of Run; equal runs are the same
        run), computed once while runs are the newest asked about.

        extend(value, added), if given, derives the value from the one
        computed for earlier runs that are all among runs, and the runs
        added since (a tuple): so a flush's new run costs its own size.
        flushed: the asking snapshot's log_first_seq (see carry)."""
        with self._lock:
            self._drop_carried_if_flushed(flushed)
            if self._runs != runs:
                if self._carried:
                    # A superset, fine to hide with while the runs last, but
                    # not to extend: a tombstone it keeps that no run does
                    # would hide the fingerprint when it is added back.
                    self._prior.clear()
                elif self._runs is not None:
                    self._prior.update((k, (self._runs, v)) for k, v in self._values.items())
                self._runs, self._values, self._carried = runs, {}, False
                ids = {_run_key(r) for r in runs}
                self._arrays = {r: a for r, a in self._arrays.items() if r[0] in ids}
            elif key in self._values:
                return self._values[key]
            prior = self._prior.get(key) if extend is not None else None
        # Outside the lock: merge steps of other tables derive theirs meanwhile.
        value = None
        if prior is not None:
            old = {_run_key(r) for r in prior[0]}
            added = tuple(r for r in runs if _run_key(r) not in old)
            if len(old) + len(added) == len(runs):  # every earlier run is still there
                value = extend(prior[1], added)
        if value is None:
            value = make()
        with self._lock:
            if self._runs == runs:
                self._values[key] = value
                self._prior.pop(key, None)
        return value

    def carry(self, old: tuple, new: tuple, arrays: dict, flushed: int) -> None:
        """Let what was computed for the runs old stand for the runs new, which
        hold the same tombstones or fewer (a merge of tombstone runs, less
        the outdated ones: a tombstone, outdated or not, hides a fingerprint
        no run holds any more, so a superset hides the same); arrays: (Run,
        (fingerprints, stamps)) of the new runs; flushed: the merge's
        log_first_seq.  Without this, each such merge had the writer's
        compaction make the union again.

        A superset hides only what no run holds, until a flush puts a
        fingerprint it keeps back into a run: a flush that adds it back and
        removes nothing leaves the tombstone runs as they were (no run holds
        its tombstone, [Q1]), so the superset went on hiding it in the
        flush's new run: queries missed it, and a remove() of it, which
        removes only what it finds, was lost (tools/soak_oracle.py; with
        another process's compactor doing that flush, --writers 2).  So the
        carried values last only until the log is flushed, by any process:
        a snapshot with a later log_first_seq drops them."""
        with self._lock:
            if self._runs == old:
                self._runs, self._carried, self._carried_upto = new, True, flushed
            self._arrays.update(((_run_key(r), None), a) for r, a in arrays)

    def _drop_carried_if_flushed(self, flushed: int) -> None:
        """Drop carried values once a flush has passed them (see carry); the lock held."""
        if self._carried and flushed != self._carried_upto:
            self._values, self._prior, self._carried = {}, {}, False

    def peek(self, runs: tuple, key, flushed: int):
        """The value for key of runs if it was computed already, else None.
        flushed: the asking snapshot's log_first_seq (see carry)."""
        with self._lock:
            self._drop_carried_if_flushed(flushed)
            return self._values.get(key) if self._runs == runs else None

    def arrays(self, run, load, part=None):
        """load(), the (fingerprints, stamps) of one tombstone run (part None)
        or what else part names of it, made once while the run is among the
        newest asked about."""
        key = _run_key(run), part
        with self._lock:
            if key in self._arrays:
                return self._arrays[key]
        value = load()
        with self._lock:
            if self._runs is None or run in self._runs:
                self._arrays[key] = value
        return value


def _run_key(run) -> tuple:
    """What names a tombstone run's contents: a run is written once, under its id."""
    return run.run_id, run.entries, run.last


class CountMemo:
    """The newest count the snapshots of one open index made, for later ones
    to start from (Snapshot.count): (state, count, log adds, log removes)."""

    __slots__ = ("newest",)

    def __init__(self):
        self.newest = None

    def offer(self, state, count: int, log_arrays) -> None:
        """Keep this count, with log_arrays() (the log's adds and removes), if
        it is the newest: the log's end, then its start, only grow (a
        vacuumed copy keeps both)."""
        newest = self.newest
        if newest is None or (state.log_next_seq, state.log_first_seq) > \
                (newest[0].log_next_seq, newest[0].log_first_seq):
            self.newest = (state, count, *log_arrays())


def _log_with(table_log: tuple, new: np.ndarray) -> tuple:
    """A table's (log, recent, log_aid) with sorted new values (in neither) added."""
    log, recent, aid = table_log
    folded, recent = add_recent(log, recent, new)
    return folded, recent, aid if folded is log else None


def _ranked(records, rank: int):
    """(key, rank, flag, value) of each record: equal keys merge newest (lowest rank) first."""
    for key, flag, value in records:
        yield key, rank, flag, value


def _inverse(design) -> tuple:
    return tuple((dst, src, n) for src, dst, n in design.runs())


def _kernel_run(run, directory=None) -> tuple:
    """The query kernel's view of a run: space, kind, id, code, last, live range, directory."""
    lo = hi = None
    if run.merge_input and run.cursor:
        lo = int.from_bytes(run.cursor, "big")
    if run.merge_output:
        hi = int.from_bytes(run.cursor, "big") if run.cursor else None
    code = rn.code_of(run.code).compiled if run.kind == KIND_HUFFMAN else None
    return (run.space, run.kind, run.run_id, code, run.last, lo, hi, directory)
