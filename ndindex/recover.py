"""Salvage a damaged index file into a new one (``ndindex recover``), like SQLite's ``.recover``.

verify() stops at the first damaged byte; recover() keeps going.  It reads
the damaged file without trusting LMDB's trees, since the damage may be in
them: every page of the file is looked at on its own.  A page that names
itself as a leaf is parsed node by node (every offset and size checked
against the page and the file); a value kept in overflow pages is read
only after its page number and length are checked against the file; an
overflow run that no readable leaf points to (its leaf was damaged) is
read too, its key rebuilt from the value itself (FORMAT.md 7.7-7.9 put
the run id and the last entry in every chunk's header).  A value is used
only if its checksum verifies, and the checksum covers its key ([F2]), so
nothing is ever taken from the wrong place.  That scan is
:mod:`ndindex.recover_scan`; this module chooses among what it found and
rebuilds the index.

What to rebuild, in order of trust:

1. The snapshot LMDB would open, read through the bounds-checked page
   reader (:mod:`ndindex.pages`) as far as its trees are intact: it gives
   the header, plan, state and manifest of the newest commit.
2. Otherwise the newest *consistent* state among all verifying copies (the
   file keeps older copies of the meta records in its free pages): a state
   record of a transaction no newer than the meta pages name, with the
   manifest of its generation.
3. With a manifest, only the runs it lists count (free pages hold stale
   chunks of runs merged away, which must not bring removed fingerprints
   back), each within its live range (7.5 [M2]); the tombstones hide
   removed fingerprints; the log applies on top ([Q1]).  Every table holds
   every fingerprint, so the first table read whole is enough; otherwise
   the union of what every table still holds.  Document keys come from
   either key space the same way; documents from their 0xF3 records
   (lookup-key records are never read: the rebuild derives them again).
4. Without a manifest, every verifying chunk counts (newest run id first)
   and the report says removed fingerprints may come back.

The result is written through the public API (documents through the
writer, as add_documents writes them) as a new index with the same
k, plan, coding and fingerprinter, compacted and verified, and moved into
place atomically.  The report says what was recovered, what could not be
read, and whether the recovery is provably complete (``complete``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os

import numpy as np

from ndindex import chunks as ch, codec, journal as jr, pages, plan as plans
from ndindex import records as rec, validate
from ndindex.arrays import EMPTY_U64, isin_sorted, sorted_unique
from ndindex.errors import CorruptionError, FormatError
from ndindex.overlay import LogOverlay
from ndindex.store import check_path_for_open
from ndindex.recover_scan import (FileImage, Found, scan_leaves, scan_overflow,
                                  tombstone_chunk, unframe_value)

#: Fingerprints (and key pairs) per add() call of the rebuild.
REBUILD_BATCH = 100_000
#: Documents per log record of the rebuild (each record value is up to ~2 KB).
REBUILD_DOCUMENTS = 10_000
U64 = (1 << 64) - 1


# -- the snapshot LMDB would open, as far as it reads -----------------------------------


class Trusted:
    """Lookups through the newest meta page's trees, each failing quietly on damage."""

    def __init__(self, image: FileImage):
        self.view = None
        # With a meta page damaged, the other one may be the older commit:
        # no snapshot is trusted then (the copies decide, choose_records).
        metas = [m for m in image.metas if m is not None]
        if len(metas) < 2 or not image.npages:
            return
        meta = max(metas, key=lambda m: m["txnid"])
        npages = min(image.npages, meta["last_pg"] + 1)
        main = pages.Tree.from_record(meta["main"])
        trees = {}
        for name in rec.ALL_DBS:  # one damaged tree record costs only its own tree
            try:
                trees.update(pages.named_trees(image.buf, image.psize, npages, main, [name]))
            except (CorruptionError, ValueError):
                trees[name] = pages.Tree(None, 0, 0)
        self.view = pages.PageView(image.buf, image.psize, npages, meta["txnid"], trees)

    def meta(self, key: bytes):
        """The verified payload of a meta record, or None."""
        if self.view is None:
            return None
        try:
            raw = self.view.get(rec.DB_META, key)
            return None if raw is None else rec.unframe(raw, rec.DB_META, key)
        except (CorruptionError, ValueError):
            return None

    def value(self, db: str, key: bytes):
        """The raw value under key in db (a copy), or None."""
        if self.view is None:
            return None
        try:
            raw = self.view.get(db, key)
            return None if raw is None else bytes(raw)
        except (CorruptionError, ValueError):
            return None


# -- choosing what to rebuild ----------------------------------------------------------------


@dataclasses.dataclass
class Salvage:
    """What recover() rebuilds, and the account of it."""

    header: rec.Header | None = None
    plan: plans.Plan | None = None
    fingerprinter: bytes | None = None
    fingerprints: np.ndarray = dataclasses.field(default_factory=lambda: EMPTY_U64)
    key_design: bytes | None = None
    #: (fingerprint, typed key) pairs, sorted.
    pairs: list = dataclasses.field(default_factory=list)
    #: ((fingerprint, typed key), document record value) of the live documents, sorted.
    documents: list = dataclasses.field(default_factory=list)
    complete: bool = True
    #: The block codings of the Huffman runs read: the new file's, if no header is.
    codings: set = dataclasses.field(default_factory=set)
    problems: list = dataclasses.field(default_factory=list)
    counts: dict = dataclasses.field(default_factory=dict)

    def lost(self, what: str) -> None:
        """Note something that could not be read (the recovery is then not provably complete)."""
        self.complete = False
        self.problems.append(what)


