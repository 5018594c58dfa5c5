"""The run layout: which runs a flush makes, and which merges are due.

Each table is a log-structured set of sorted runs (FORMAT.md 7.4).  A
*flush* turns the append log into one new run per table (and per record
space), updates the tombstones and deletes the log records; a table's
flush merges with its small level-1 run in the same commit when it can
(``flush_target``), else it is a level-0 run.  A *merge* combines runs
into one run of the next level, LevelDB-style leveling: level-0 runs
merge into level 1 at once; a level merges into the next when it
outgrows its share (``level_capacity``), and the top raw level into the
main level, with the table's main run, once it holds ``MAIN_FRACTION`` of
it (one run a level, so a query probes a few runs).  Level 1 holds
``SMALL_LEVEL_RATIO`` flushes while two raw levels do with that, then
``LEVEL_RATIO`` (``level1_share``); the shares of the levels above grow
geometrically to the top's, at most ``MAX_LEVEL_RATIO`` apart, and a raw
level is added each time the main level grows that much (RocksDB's
dynamic level sizes): two raw levels up to 33.5M entries a table, three
up to 537M.  Each fingerprint is so rewritten at most about
(MAX_LEVEL_RATIO + 1) / 2 times per level, O(log N) levels: work per
added fingerprint grows with log N, not N.

Functions of manifests only (no file access): :mod:`ndindex.compaction`
asks them each step and does what they say.  Level 0 holds a flush that
could not join level 1; levels 1 up to the top raw level hold raw blocks;
MAIN_LEVEL holds a table's Huffman-delta runs.
"""

from __future__ import annotations

import numpy as np

from ndindex.records import KIND_HUFFMAN, KIND_RAW, RECORD_SPACES, Manifest, Run

#: Log operations that make a flush worth doing.
FLUSH_OPS = 1 << 16
#: Level 1 holds FLUSH_OPS * LEVEL_RATIO entries (level1_share) ...
LEVEL_RATIO = 8
#: ... or this many flushes, while the top raw level's share is at most
#: MAX_LEVEL_RATIO times that (a main level of up to 16.8M entries a
#: table).  Every flush rewrites the level-1 run in its commit: among the
#: largest commits of a small index, which the file must hold free pages
#: for beside its data (bench_churn_commits.py).  At 10M (with the
#: top raw level's floor of top_share), bench_stream's file after the
#: stream went from 1.20-1.21x a fresh build to 1.15-1.16x, after churn
#: from 1.33-1.42x to 1.31-1.33x (two runs each); at 30M, four flushes
#: would take a third raw level (a slower stream), hence the switch.
SMALL_LEVEL_RATIO = 4
#: The levels below the main level hold raw blocks (cheap to merge and to
#: probe; packed, about 6.4 bytes a value at level 2 of a 10M index,
#: FORMAT.md 5.3; plain, 8.06); the main level holds Huffman-delta blocks
#: (about 5.5 bytes a value at 10M, but several times dearer to encode).
#: Keeping the levels that are rewritten often raw is what lets one core
#: keep up with a million additions a second.  Every Huffman run of a table
#: is a main-level run whatever level it carries (files written before
#: 2026-11-27 numbered the main level 3; see level_of).
MAIN_LEVEL = 15
#: The top raw level merges into the main level once it holds this
#: fraction of the main level (or LEVEL_RATIO times a small level 1, if
#: more: top_share).
MAIN_FRACTION = 0.25
#: Raw levels are added as the main level grows (RocksDB's dynamic level
#: sizes): the sizes of levels 1 .. top grow geometrically from level 1's
#: to the top's, at most this ratio apart.  With two raw levels whatever N,
#: level 2 held a quarter of the main level, and each level-1 run merged
#: into it rewrote it: at 1B, 250M entries rewritten for every 0.5M added.
MAX_LEVEL_RATIO = 16
#: Where the main level of record spaces was numbered before (their runs
#: are never Huffman-coded): their runs at this level or above are main.
RECORD_MAIN_LEVEL = 3
#: Deletion-triggered merge (as RocksDB's compaction on deletions): once the
#: tombstones that may hide fingerprints of a table's oldest run outnumber
#: this fraction of its main level, every run of the table merges into the
#: main level, so removed fingerprints leave the file and their tombstones
#: can go (the next flush drops them) instead of piling up with churn.
TOMBSTONE_FRACTION = 0.05
#: Tombstone runs a file keeps before the smallest merge (format 5): each
#: flush adds one, and a query looks each candidate it finds up in each.
TOMBSTONE_RUNS = 4


