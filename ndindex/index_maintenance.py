"""The upkeep methods of Index: compact, vacuum, vacuum_into, stats, verify.

A mixin of :class:`ndindex.index.Index`, kept apart so that each reads in
one sitting.  compact() runs the compactor's steps (:mod:`ndindex.compaction`)
now rather than in the background; vacuum() and vacuum_into() give free
pages back to the disk by copying the live ones (LMDB never shrinks a
file); stats() and verify() (:mod:`ndindex.checker`) look at the file.  The
methods use Index's writer, compactor, store and snapshots.
"""

from __future__ import annotations

import fcntl
import functools
import os
import time

from ndindex import _core, codec, locks, pages, records as rec, store as st, validate
from ndindex.errors import interrupts_deferred


class MaintenanceMethods:
    """compact, vacuum, vacuum_into, stats, verify."""

    def compact(self, full: bool = False, progress=None) -> dict:
        """Flush the log into the runs and do every merge that is due, now.

        full=True merges each table (and each key space) into one run and
        drops every tombstone; then, if no other process has the file open,
        gives the free space back to the disk (:meth:`vacuum`).  Returns a
        summary: steps done, seconds, runs per table, file bytes.
        Compaction also runs by itself in the background unless the index
        was opened with background_compaction=False.  progress(phase, done,
        total), if given, is called after each step: done counts the chunks
        merged so far against the chunks the file holds (an estimate: a
        merge that is not due leaves its chunks, a chunk may merge twice).
        """
        validate.progress(progress)
        self._check_writable()
        t0 = time.perf_counter()
        if self._writer.durability == "normal":
            self._writer.checkpoint()
        comp = self._compactor
        total = max(1, sum(r.chunks for r in self._snapshot().manifest.runs))
        start = comp.chunks_merged

        def step():
            if progress is not None:
                progress("compact", min(comp.chunks_merged - start, total - 1), total)
        steps = comp.run(force_flush=True, full=False, wait=True, on_step=step)
        if full:
            steps += comp.run(force_flush=True, full=True, wait=True, on_step=step)
        if progress is not None:
            progress("compact", total, total)
        vacuumed = False
        if full:
            vacuumed = self._vacuum_if_alone()
        snap = self._snapshot()
        return dict(steps=steps, seconds=time.perf_counter() - t0, vacuumed=vacuumed,
                    runs=[len(r) for r in snap.table_runs], file_bytes=self._store.file_bytes())

    def _vacuum_if_alone(self) -> bool:
        try:
            self.vacuum()
            return True
        except locks.NotAlone:  # raised before any work
            return False

    def _alone(self, advice: str):
        """A with block holding the open lock exclusively: no other process
        has the file open, and one that opens it meanwhile waits (see
        locks.open_locked).  Raises ReadOnlyError, ending in advice, otherwise.

        Its beginning and end are C (_core.Block), Ctrl-C held back from
        their first instruction: as a contextlib generator, a Ctrl-C just
        after the lock call left the file held exclusively (every other
        process's open waited until this one closed it), and one as
        contextlib's __exit__ began did the same while the traceback lived."""
        return _core.Block(None, functools.partial(self._hold_alone, advice), self._share_again)

    def _hold_alone(self, advice: str) -> None:
        if not locks.byte_lock(self._lock_file.fd, locks.OPEN_BYTE, fcntl.F_WRLCK):
            raise locks.NotAlone(f"{self.path}: another process has the index open; "
                                 f"close it first, {advice}")

    def _share_again(self, *exc) -> bool:
        # On the descriptor of the day: vacuum replaces it with the new
        # file's.  Without the exclusive lock, the shared lock is the one
        # held already.
        locks.byte_lock(self._lock_file.fd, locks.OPEN_BYTE, fcntl.F_RDLCK)
        return False

    def vacuum(self) -> int:
        """Rewrite the file with only its live pages, giving free space back to the disk.

        LMDB never shrinks a file: compaction reuses freed pages, but a file
        that once held more keeps its size.  This writes a compact copy
        beside the file and renames it over the original, so no other
        process may have the index open: raises ReadOnlyError naming that
        otherwise (use :meth:`vacuum_into` then); one that opens it
        meanwhile waits for the new file.  Returns the new size (the file
        is left as it was when the copy would be no smaller).
        """
        self._check_writable()
        self._store.check_in_place()  # else it would put a copy where the file was
        with self._alone("or use vacuum_into() and replace the file yourself"), \
                self._writer.lock, self._compactor._lock:
            self._writer.checkpoint()
            # One fixed name, held (flock) while the copy is built: an
            # open that finds it free deletes a killed vacuum's copy.
            path = self.path
            tmp = st.build_path(path, "vacuum")
            build = st.claim_build(tmp, path)
            try:
                os.ftruncate(build.fd, 0)  # a killed vacuum's copy, if any
                self._copy_compacted(tmp, build.fd)
                size = os.path.getsize(tmp)
                if size >= os.path.getsize(path):
                    # Nothing to give back: the copy's two stamping commits
                    # ([F9]) outweigh the free pages of a small file (a new
                    # 28 KB index came back as 40 KB).  The file stays.
                    return os.path.getsize(path)
                self._directories.reopen()  # they point into the old file
                with self._snap_lock:
                    snap, self._snap, self._lineage = self._snap, None, None
                if snap is not None:
                    snap.close()
                # Ctrl-C held back from the close to the reopen: landing
                # between the close and the try below, it left this Index
                # closed (the interrupt sweep met it, 1 run of 30).
                with interrupts_deferred():
                    try:
                        self._store.close()
                        os.replace(tmp, path)
                    finally:
                        # The copy, or the file as it was if an exception
                        # came first: this index goes on either way.
                        self._reopen_store_whatever_comes(path)
            finally:
                st.release_build(build, tmp)  # deletes the copy unless renamed
        return size

    def _reopen_store_whatever_comes(self, path: str) -> None:
        """_reopen_store, again if Ctrl-C interrupts it, then the interrupt: a
        late Ctrl-C costs less than an Index left closed (a scratch sweep of
        interrupts met its fsync and its open in 2 runs of 20)."""
        interrupted = None
        while True:
            try:
                self._reopen_store(path)
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted

    def _reopen_store(self, path: str) -> None:
        """Open the file now at path in place of the one vacuum closed, and hold its
        open lock exclusively, as _alone() expects to find it.  Without a
        rename the file is the one whose lock this process holds already
        (and closing any descriptor of a file lets go of every lock the
        process holds on it).  The descriptors change in one assignment:
        an interrupt (Ctrl-C) never leaves _lock_file closed."""
        st.fsync_path(os.path.dirname(os.path.abspath(path)))
        fresh = st.Store.open(path, durability=self._store.durability)
        self._store.__dict__.update(fresh.__dict__)
        self._meta = pages.meta_words(self._store.filemap.buffer(2 * self._psize))
        if os.path.samestat(os.fstat(self._lock_file.fd), os.stat(path)):
            return
        lock_file = locks.open_locked(path, readonly=False)
        locks.byte_lock(lock_file.fd, locks.OPEN_BYTE, fcntl.F_WRLCK)
        old, self._lock_file = self._lock_file, lock_file
        old.close()

    def vacuum_into(self, dest) -> int:
        """Write a compacted copy of the index to a new file; return its size in bytes.

        Only live pages are copied, like SQLite's VACUUM INTO; the copy is a
        complete index (it appears atomically).  Replace the original with it
        while no process has the index open.  It holds what this Index shows,
        as export does: a normal-durability writer's journaled operations are
        checkpointed first (inside a transaction, the copy holds what was
        committed before it).  Raises FileExistsError if dest exists.
        """
        dest = os.fsdecode(dest)
        if os.path.lexists(dest):
            raise FileExistsError(f"{dest}: already exists")
        if self._writer is not None:
            self._writer.checkpoint()  # nothing to do unless durability is "normal"
        with st.written_aside(dest, "copying") as tmp:
            self._copy_compacted(tmp)
        return os.path.getsize(dest)

    def _copy_compacted(self, tmp: str, fd: int | None = None) -> None:
        """Write the live pages to tmp (a new name, or fd open on it, empty) as a
        complete, synced index.

        LMDB's copy walks every tree of the newest commit trusting each page
        it reads: a damaged branch, leaf or overflow page number took it
        outside the map (SIGSEGV, SIGBUS).  So the trees are checked first,
        as verify() checks them (checker.check_lmdb: page headers and nodes,
        not the overflow pages' contents), raising CorruptionError."""
        from ndindex import checker
        st.check_commit_records(self._store)
        checker.check_lmdb(self._snapshot().view, self._store.filemap)
        self._store.copy_to(tmp, fd)
        st.restamp_commits(tmp)

    def stats(self) -> dict:
        """Return counts, sizes and bits per fingerprint per table, runs, log size and the plan.

        Also the open reads on the file, from every process (``readers``:
        pid and the transaction each reads), and ``oldest_reader_lag``, how
        many commits the oldest of them is behind the newest: pages freed
        since it began are not reused until it ends; and ``held_runs``,
        ``held_bytes``: the small runs this index holds in memory (a warm
        index's newest, at most dircache.MEMORY_RUN_MAX_ENTRIES values each).
        ``free_bytes``: the file's pages on LMDB's free list, which later
        commits reuse and :meth:`vacuum` gives back to the disk.
        ``compaction_error``: why the background compaction's last step
        failed ("CapacityError: ..."), None while it works; it retries, less
        often the longer it fails, and a :meth:`compact` call raises what
        its own steps meet.
        """
        snap = self._snapshot()
        n = snap.count()
        per_table = []
        for i, (design, runs) in enumerate(zip(self.plan.tables, snap.table_runs)):
            value_bytes = sum(r.value_bytes for r in runs)
            per_table.append(dict(
                table=i, prefix_bits=design.prefix_bits, entries=n, runs=len(runs),
                run_entries=[r.entries for r in runs], bytes=value_bytes,
                bits_per_fingerprint=(value_bytes * 8 / n) if n else 0.0,
                coding=codec.CODING_NAMES[self.coding]))
        key_runs = [r for r in snap.manifest.runs if r.space in rec.RECORD_SPACES]
        file_bytes = self._store.file_bytes()
        # LMDB reuses no page freed after the oldest open read began: a long
        # read (a parked reader, a long items() loop) lets the file grow.
        readers = self._store.readers()
        newest = self._latest_txnid()
        held = self._directories.held_sizes()
        error = self._compactor.error if self._compactor else None
        return dict(
            path=self.path, k=self.k, format=self._header.read_version,
            coding=codec.CODING_NAMES[self.coding], fingerprints=n, log_entries=snap.state.log_ops,
            log_records=snap.state.log_records,
            removed_pending=sum(r.entries for r in snap.tombstone_runs),
            tables=per_table,
            key_bytes=sum(r.value_bytes for r in key_runs), key_runs=len(key_runs),
            file_bytes=file_bytes, free_bytes=self._free_bytes(snap, file_bytes),
            file_bits_per_fingerprint_per_table=(file_bytes * 8 / n / len(per_table)) if n else 0.0,
            entropy_bound_bits=codec.entropy_bound_bits(n) if n else 0.0,
            compaction_steps=self._compactor.steps if self._compactor else 0,
            compaction_error=None if error is None else f"{type(error).__name__}: {error}",
            readers=[dict(pid=pid, txnid=txnid) for pid, txnid in readers],
            held_runs=len(held), held_bytes=sum(nbytes for _, nbytes in held),
            oldest_reader_lag=max(0, newest - min((t for _, t in readers), default=newest)),
            plan=self.plan.describe(), probabilistic=self.plan.probabilistic)

    def _free_bytes(self, snap, file_bytes: int) -> int:
        """Bytes of the file that snap's free list holds (LMDB may list pages
        past the end of a file it has not grown yet: those take no space)."""
        file_pages = file_bytes // self._psize
        return self._psize * sum(
            1 for _, value in snap.view.scan("free") for page in st._core_idl(value)
            if page < file_pages)

    def verify(self, progress=None) -> dict:
        """Check every LMDB page, checksum, ordering and run; raise on the first problem.

        Raises CorruptionError naming the first problem; returns a summary
        otherwise.  Cost: a full read of the file; memory beyond the mapped
        file stays at a few MB a run, whatever N.  progress(phase, done,
        total), if given, is called as the tables are read.
        """
        from ndindex import checker
        return checker.verify(self, validate.progress(progress))