def _one(values: list, trusted_value, what: str, sv: Salvage):
    """The value to use among the distinct verifying copies of a record.

    The copy the intact trees lead to wins; otherwise a single copy; copies
    that disagree are ambiguous (none is used).
    """
    if trusted_value is not None:
        return trusted_value
    if len(values) == 1:
        return values[0]
    if values:
        sv.lost(f"{what}: {len(values)} different copies verify and no intact tree "
                "says which is current")
    return None


def choose_records(found: Found, trusted: Trusted, image: FileImage, sv: Salvage):
    """Pick header, plan, fingerprinter, state and manifest; return (state, manifest, newest).

    newest tells whether the state is provably the newest commit's: the
    intact trees of the snapshot LMDB opens led to it, or both meta pages
    parse and name its transaction.
    """
    _choose_header_and_plan(found, trusted, image.path, sv)
    states = collections.defaultdict(list)
    for payload in found.meta.get(rec.KEY_STATE, []):
        with contextlib.suppress(CorruptionError):
            st = rec.State.unpack(payload)
            states[st.txnid].append(st)
    manifests = collections.defaultdict(list)
    for payload in found.meta.get(rec.KEY_MANIFEST, []):
        with contextlib.suppress(CorruptionError):
            man = rec.Manifest.unpack(payload)
            manifests[man.generation].append(man)
    # The snapshot LMDB opens, when its trees lead to both records.
    tst, tman = trusted.meta(rec.KEY_STATE), trusted.meta(rec.KEY_MANIFEST)
    if tst is not None and tman is not None:
        with contextlib.suppress(CorruptionError):
            st, man = rec.State.unpack(tst), rec.Manifest.unpack(tman)
            if st.txnid == trusted.view.txnid and man.generation == st.manifest_generation:
                return st, man, True
    # Else the newest consistent state among the copies.  A state of a
    # transaction newer than the meta pages allow never committed; with one
    # meta page damaged, the other's successor may have.
    both = all(m is not None for m in image.metas)
    limit = None if image.newest_txnid is None else image.newest_txnid + (0 if both else 1)
    usable = sorted((t for t in states if limit is None or t <= limit), reverse=True)
    for txnid in usable:
        if len(states[txnid]) > 1:
            continue  # one transaction writes one state: disagreeing copies are not ours
        st = states[txnid][0]
        mans = manifests.get(st.manifest_generation, [])
        if len(mans) == 1:
            newest = both and txnid == image.newest_txnid
            if not newest:
                sv.lost(f"the newest commit's state could not be confirmed (meta pages name "
                        f"transaction {image.newest_txnid}); recovered the state of transaction "
                        f"{txnid} and the log records after it")
            return st, mans[0], newest
    st = states[usable[0]][0] if usable and len(states[usable[0]]) == 1 else None
    man = None
    if st is None:
        sv.lost("state record: not found; the log's extent was taken from the log itself")
        top = max(manifests, default=None)
        man = _one(manifests.get(top, []), None, "manifest", sv)
        if man is not None:
            sv.lost(f"used the newest manifest found (generation {man.generation}): runs "
                    "written after it, if any, are not recovered")
    if man is None:
        sv.lost("manifest of the recovered state: not found; every chunk that verifies was "
                "used, so removed fingerprints and keys may have come back")
    return st, man, False


def _choose_header_and_plan(found: Found, trusted: Trusted, path: str, sv: Salvage) -> None:
    if b"segments" in found.databases and b"chunks" not in found.databases:
        raise FormatError(f"{path}: an index in file format 1, which recover does not read; "
                          f"convert it with `ndindex upgrade {path}`")
    raw = _one(found.meta.get(rec.KEY_HEADER, []), trusted.meta(rec.KEY_HEADER), "header", sv)
    if raw is not None:
        try:
            sv.header = rec.Header.unpack(raw, path)
        except CorruptionError as exc:
            sv.lost(f"header: {exc}")
    else:
        sv.lost("header record: not found")
    raw = _one(found.meta.get(rec.KEY_PLAN, []), trusted.meta(rec.KEY_PLAN), "plan", sv)
    if raw is not None:
        try:
            sv.plan = plans.Plan.from_bytes(raw)
        except (FormatError, ValueError) as exc:
            sv.lost(f"plan: {exc}")
    else:
        sv.lost("plan record: not found")
    if sv.header is not None and sv.plan is not None and len(sv.plan.tables) != sv.header.tables:
        sv.lost(f"header names {sv.header.tables} tables, the plan {len(sv.plan.tables)}")
        sv.plan = None
    sv.fingerprinter = _one(found.meta.get(rec.KEY_FINGERPRINTER, []),
                            trusted.meta(rec.KEY_FINGERPRINTER), "fingerprinter", sv)
    sv.key_design = _one(found.meta.get(rec.KEY_KEY_DESIGN, []),
                         trusted.meta(rec.KEY_KEY_DESIGN), "key design", sv)


# -- the log -------------------------------------------------------------------------