def level1_full(man: Manifest, space: int, flush_ops: int = FLUSH_OPS) -> bool:
    """Whether a table's free level-1 run is past its share while no merge
    runs in the table: the next merge round starts its merge up."""
    runs = man.of(space)
    share = level1_share(main_level_entries(runs), flush_ops)
    return not any(r.merge_into for r in runs) and any(
        level_of(r) == 1 and r.entries > share for r in runs)


def flush_target(man: Manifest, space: int, level: int, flush_ops: int = FLUSH_OPS):
    """Where a table's flush (of a run at level) goes: (1, run) to merge
    with a free small run of the table in the flush's own commit, (1, None)
    to be a level-1 run of its own, or (level, None) to be a level-0 run
    merged up in steps (or a main run, for a flush larger than the raw
    levels).

    A free small run is a level-0 or level-1 run no merge has.  The flush
    merges into the smallest one within level 1's share (the commit then
    writes at most that share and the log, a few megabytes a table); past
    it, the run's merge up is due, and while it waits for a busy merge of
    its table, one more level-1 run takes the flushes.  A level-0 run merged
    up in steps was two or three more runs for every query to probe
    meanwhile.  (Flushes then go as soon as the log is due, each rewriting
    the level-1 run, and a commit holds the whole run: write amplification
    and the file's growth come more from flushes than they did.)"""
    if level != 0:
        return level, None
    runs = man.of(space)
    share = level1_share(main_level_entries(runs), flush_ops)
    free = [r for r in runs if level_of(r) <= 1 and not r.merge_into]
    room = [r for r in free if r.entries <= share]
    if room:
        return 1, min(room, key=lambda r: r.entries)
    return (1, None) if len(free) < 2 else (level, None)


def level_of(run: Run) -> int:
    """A run's level as the policy sees it: MAIN_LEVEL for every run of the
    main level (a table's Huffman runs; a record space's runs at
    RECORD_MAIN_LEVEL or above, as files before 2026-11-27 numbered them)."""
    if run.kind == KIND_HUFFMAN or (run.space in RECORD_SPACES and
                                    run.level >= RECORD_MAIN_LEVEL):
        return MAIN_LEVEL
    return run.level


def main_level_entries(runs) -> int:
    """Entries of a space's main-level runs."""
    return sum(r.entries for r in runs if level_of(r) >= MAIN_LEVEL)


def largest_main_level(man: Manifest, tables: int) -> int:
    """The most main-level entries of any table (spaces 0 .. tables - 1)."""
    return max((main_level_entries(man.of(t)) for t in range(tables)), default=0)


def level1_share(main_entries: int, flush_ops: int) -> int:
    """Entries level 1 may hold: SMALL_LEVEL_RATIO flushes while the top
    raw level's share is within MAX_LEVEL_RATIO of that, else LEVEL_RATIO
    flushes (the top's share then sets how many raw levels there are)."""
    small = flush_ops * SMALL_LEVEL_RATIO
    if top_share(main_entries, flush_ops) <= small * MAX_LEVEL_RATIO:
        return small
    return flush_ops * LEVEL_RATIO


def top_share(main_entries: int, flush_ops: int) -> int:
    """Entries the top raw level may hold: MAIN_FRACTION of the main level,
    at least LEVEL_RATIO times a level 1 of SMALL_LEVEL_RATIO flushes."""
    return max(flush_ops * SMALL_LEVEL_RATIO * LEVEL_RATIO, int(main_entries * MAIN_FRACTION))


def top_raw_level(main_entries: int = 0, flush_ops: int = FLUSH_OPS) -> int:
    """The top raw level of a space whose main level holds main_entries: 2
    until the top's share is MAX_LEVEL_RATIO times level 1's, then one more
    level for every MAX_LEVEL_RATIO times (at FLUSH_OPS: 2 up to a main
    level of 33.5M entries, 3 up to 537M, 4 up to 8.6G)."""
    ratio = top_share(main_entries, flush_ops) / level1_share(main_entries, flush_ops)
    top = 2
    while ratio > MAX_LEVEL_RATIO ** (top - 1) and top < MAIN_LEVEL - 1:
        top += 1
    return top