def read_log(found: Found, trusted: Trusted, state, newest: bool, sv: Salvage) -> LogOverlay:
    """Apply the log records the state names, in order; note the ones lost.

    For the newest commit's state, exactly its records.  For an older one
    (the newest could not be confirmed), also the records after it as long
    as they follow on without a gap.  Without a state, the records the log
    tree holds, or else the longest gapless sequence ending at the highest
    sequence number found.
    """
    log = LogOverlay()
    if state is not None:
        first, end = state.log_first_seq, state.log_next_seq
        if not newest:
            while end in found.log:
                end += 1
    else:
        seqs = _trusted_log_seqs(trusted)
        if seqs:
            first, end = seqs[0], seqs[-1] + 1
        elif found.log:
            end = max(found.log) + 1
            first = end - 1
            while first - 1 in found.log:
                first -= 1
        else:
            return log
    missing = 0
    for seq in range(first, end):
        key = rec.U64_BE.pack(seq)
        trusted_raw = trusted.value(rec.DB_LOG, key)
        chosen = unframe_value(trusted_raw, key) if trusted_raw is not None else None
        payload = _one(found.log.get(seq, []), chosen, f"log record {seq}", sv)
        try:
            if payload is None:
                raise CorruptionError("not found")
            log.apply(rec.LogRecord.unpack(payload, key))
        except CorruptionError:
            missing += 1
    if missing:
        sv.lost(f"{missing} of {end - first} log records could not be read: the operations "
                "in them are lost")
    sv.counts.update(log_records=end - first - missing, log_records_lost=missing)
    return log


def _trusted_log_seqs(trusted: Trusted) -> list:
    if trusted.view is None:
        return []
    try:
        return [rec.U64_BE.unpack(k)[0] for k, _ in trusted.view.scan(rec.DB_LOG) if len(k) == 8]
    except (CorruptionError, ValueError):
        return []


# -- runs ----------------------------------------------------------------------------


@dataclasses.dataclass
class RunData:
    """What one run still holds: values (or records) read, and whether any is missing."""

    values: list
    whole: bool
    lost_chunks: int = 0
    lost_blocks: int = 0


def run_chunks(found: Found, trusted: Trusted, run: rec.Run, sv: Salvage) -> list:
    """The run's chunks as (key, value), in key order; conflicting copies resolved or dropped."""
    prefix = ch.run_prefix(run.space, run.run_id)
    out = []
    for key in sorted(k for k in found.chunks if k[:5] == prefix):
        values = found.chunks[key]
        if len(values) > 1:
            current = trusted.value(rec.DB_CHUNKS, key)  # only if it verified too
            value = _one(values, current if current in values else None,
                         f"chunk {key.hex()}", sv)
            if value is None:
                continue
        else:
            value = values[0]
        out.append((key, value))
    return out


def _live_range(run: rec.Run) -> tuple[int, int]:
    """[lo, hi] of the values a reader may take from a fingerprint run (7.5 [M2])."""
    lo, hi = 0, U64
    if run.merge_input and run.cursor:
        lo = int.from_bytes(run.cursor, "big") + 1
    if run.merge_output:
        hi = int.from_bytes(run.cursor, "big") if run.cursor else -1
    return lo, hi


def read_fp_run(found: Found, trusted: Trusted, run: rec.Run, code, sv: Salvage) -> RunData:
    """Decode every readable block of a fingerprint run within its live range.

    The run is whole when its chunks chain by their fences from its first
    (or the one holding its live start) to its last ([F13], [F14]), every
    block decodes, and the manifest's chunk count is met.
    """
    lo, hi = _live_range(run)
    if hi < lo:
        return RunData([], True)
    chunks = []
    for key, value in run_chunks(found, trusted, run, sv):
        with contextlib.suppress(CorruptionError):
            chunks.append(ch.unpack_fp_chunk(key, value))
    # Chunks wholly below the live start were consumed by a merge; chunks
    # of a merge output above its cursor never committed.
    live = [c for c in chunks if c.last >= lo and (c.flags & ch.FLAG_FIRST or c.low_fence < hi)]
    whole, prev = True, None
    for c in live:
        if prev is None:
            whole = whole and bool(c.flags & ch.FLAG_FIRST or c.low_fence < lo)
        else:
            whole = whole and c.low_fence == prev.last
        prev = c
    if prev is None:
        whole = whole and run.chunks == 0
    elif run.merge_output:
        whole = whole and prev.last == run.last
    else:
        whole = whole and bool(prev.flags & ch.FLAG_LAST)
    lost_chunks = max(0, run.chunks - len(live))
    parts, lost_blocks = [], 0
    for c in live:
        vals, bad = _decode_chunk(c, code)
        parts.append(vals)
        lost_blocks += bad
    values = np.concatenate(parts) if parts else EMPTY_U64
    if len(values):
        values = values[(values >= np.uint64(lo)) & (values <= np.uint64(hi))]
    return RunData([values], whole and not lost_chunks and not lost_blocks, lost_chunks,
                   lost_blocks)


def _decode_chunk(c: ch.FpChunk, code) -> tuple[np.ndarray, int]:
    """The values of a chunk's readable blocks, and how many blocks failed their checks."""
    try:
        return c.decode(code), 0
    except CorruptionError:
        pass
    parts, bad, below = [], 0, (c.low_fence if not c.flags & ch.FLAG_FIRST else None)
    for i in range(len(c.block_keys)):
        block = c.blocks[i * ch.BLOCK_BYTES:(i + 1) * ch.BLOCK_BYTES]
        try:
            vals = codec.decode(block, code) if c.kind == rec.KIND_HUFFMAN \
                else ch.decode_raw(block, c.key)
        except CorruptionError:
            vals = None
        ok = vals is not None and len(vals) and int(vals[-1]) == int(c.block_keys[i]) and \
            (below is None or int(vals[0]) > below)
        if ok:
            parts.append(vals)
        else:
            bad += 1
        below = int(c.block_keys[i])
    return (np.concatenate(parts) if parts else EMPTY_U64), bad


def read_record_run(found: Found, trusted: Trusted, run: rec.Run, sv: Salvage):
    """({record key: (flag, value)} of a record run's live records, [lost (lo, hi] ranges]).

    A lost range is where records may be missing: (the previous readable
    chunk's separator, the next one's low fence], None for an open end.
    """
    records, lost_ranges = {}, []
    chunks = []
    for key, value in run_chunks(found, trusted, run, sv):
        try:
            chunks.append(ch.unpack_record_chunk(key, value))
        except CorruptionError:
            pass
    prev = None
    for c in chunks:
        if prev is None:
            if c.low_fence is not None and not (run.merge_input and run.cursor and
                                                c.low_fence <= run.cursor):
                lost_ranges.append((None, c.low_fence))
        elif c.low_fence != prev.separator:
            lost_ranges.append((prev.separator, c.low_fence))
        prev = c
        try:
            recs = c.all_records()
        except CorruptionError:
            recs = []
            for i in range(len(c.entries)):
                with contextlib.suppress(CorruptionError):
                    recs.extend(c.block(i))
            lost_ranges.append((c.low_fence, c.separator))
        for key, flag, value in recs:
            if _record_live(run, key):
                records[key] = (flag, value)
    if prev is None:
        if run.chunks:
            lost_ranges.append((None, None))
    elif not prev.flags & ch.FLAG_LAST and not run.merge_output and \
            not (not lost_ranges and not run.merge_input and len(records) == run.entries):
        # Unless every record the manifest counts was read: then the run only
        # lacks the flag, as an older writer's merge left it (FORMAT.md [M2]).
        lost_ranges.append((prev.separator, None))
    return records, lost_ranges


def _record_live(run: rec.Run, key: bytes) -> bool:
    """Whether a record of a run is live (7.5 [M2]), as ndindex.runs reads it."""
    if run.merge_input and run.cursor:
        return key > run.cursor
    if run.merge_output:
        return bool(run.cursor) and key <= run.cursor
    return True


def _in_ranges(key: bytes, ranges: list) -> bool:
    return any((lo is None or key > lo) and (hi is None or key <= hi) for lo, hi in ranges)


# -- the stored set -------------------------------------------------------------------


def salvage(path) -> Salvage:
    """Read everything that verifies in a damaged index file; return what to rebuild.

    Raises FileNotFoundError, IsADirectoryError, FormatError (a named pipe or a
    device: not a regular file); never CorruptionError (damage is reported in the
    result).  Cost: one pass over the file's pages and a decode of the runs it needs.
    """
    path = os.fsdecode(path)
    check_path_for_open(path)
    image = FileImage(path)
    try:
        return _salvage(image)
    finally:
        image.close()


def _salvage(image: FileImage) -> Salvage:
    sv = Salvage()
    found = Found()
    claimed = scan_leaves(image, found)
    trusted = Trusted(image)
    state, manifest, newest = choose_records(found, trusted, image, sv)
    t = len(sv.plan.tables) if sv.plan is not None else (sv.header.tables if sv.header else 0)
    table_spaces = list(range(t)) if t else list(range(rec.SPACE_TOMBSTONES))
    runs = manifest.runs if manifest is not None else []
    scan_overflow(image, found, claimed, {r.run_id: r.space for r in runs}, table_spaces)
    if manifest is None:
        runs = _runs_from_chunks(found)
    log = read_log(found, trusted, state, newest, sv)
    _replay_journals(image.path, sv, found, trusted, log)
    tomb, tomb_whole = _tombstones(found, trusted, runs, manifest is not None)
    sv.counts.update(tombstones=len(tomb), tombstones_whole=tomb_whole)
    if not tomb_whole:
        sv.lost("tombstone chunks lost: fingerprints removed before the last compaction "
                "may have come back")
    logged = _log_records(log)
    pairs, keys_whole = _key_pairs(found, trusted, runs, logged, sv)
    docs = _documents(found, trusted, runs, logged, pairs, keys_whole, sv)
    pair_fps = np.array(sorted({fp for fp, _ in pairs}), dtype=np.uint64)
    if sv.plan is None and sv.header is not None:
        in_runs = pair_fps[~isin_sorted(pair_fps, log.adds)] if len(log.adds) else pair_fps
        _guess_plan(found, trusted, runs, tomb, in_runs, sv)
    stored = _table_fingerprints(found, trusted, runs, sv)
    if len(tomb):
        stored = stored[~isin_sorted(stored, tomb)]
    if len(log.removes):
        stored = stored[~isin_sorted(stored, log.removes)]
    # A live key belongs to a live fingerprint (remove() deletes a
    # fingerprint's keys): one whose table entries were lost comes back.
    extra = [a for a in (log.adds, pair_fps) if len(a)]
    if extra:
        stored = sorted_unique(np.concatenate([stored] + extra))
    live = set(stored.tolist()) if pairs else set()
    sv.pairs = sorted(p for p in pairs if p[0] in live)
    sv.documents = sorted((p, v) for p, v in docs.items() if p[0] in live)
    sv.fingerprints = stored
    sv.counts.update(
        pages=image.npages, leaf_pages=found.leaf_pages, unclaimed_overflow_runs=found.overflow_runs,
        meta_records=sum(map(len, found.meta.values())), log_records_found=len(found.log),
        chunks_found=len(found.chunks), values_not_verified=found.unreadable_values,
        newest_txnid=image.newest_txnid, txnid=state.txnid if state is not None else None,
        newest_commit=bool(newest), manifest=manifest is not None)
    if not image.npages:
        sv.lost("the file holds no whole page")
    return sv