def level_capacity(level: int, main_entries: int = 0, flush_ops: int = FLUSH_OPS,
                   records: bool = False) -> int:
    """Entries a run of this level may hold before it merges into the next.

    Level 0 holds a flush, level 1 level1_share, the top raw level
    top_share (MAIN_FRACTION of the main level),
    the levels between them sizes in geometric progression.  A raw level
    above the top (the main level shrank) holds nothing: it is due.
    Record spaces keep two raw levels (records: their level 3 is main in
    files before 2026-11-27, see level_of)."""
    if level >= MAIN_LEVEL:
        return 1 << 63
    if level == 0:
        return flush_ops
    top = 2 if records else top_raw_level(main_entries, flush_ops)
    if level > top:
        return 0
    base, share = level1_share(main_entries, flush_ops), top_share(main_entries, flush_ops)
    if level == top:
        return share
    return int(base * (share / base) ** ((level - 1) / (top - 1)))


def level_for(entries: int, at_least: int = 0, main_entries: int = 0,
              flush_ops: int = FLUSH_OPS, records: bool = False) -> int:
    """The lowest level, at least at_least, whose runs may hold this many entries."""
    level = at_least
    while level < MAIN_LEVEL and entries > level_capacity(level, main_entries, flush_ops,
                                                          records):
        level += 1
    return level


def kind_of(level: int) -> int:
    return KIND_HUFFMAN if level >= MAIN_LEVEL else KIND_RAW


def choose_merges(man: Manifest, space: int, full: bool, flush_ops: int = FLUSH_OPS,
                   stamps: np.ndarray | None = None, coding: int | None = None) -> list:
    """The merges to advance in a space this round (see choose_merge).

    Beside a merge of the large levels (level 2 and the main level), which
    takes hundreds of steps at 10M, the runs below it merge among themselves
    as they would alone, into a level below the busy merge's (as LevelDB
    compacts different levels at once): full level-1 runs into level 2,
    level-0 runs into level 1 even past its capacity.  Otherwise they pile
    up (at 30M, four level-1 runs beside a merge into the main level), and
    every query probes each of them.  Record spaces, whose runs are ordered
    (newest wins), keep one merge at a time.
    """
    runs = man.of(space)
    busy = [(r, [i for i in runs if i.merge_into == r.run_id and i.merge_input], level_of(r))
            for r in runs if r.merge_output]
    if not busy:
        first = choose_merge(man, space, full, flush_ops, stamps, coding)
        return [] if first is None else [first]
    if space in RECORD_SPACES or full or len(busy) > 1 or \
            any(level_of(r) < 2 for r in busy[0][1]):
        return busy
    main = main_level_entries(runs)
    rest = Manifest(man.generation, man.next_run_id,
                    [r for r in man.runs if r.space != space or not r.merge_into])
    side = choose_merge(rest, space, False, flush_ops, None, coding, main)
    if side is not None and side[2] <= min(level_of(r) for r in busy[0][1]):
        return busy + [side]
    level0 = [r for r in runs if not r.merge_into and level_of(r) == 0]
    if not level0:
        return busy
    # Into level 1 even past its capacity: a second run at a busy level
    # would be one more run for every query to probe.
    return busy + [(None, level0 + [r for r in runs if not r.merge_into and level_of(r) == 1][:1],
                    1)]