def _runs_from_chunks(found: Found) -> list:
    """Runs made up from the chunks found, newest (highest id) first, when no manifest is."""
    codes = {}
    for payload in found.meta.get(rec.KEY_MANIFEST, []):
        with contextlib.suppress(CorruptionError):
            for r in rec.Manifest.unpack(payload).runs:
                if r.code:
                    codes[r.run_id] = r.code
    runs = {}
    for key, values in found.chunks.items():
        rid = int.from_bytes(key[1:5], "big")
        if (key[0], rid) not in runs:
            runs[(key[0], rid)] = rec.Run(key[0], values[0][4], 0, rid, 0, 0,
                                          code=codes.get(rid, b""))
    out = sorted(runs.values(), key=lambda r: -r.run_id)
    for r in out:
        r.chunks = sum(1 for k in found.chunks if k[:5] == ch.run_prefix(r.space, r.run_id))
    return out


def _tombstones(found: Found, trusted: Trusted, runs: list, have_manifest: bool):
    """(sorted tombstoned fingerprints, whether every tombstone run was read
    whole): of each run the manifest lists ([M3]: several from format 5), or
    without one, of the newest run found only (older ones may be runs
    replaced since, and hide fingerprints added back: removed ones may come
    back instead, as the report says)."""
    tomb_runs = [r for r in runs if r.space == rec.SPACE_TOMBSTONES]
    parts, whole = [], True
    for run in tomb_runs if have_manifest else tomb_runs[:1]:
        fps, run_whole = _tombstone_run(found, trusted, run, have_manifest)
        parts.append(fps)
        whole = whole and run_whole
    return (sorted_unique(np.concatenate(parts)) if parts else EMPTY_U64), whole


def _tombstone_run(found: Found, trusted: Trusted, run, have_manifest: bool):
    """(sorted fingerprints, whether read whole) of one tombstone run."""
    fps, whole, prev, done = [], True, None, False
    for key, value in run_chunks(found, trusted, run, Salvage()):
        try:
            f, _, first, last = tombstone_chunk(key, value)
        except CorruptionError:
            whole = False
            continue
        low = ch.FP_CHUNK_HEAD.unpack_from(value)[6]
        if (prev is None and not first) or (prev is not None and low != prev):
            whole = False
        fps.append(f)
        prev = int(f[-1])
        done = last
    if prev is None or not done:
        whole = False
    if have_manifest and sum(len(f) for f in fps) != run.entries:
        whole = False
    if not have_manifest and not whole:
        return EMPTY_U64, False  # a partial run of unknown standing: hide nothing
    return (sorted_unique(np.concatenate(fps)) if fps else EMPTY_U64), whole


def _table_sets(found: Found, trusted: Trusted, runs: list, plan, sv: Salvage, first_whole=True):
    """[(fingerprints, whole, lost chunks, lost blocks)] of each table, decoded with plan.

    With first_whole, stop after the first table read whole: every table
    holds every fingerprint ([Q2]), so it alone gives them all.
    """
    out = []
    for t, design in enumerate(plan.tables):
        parts, whole, lost_chunks, lost_blocks = [], True, 0, 0
        for run in (r for r in runs if r.space == t):
            if run.kind == rec.KIND_HUFFMAN and not run.code:
                whole, lost_chunks = False, lost_chunks + run.chunks  # no code to decode it
                continue
            code = codec.HuffmanCode.from_bytes(run.code) if run.kind == rec.KIND_HUFFMAN \
                else None
            if code is not None:
                sv.codings.add(code.coding)
            data = read_fp_run(found, trusted, run, code, sv)
            parts.extend(data.values)
            whole = whole and data.whole
            lost_chunks += data.lost_chunks
            lost_blocks += data.lost_blocks
        values = np.concatenate(parts) if parts else EMPTY_U64
        fps = sorted_unique(np.sort(design.invert(values))) if len(values) else EMPTY_U64
        out.append((fps, whole, lost_chunks, lost_blocks))
        if whole and first_whole:
            break
    return out


def _table_fingerprints(found: Found, trusted: Trusted, runs: list, sv: Salvage) -> np.ndarray:
    """Fingerprints the tables hold: from the first table read whole, else the union of all."""
    if sv.plan is None:
        if any(r.space < rec.SPACE_TOMBSTONES for r in runs):
            sv.lost("without the plan the tables cannot be decoded: only fingerprints in the "
                    "log and in document keys were recovered")
        return EMPTY_U64
    tables = _table_sets(found, trusted, runs, sv.plan, sv)
    sv.counts.update(tables_read=len(tables), table_chunks_lost=sum(t[2] for t in tables),
                     table_blocks_lost=sum(t[3] for t in tables))
    uncoded = sum(r.chunks for r in runs if r.space < len(sv.plan.tables) and
                  r.kind == rec.KIND_HUFFMAN and not r.code)
    if uncoded:
        sv.problems.append(f"{uncoded} chunks of Huffman-coded runs cannot be decoded: their "
                           "codes were kept only in the lost manifest")
    fps, whole, _, _ = tables[-1]
    if whole:
        if len(tables) > 1:
            sv.problems.append(f"tables 0..{len(tables) - 2} lost entries; table "
                               f"{len(tables) - 1} was read whole")
        return fps
    sv.lost(f"no table could be read whole ({sum(t[2] for t in tables)} chunks and "
            f"{sum(t[3] for t in tables)} blocks lost): the union of what every table still "
            "holds was recovered")
    return sorted_unique(np.concatenate([t[0] for t in tables]))


def _guess_plan(found: Found, trusted: Trusted, runs: list, tomb, key_fps, sv: Salvage) -> None:
    """Stand in the planner's choice for a lost plan record if the tables confirm it.

    Indexes made without an explicit plan use ``choose_plan(expected_n, k)``
    of their header.  The guess is taken only if every table read whole
    decodes to the same fingerprints (apart from tombstones, [Q2]) and the
    fingerprints named by document keys are among them; with one table and
    no keys nothing can confirm it.
    """
    h = sv.header
    try:
        guess = plans.choose_plan(h.expected_n, min(h.k, plans.MAX_PLANNER_K))
    except (ValueError, TypeError):
        return
    if len(guess.tables) != h.tables:
        return
    tables = _table_sets(found, trusted, runs, guess, Salvage(), first_whole=False)
    sets = [f[~isin_sorted(f, tomb)] if len(tomb) else f for f, whole, _, _ in tables if whole]
    union = sorted_unique(np.concatenate([t[0] for t in tables])) if tables else EMPTY_U64
    agree = len(sets) >= 2 and all(np.array_equal(sets[0], x) for x in sets[1:])
    keyed = len(key_fps) > 0 and bool(np.all(isin_sorted(key_fps, union)))
    if (agree or (len(sets) < 2 and keyed)) and (not len(key_fps) or keyed):
        sv.plan = guess
        sv.problems.append("the plan record was lost; the planner's plan for the header's "
                           "expected_n and k decodes the tables consistently and was used")


def _log_records(log: LogOverlay) -> dict:
    """{space: {record key: (flag, value)}} of the log's net record operations."""
    return {space: {key: (flag, value) for key, flag, value in ch.unpack_records(raw)}
            for space, raw in log.ops.streams().items()}


def _space_runs(found: Found, trusted: Trusted, runs: list, space: int, sv: Salvage) -> list:
    """[(records, lost ranges)] of every run of a record space, newest first (counted)."""
    out = [read_record_run(found, trusted, run, sv) for run in runs if run.space == space]
    sv.counts[f"key_ranges_lost_{rec.space_name(space)}"] = sum(len(lost) for _, lost in out)
    return out


def _key_pairs(found: Found, trusted: Trusted, runs: list, logged: dict, sv: Salvage):
    """(set of live (fingerprint, typed key) pairs, whether a key space was read whole).

    Each pair is recorded in both key spaces (7.9), so a space read whole
    decides every pair alone (the other is not read).  If both lost
    chunks, a pair is decided by a space in which no run newer than the
    one holding it lost the range it would lie in; a pair neither space
    can decide for certain is kept as the newest record found says, and
    the recovery is marked incomplete.  The log decides before either.
    """
    decided = {_pair_of(rec.SPACE_KEYS_BY_FP, key): flag == ch.RECORD_PUT
               for key, (flag, _) in logged.get(rec.SPACE_KEYS_BY_FP, {}).items()}
    spaces = {}
    for space in (rec.SPACE_KEYS_BY_FP, rec.SPACE_FPS_BY_KEY):
        spaces[space] = _space_runs(found, trusted, runs, space, sv)
        if all(not lost for _, lost in spaces[space]):
            for records, _ in spaces[space]:
                for key, (flag, _) in records.items():
                    if len(key) > 8:
                        decided.setdefault(_pair_of(space, key), flag == ch.RECORD_PUT)
            return {pair for pair, put in decided.items() if put}, True
    uncertain = 0
    mentioned = {_pair_of(space, key) for space, space_runs in spaces.items()
                 for records, _ in space_runs for key in records if len(key) > 8}
    for pair in mentioned - decided.keys():
        results = [_decide(spaces[s], _key_of(s, pair)) for s in spaces]
        certain = [got for got, sure in results if sure]
        if certain:
            put = certain[0] is not None and certain[0][0] == ch.RECORD_PUT
        else:
            uncertain += 1
            put = next((got[0] == ch.RECORD_PUT for got, _ in results if got is not None), False)
        decided[pair] = put
    sv.lost(f"both key spaces lost chunks: {uncertain} keys could not be decided for "
            "certain, and keys recorded only in the lost chunks are missing")
    return {pair for pair, put in decided.items() if put}, False