def choose_merge(man: Manifest, space: int, full: bool, flush_ops: int = FLUSH_OPS,
                  stamps: np.ndarray | None = None, coding: int | None = None,
                  main: int | None = None):
    """The merge to advance in a space: (output or None, inputs newest first, level) or None.

    stamps: the tombstones' stamps, sorted (for the deletion trigger).
    coding: the file's block coding; a full merge rewrites a lone Huffman
    run of another (an upgraded file's, FORMAT.md 7.2).  main: the
    table's main-level entries, when man leaves out a busy merge's runs.
    """
    runs = man.of(space)
    for r in runs:  # a merge in progress goes first
        if r.merge_output:
            return r, [i for i in runs if i.merge_into == r.run_id and i.merge_input], level_of(r)
    free = [r for r in runs if not r.merge_into]
    if not free:
        return None
    record = space in RECORD_SPACES
    if full:
        if len(free) > 1 or (not record and (free[0].kind != KIND_HUFFMAN or (
                coding is not None and free[0].coding != coding))):
            return None, free, MAIN_LEVEL
        return None
    if main is None:
        main = main_level_entries(runs)
    if not record and stamps is not None and main and len(free) == len(runs):
        # A tombstone stamped s hides fingerprints of runs older than s.
        oldest = min(r.run_id for r in free)
        # (A stamp's own dtype: a Python int made numpy cast all the stamps first.)
        hiding = len(stamps) - int(np.searchsorted(stamps, stamps.dtype.type(oldest),
                                                   side="right"))
        if hiding > TOMBSTONE_FRACTION * main:
            return None, free, MAIN_LEVEL
    # Level-0 runs (flushes) merge up at once, with the free level-1 runs.
    level0 = [r for r in free if level_of(r) == 0]
    if level0:
        inputs = level0 + [r for r in free if level_of(r) == 1]
        return _leveled(inputs, free, level_for(sum(r.entries for r in inputs), 1, main,
                                                flush_ops, record), main, flush_ops, record)
    for level in sorted({level_of(r) for r in free}):
        here = [r for r in free if level_of(r) == level]
        if level >= MAIN_LEVEL:
            if len(here) > 1:
                return None, here, level
            continue
        total = sum(r.entries for r in here)
        if total > level_capacity(level, main, flush_ops, record):
            return _leveled(here, free, level_for(total, level + 1, main, flush_ops, record),
                            main, flush_ops, record)
        if len(here) > 1:  # a level holds one run; two appear while one was busy
            return None, here, level
    return None


def _leveled(inputs: list, free: list, level: int, main: int, flush_ops: int,
             records: bool = False):
    """The merge of inputs into level, leveled as LevelDB: with the free run
    already at the level (each run at a level is one more probe per query),
    and into the next level if together they outgrow it.  When that run is
    due into the main level, it goes there alone: the small runs then merge
    beside the long merge (choose_merges) instead of waiting as its inputs."""
    if 1 < level < MAIN_LEVEL:
        here = [r for r in free if level_of(r) == level and r not in inputs][:1]
        up = level_for(sum(r.entries for r in inputs + here), level, main, flush_ops, records)
        if here and up >= MAIN_LEVEL:
            return None, _with_main(here, free, up), up
        inputs, level = inputs + here, up
    return None, _with_main(inputs, free, level), level


def _with_main(inputs: list, free: list, level: int) -> list:
    """A merge's inputs, with every free main-level run of the table when it
    goes into the main level: leveled there too, one main run a table.  (A
    merge of the small levels that outgrew level 2 used to become a main run
    beside the others; at 30M a table held five of them, each one more probe
    for every query, and their number grows with N.)"""
    if level < MAIN_LEVEL:
        return inputs
    return inputs + [r for r in free if level_of(r) >= MAIN_LEVEL and r not in inputs]


def tombstone_cap(main_entries: int, flush_ops: int = FLUSH_OPS) -> int:
    """The most tombstones a merge of tombstone runs writes: a 16th of the
    main level's entries (at 10M, 625,000 tombstones, 115 chunks, less
    than a flush puts), at least eight flushes'.  Tombstones beyond it stay
    in several runs.  (A 32nd made twice the merges, and the churned 10M
    file 1.17x its size before churn against 1.06x in two runs with a
    16th: bench_churn_commits.py.)"""
    return max(8 * flush_ops, main_entries // 16)


def tombstone_inputs(runs: list, stamps: list, floor: int, cap: int) -> list:
    """Which tombstone runs (indexes into runs, newest first) one commit
    merges into one, or [] for none: every run half or more outdated
    (stamps at or below floor, [F15]) -- rewritten without them, or
    dropped when nothing is left -- and, while more than TOMBSTONE_RUNS
    remain, the smallest runs whose entries together fit cap (at least two;
    past 4 * TOMBSTONE_RUNS runs, the two smallest whatever their size).
    Each merge writes at most about cap tombstones, so no commit rewrites
    them all; runs at the cap stay apart (a 16th of the main level's
    entries each: a few, while merges into the main level drop what they
    hide)."""
    chosen = [i for i, s in enumerate(stamps) if 2 * int((s <= floor).sum()) >= len(s)]
    rest = sorted((i for i in range(len(runs)) if i not in chosen), key=lambda i: runs[i].entries)
    if len(rest) > TOMBSTONE_RUNS:
        take, total = [], 0
        for i in rest:
            if total + runs[i].entries > cap and len(take) >= 2:
                break
            take.append(i)
            total += runs[i].entries
        if total <= cap or len(rest) > 4 * TOMBSTONE_RUNS:
            chosen += take
    return sorted(chosen)