def _pair_of(space: int, key: bytes) -> tuple:
    if space in (rec.SPACE_KEYS_BY_FP, rec.SPACE_DOCS):
        return rec.U64_BE.unpack(key[:8])[0], key[8:]
    return rec.U64_BE.unpack(key[-8:])[0], key[:-8]


def _key_of(space: int, pair: tuple) -> bytes:
    fp, raw = pair
    if space in (rec.SPACE_KEYS_BY_FP, rec.SPACE_DOCS):
        return rec.U64_BE.pack(fp) + raw
    return raw + rec.U64_BE.pack(fp)


def _decide(space_runs: list, key: bytes):
    """((flag, value) or None if no run holds key, True if certain) of a record key in one space."""
    certain = True
    for records, lost_ranges in space_runs:  # newest first
        got = records.get(key)
        if got is not None:
            return got, certain
        if lost_ranges and _in_ranges(key, lost_ranges):
            certain = False
    return None, certain


def _documents(found: Found, trusted: Trusted, runs: list, logged: dict, pairs: set,
               keys_whole: bool, sv: Salvage) -> dict:
    """{(fingerprint, typed key): document record value} of the live documents that verify.

    A document is live when its pair is and the newest operation on its
    record (the log's, else the newest run holding it) is a put.  The
    record must parse and name as its first lookup key the exact key of
    its own sketch (documents.md [DK22]); its lookup-key records are not
    read (the rebuild derives them again from the document records).
    When the key spaces lost chunks, a document record put for certain
    (no newer run lost its range) vouches for its pair too ([D1]: a
    document's pair is stored with it), and the pair is added to pairs.
    Documents whose records may lie in a lost range are counted lost.
    """
    from ndindex import docstore
    from ndindex.fingerprint.bands import exact_key

    space_runs = _space_runs(found, trusted, runs, rec.SPACE_DOCS, sv)
    logged = logged.get(rec.SPACE_DOCS, {})
    if not space_runs and not logged:
        return {}  # an index without documents
    candidates = set(pairs)
    if not keys_whole:
        for records, _ in space_runs:
            candidates.update(_pair_of(rec.SPACE_DOCS, key) for key, (flag, _) in records.items()
                              if flag == ch.RECORD_PUT)
        candidates.update(_pair_of(rec.SPACE_DOCS, key) for key, (flag, _) in logged.items()
                          if flag == ch.RECORD_PUT)
    docs, maybe_lost, uncertain, bad = {}, 0, 0, 0
    for pair in candidates:
        key = _key_of(rec.SPACE_DOCS, pair)
        got, certain = logged.get(key), True
        if got is None:
            got, certain = _decide(space_runs, key)
        if got is None or got[0] != ch.RECORD_PUT:
            maybe_lost += pair in pairs and not certain
            continue
        if pair not in pairs and not certain:
            continue  # a pair the key spaces did not keep, vouched for by an uncertain copy
        try:
            doc = docstore.unpack_document(got[1], key)
            if not len(doc.lookup_keys) or int(doc.lookup_keys[0]) != exact_key(doc.sketch):
                raise CorruptionError("the first lookup key is not the sketch's exact key")
        except (CorruptionError, ValueError):
            bad += 1
            continue
        uncertain += not certain
        docs[pair] = got[1]
        pairs.add(pair)
    sv.counts.update(documents_maybe_lost=maybe_lost, documents_not_verified=bad,
                     documents_uncertain=uncertain)
    if maybe_lost:
        sv.lost(f"document record chunks lost: {maybe_lost} stored keys have no readable "
                "document (their fingerprints and keys were kept)")
    if uncertain:
        sv.lost(f"{uncertain} documents were read from an older run whose newer runs lost "
                "chunks: a newer version of them may have been lost")
    if bad:
        sv.lost(f"{bad} document records do not parse")
    return docs


def _replay_journals(path: str, sv: Salvage, found: Found, trusted: Trusted,
                     log: LogOverlay) -> None:
    """Apply to log the operations of journals whose writer died (durability "normal", 7.10 [J2]).

    A journal's records follow every log record (it is checkpointed into
    the log), so they apply after it.
    """
    if sv.header is None:
        return
    for jpath, journal_id, generation, records in jr.orphans(path, sv.header.file_id):
        if journal_id is None:
            continue
        key = jr.journal_key(journal_id)
        raw = _one(found.meta.get(key, []), trusted.meta(key), f"journal {journal_id:016x}", sv)
        done_gen, done_off = jr.unpack_position(raw) if raw is not None else (-1, 0)
        n = 0
        for end, payload in records:
            if generation == done_gen and end <= done_off:
                continue
            with contextlib.suppress(CorruptionError):
                log.apply(rec.LogRecord.unpack(payload, key))
                n += 1
        if n:
            sv.problems.append(f"{n} journal records of {os.path.basename(jpath)} replayed")


# -- writing the new index ------------------------------------------------------------------


def recover(source, output, *, progress=None) -> dict:
    """Salvage a damaged index into a new index file; return the report.

    Parameters: source, the damaged file (left as it is); output, the new
    index (must not exist); progress, an optional callable(phase, done,
    total).  The new index has the source's k, plan, coding and
    fingerprinter and every fingerprint, document key and document whose
    records still verify (documents' lookup-key records are derived again
    from them); it is compacted and verified, built under a temporary
    name beside output and moved into place when whole.

    Returns a dict: source, output (None if nothing could be rebuilt),
    fingerprints, keys, documents, complete (every fingerprint, key and
    document provably
    recovered), status (0 complete, 1 partial, 2 nothing recoverable),
    problems (what could not be read, one line each) and counts.
    Raises FileExistsError if output exists, FileNotFoundError if source
    does not; CapacityError/ReadOnlyError if output cannot be written.
    """
    source, output = os.fsdecode(source), os.fsdecode(output)
    validate.progress(progress)
    if os.path.lexists(output):
        raise FileExistsError(errno.EEXIST, "already exists", output)
    if not os.path.exists(source):
        raise FileNotFoundError(errno.ENOENT, "no such index", source)
    if progress:
        progress("reading", 0, 1)
    sv = salvage(source)
    report = dict(source=source, output=None, fingerprints=len(sv.fingerprints),
                  keys=len(sv.pairs), documents=len(sv.documents), complete=sv.complete,
                  problems=sv.problems, counts=sv.counts)
    k, plan = _parameters(sv)
    if plan is None or (not len(sv.fingerprints) and not sv.complete):
        report.update(status=2, complete=False)
        if plan is None:
            report["problems"] = sv.problems + ["nothing to rebuild: neither the plan nor the "
                                                "header could be read"]
        return report
    _rebuild(sv, output, k, plan, progress)
    report.update(output=output, status=0 if sv.complete else 1, complete=sv.complete)
    return report


def _parameters(sv: Salvage):
    """(k, plan) for the new index: the header's and plan's, or what can stand in for them."""
    if sv.plan is not None:
        k = sv.header.k if sv.header is not None else min(sv.plan.k, plans.MAX_PLANNER_K)
        return min(k, sv.plan.k), sv.plan
    if sv.header is not None:
        k = min(sv.header.k, plans.MAX_PLANNER_K)
        return k, plans.choose_plan(sv.header.expected_n, k)
    return None, None


def _rebuild(sv: Salvage, output: str, k: int, plan, progress) -> None:
    from ndindex import store as st
    from ndindex.index import Index  # the public API (index imports nothing from here)

    header = sv.header
    coding = header.coding if header else max(sv.codings, default=codec.CODING_RESTARTS)
    # A fixed name, held while it builds: what a killed recover left, the
    # next one (or a writer's open of output) deletes (store.index_build).
    with st.index_build(output, "recover") as tmp:
        with Index.create(tmp, k=k, expected_n=header.expected_n if header else
                          max(1, len(sv.fingerprints)), plan=plan, coding=coding,
                          fingerprinter=sv.fingerprinter, background_compaction=False,
                          log_limit=1 << 40) as ix:
            fps = sv.fingerprints
            total = len(fps) + len(sv.pairs)
            for a in range(0, len(fps), REBUILD_BATCH):
                ix.add(fps[a:a + REBUILD_BATCH])
                if progress:
                    progress("writing", a + REBUILD_BATCH, total)
            for a in range(0, len(sv.pairs), REBUILD_BATCH):
                part = sv.pairs[a:a + REBUILD_BATCH]
                keys, fp_list = [], []
                for fp, raw in part:
                    if _valid_key(raw, fp, sv):
                        keys.append(rec.decode_doc_key(raw))
                        fp_list.append(fp)
                ix.add(np.array(fp_list, dtype=np.uint64), keys=keys)
                if progress:
                    progress("writing", len(fps) + a + len(part), total)
            _rebuild_documents(ix, sv)
            if progress:
                progress("compacting", 0, 1)
            ix.compact(full=True)
            if progress:
                progress("verifying", 0, 1)
            ix.verify()
        st.publish(tmp, output)  # never clobbers a file that appeared meanwhile


def _valid_key(raw: bytes, fp: int, sv: Salvage) -> bool:
    try:
        rec.decode_doc_key(raw)
    except CorruptionError:
        sv.lost(f"key {raw[:40]!r} of fingerprint {fp:#018x} is not a valid key")
        return False
    return True


def _rebuild_documents(ix, sv: Salvage) -> None:
    """Store the salvaged document records; the flush derives their lookup-key records ([D2]).

    The records go through the writer as add_documents' do (their pairs
    are already stored); the new index was created with the source's
    fingerprinter, so its key design is the one the fingerprinter implies
    (the only one Index.create writes): a source whose key design record
    says otherwise is reported.
    """
    if not sv.documents:
        return
    from ndindex import docstore

    if sv.fingerprinter is None:
        sv.lost(f"the fingerprinter record was lost: {len(sv.documents)} documents are kept "
                "as fingerprints and keys only")
        return
    design = docstore.key_design_for(docstore.as_fingerprinter(sv.fingerprinter)).to_bytes()
    if sv.key_design is not None and sv.key_design != design:
        sv.lost("the key design record differs from the one the fingerprinter implies, which "
                "the new index uses: similar() of a text may miss recovered documents")
    for a in range(0, len(sv.documents), REBUILD_DOCUMENTS):
        records = [(rec.SPACE_DOCS, _key_of(rec.SPACE_DOCS, pair), ch.RECORD_PUT, value)
                   for pair, value in sv.documents[a:a + REBUILD_DOCUMENTS]
                   if _valid_key(pair[1], pair[0], Salvage())]
        ix._writer.apply(rec.LogRecord(EMPTY_U64, EMPTY_U64, [], [], records))


__all__ = ["recover", "salvage", "Salvage"]
