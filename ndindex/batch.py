"""Batch joins: every pair of a query set Q and stored fingerprints F within k.

This is the batch mode of Manku, Jain and Das Sarma (WWW 2007, §3.3).  The
t permuted tables are built over Q, in memory (:class:`QueryTables`); F is
scanned sequentially, chunk by chunk, and every F entry is probed against
every table in one C call per chunk (``_core.batch_probe``).  F never has to
fit in memory: chunks are independent, so they spread over worker processes
on one machine or over a Dask cluster, and Q is shipped once per worker.

Each pair is reported once even when several tables find it, without a
global sort: table j reports (q, f) only if j is the *first* table whose
prefix q and f share.  In unpermuted bit positions a table's prefix is a
64-bit mask M, and q, f share it exactly when (q ^ f) & M == 0, so the test
costs one AND per earlier table, and only for pairs within k (rare).

Pairs come as numpy structured arrays of ``PAIR_DTYPE``: ``q`` (the query
fingerprint), ``f`` (the stored fingerprint), ``distance`` (uint8), one
array per chunk of F, sorted by (q, f) within it.  Q is a set: duplicate
queries collapse.  F is a stream: an index holds distinct fingerprints, but
a fingerprint that occurs twice in F (in two sources, or twice in a
fingerprint file) yields its pairs twice.

Sources of F (and of Q): a uint64 array, an :class:`ndindex.Index` or the
path of one, or the path of a fingerprint file (``ndindex.fpfile``).  Worker
processes and Dask workers open index and fingerprint files by path, so on a
cluster the paths must be readable from every worker.
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import math
import os
import pickle

import numpy as np

from ndindex import _core, fpfile, plan as plans, procs
from ndindex.arrays import sorted_unique
from ndindex.errors import result_of
from ndindex.index import Index
from ndindex.validate import fingerprints as _as_fingerprints

__all__ = ["PAIR_DTYPE", "DEFAULT_CHUNK_SIZE", "QueryTables", "join", "self_join", "join_to_files"]

PAIR_DTYPE = fpfile.PAIR_DTYPE
#: Fingerprints of F per task: big enough to amortise a task's start
#: (about a millisecond) and a chunk's pass over each table, small enough
#: that a worker's chunk and pairs stay a few tens of MB.
DEFAULT_CHUNK_SIZE = 1 << 20
#: A table's bucket directory has at most 2^b + 1 offsets, b <= this (64 MiB).
MAX_DIR_BITS = 24
#: The kernel sorts each chunk of F on the top SORT_BITS bits of a table's
#: permutation before probing it (two radix passes).
SORT_BITS = 16
#: Tasks in flight per worker: enough to keep workers busy, few enough that
#: the pairs waiting to be consumed stay bounded.
TASKS_IN_FLIGHT_PER_WORKER = 2


class QueryTables:
    """The t permuted, sorted tables of a query set, with bucket directories.

    Table i holds apply_i(Q) sorted, and a directory of 2^b + 1 offsets over
    the top b bits (b = min(p_i, ceil(log2 |Q|)), at most MAX_DIR_BITS), so a
    probe is one directory read and a scan of about |Q| / 2^p entries: no
    binary search.  Parameters: queries, any uint64 array (duplicates
    collapse); k, 0..plan.MAX_PLANNER_K (12); plan, a Plan with plan.k >= k (default
    ``plan.choose_plan(len(Q), k)``).  Pickles as Q, k and the plan; the
    tables are rebuilt where it is unpickled.  Memory: 12 bytes per query
    per table plus the directories.  Cost: t sorts of Q.
    """

    def __init__(self, queries, k: int, plan: plans.Plan | None = None):
        self.values = sorted_unique(_as_fingerprints(queries))
        self.k = plans.check_k(k)
        if plan is None:
            plan = plans.choose_plan(max(len(self.values), 1), self.k)
        elif plan.k < self.k:
            raise ValueError(f"plan covers k={plan.k}, below k={self.k}")
        self.plan = plan
        self.sort_bits = SORT_BITS
        self._build()

    def _build(self) -> None:
        n = len(self.values)
        dir_bits = min(MAX_DIR_BITS, max(0, math.ceil(math.log2(n))) if n else 0)
        spec = []
        self._arrays = []
        for design in self.plan.tables:
            vals = np.sort(design.apply(self.values))
            b = min(design.prefix_bits, dir_bits)
            top = (vals >> np.uint64(64 - b)).astype(np.int64) if b else np.zeros(n, np.int64)
            directory = np.zeros((1 << b) + 1, dtype=np.uint32)
            np.cumsum(np.bincount(top, minlength=1 << b), out=directory[1:])
            mask = sum(1 << bit for bit in design.permutation[:design.prefix_bits])
            inverse = tuple((dst, src, length) for src, dst, length in design.runs())
            spec.append((design.prefix_bits, b, design.runs(), inverse, mask, vals, directory))
            self._arrays.append((vals, directory))
        self._capsule = _core.make_batch_tables(spec)

    def __len__(self) -> int:
        return len(self.values)

    def __getstate__(self):
        return dict(values=self.values, k=self.k, plan=self.plan.to_bytes())

    def __setstate__(self, state):
        self.values, self.k = state["values"], state["k"]
        self.plan = plans.Plan.from_bytes(state["plan"])
        self.sort_bits = SORT_BITS
        self._build()

    def probe(self, fingerprints, *, self_join: bool = False, k: int | None = None) -> np.ndarray:
        """Return every pair (q, f, distance <= k) of Q and the given fingerprints, once.

        fingerprints: a uint64 array (a chunk of F, sorted or not).  With
        self_join, only pairs with q < f.  Returns a PAIR_DTYPE array sorted
        by (q, f).  Releases the GIL.  Cost: per fingerprint, t directory
        reads and about t * |Q| / 2^p popcounts.
        """
        k = self.k if k is None else k
        if not 0 <= k <= self.k:
            raise ValueError(f"k={k} is outside 0..{self.k}, the tables' k")
        fps = _as_fingerprints(fingerprints)
        q, f, d = _core.batch_probe(self._capsule, fps, k, self_join, self.sort_bits)
        out = np.empty(len(d), dtype=PAIR_DTYPE)
        out["q"] = np.frombuffer(q, dtype=np.uint64)
        out["f"] = np.frombuffer(f, dtype=np.uint64)
        out["distance"] = np.frombuffer(d, dtype=np.uint8)
        return out[np.lexsort((out["f"], out["q"]))] if len(out) > 1 else out


# -- sources and tasks ----------------------------------------------------------


def _query_values(queries) -> np.ndarray:
    """Q as a uint64 array from an array, an Index, or the path of an index or fingerprint file."""
    if isinstance(queries, Index):
        return queries.fingerprints()
    if isinstance(queries, (str, os.PathLike)):
        if fpfile.is_fpfile(queries):
            return fpfile.read_fingerprints(queries)
        with Index.open(queries, readonly=True) as ix:
            return ix.fingerprints()
    return _as_fingerprints(queries)


def _tasks(stored, chunk_size: int, opened: dict) -> list[tuple]:
    """Split the sources of F into independent tasks (cheap: reads no fingerprint).

    Index objects given by the caller are recorded in opened (path -> Index):
    LMDB refuses to open one file twice in a process, so tasks run in this
    process read through the caller's object.
    """
    if isinstance(stored, (list, tuple)) and not (stored and isinstance(stored[0], (int, np.integer))):
        sources = list(stored)
    else:
        sources = [stored]
    tasks = []
    for src in sources:
        if isinstance(src, Index):
            opened[os.path.abspath(src.path)] = src
            src = src.path
        if isinstance(src, (str, os.PathLike)):
            path = os.path.abspath(os.fsdecode(src))
            if not os.path.exists(path):
                raise FileNotFoundError(errno.ENOENT, "no such index or fingerprint file", path)
            if fpfile.is_fpfile(path):
                with fpfile.FingerprintReader(path) as r:
                    if r.kind != fpfile.KIND_FINGERPRINTS:
                        raise ValueError(f"{path} holds pairs, not fingerprints")
                    tasks += [("fpfile", path, i) for i in range(r.n_chunks)]
            else:
                if path in opened:
                    n = opened[path]._size_bound()
                else:
                    with Index.open(path, readonly=True) as ix:
                        n = ix._size_bound()
                parts = max(1, -(-n // chunk_size))
                tasks += [("index", path, p, parts, chunk_size) for p in range(parts)]
        else:
            fps = _as_fingerprints(src)
            tasks += [("array", fps[a:a + chunk_size]) for a in range(0, len(fps), chunk_size)]
    return tasks


_OPEN_INDEXES: dict = {}


def _task_chunks(task, indexes: dict):
    """Yield the uint64 arrays of F that one task covers; indexes caches open Index objects."""
    kind = task[0]
    if kind == "array":
        yield task[1]
    elif kind == "fpfile":
        with fpfile.FingerprintReader(task[1]) as r:
            chunk = r.chunk(task[2])
            yield chunk[0] if r.has_keys else chunk
    else:
        _, path, part, parts, chunk_size = task
        ix = indexes.get(path)
        if ix is None:
            ix = indexes[path] = Index.open(path, readonly=True)
        yield from ix.iter_chunks(chunk_size, part=part, parts=parts)


def _run_task(tables: QueryTables, task, self_join: bool, k: int, out_path=None, indexes=None):
    """Probe every fingerprint of a task; return its pairs, or write them and return the path."""
    indexes = _OPEN_INDEXES if indexes is None else indexes
    parts = [tables.probe(chunk, self_join=self_join, k=k) for chunk in _task_chunks(task, indexes)]
    pairs = np.concatenate(parts) if parts else np.empty(0, PAIR_DTYPE)
    if out_path is None:
        return pairs
    fpfile.write_pairs(out_path, pairs)
    return out_path


# -- local worker processes ---------------------------------------------------------

_WORKER_TABLES: QueryTables | None = None


def _init_worker(tables_blob: bytes) -> None:
    global _WORKER_TABLES
    _WORKER_TABLES = pickle.loads(tables_blob)


def _worker_task(task, self_join: bool, k: int, out_path):
    return _run_task(_WORKER_TABLES, task, self_join, k, out_path)


def _run_local(tables, tasks, self_join, k, out_paths, workers, opened):
    """Yield each task's result in task order, from a pool of worker processes."""
    if workers <= 1 or len(tasks) <= 1:
        indexes = dict(opened)
        try:
            for task, out in zip(tasks, out_paths):
                yield _run_task(tables, task, self_join, k, out, indexes)
        finally:
            for path, ix in indexes.items():
                if path not in opened:
                    ix.close()
        return
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=procs.context(),  # not fork: see procs
        initializer=_init_worker, initargs=(pickle.dumps(tables),))
    try:
        yield from _ordered(lambda task, out: procs.PoolTask(pool, _worker_task, task, self_join,
                                                             k, out),
                            tasks, out_paths, workers)
    finally:
        procs.shutdown(pool)


def _ordered(submit, tasks, out_paths, workers):
    """Submit tasks with a bounded window; yield results in task order."""
    window = collections.deque()
    for task, out in zip(tasks, out_paths):
        window.append(submit(task, out))
        if len(window) >= TASKS_IN_FLIGHT_PER_WORKER * workers:
            yield result_of(window.popleft())
    while window:
        yield result_of(window.popleft())


# -- Dask ------------------------------------------------------------------------------


def _dask_task(tables: QueryTables, task, self_join: bool, k: int, out_path):
    return _run_task(tables, task, self_join, k, out_path)


def _run_dask(tables, tasks, self_join, k, out_paths, client, scheduler):
    """Yield each task's result in task order, from a Dask cluster."""
    try:
        import distributed
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("Dask execution needs the dask extra: pip install 'ndindex[dask]'") from exc
    own = client is None
    if own:
        client = distributed.Client(scheduler)
    try:
        # One copy of Q per worker, not one per task; each worker rebuilds
        # the tables once when it unpickles its copy.
        tables_future = client.scatter(tables, broadcast=True, hash=False)
        workers = max(1, sum(client.nthreads().values()))
        yield from _ordered(lambda task, out: client.submit(_dask_task, tables_future, task, self_join,
                                                            k, out, pure=False),
                            tasks, out_paths, workers)
    finally:
        if own:
            client.close()


# -- the public calls --------------------------------------------------------------------


def _execute(tables, tasks, self_join, k, out_paths, opened, workers, client, scheduler):
    if client is not None or scheduler is not None:
        return _run_dask(tables, tasks, self_join, k, out_paths, client, scheduler)
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    return _run_local(tables, tasks, self_join, k, out_paths, workers, opened)


def join(queries, stored, k: int, *, plan: plans.Plan | None = None,
         chunk_size: int = DEFAULT_CHUNK_SIZE, workers: int | None = None,
         client=None, scheduler: str | None = None):
    """Yield every pair of a query and a stored fingerprint within distance k.

    Parameters: queries, the set Q (a uint64 array, an Index, or the path of
    an index or fingerprint file); stored, F: one source or a list of them
    (uint64 arrays, Index objects, paths of indexes or fingerprint files);
    k, 0..plan.MAX_PLANNER_K (12); plan, the table design over Q (default
    ``plan.choose_plan(len(Q), k)``); chunk_size, fingerprints of F per
    task (a fingerprint file keeps its own chunks); workers, local worker
    processes (default: one per core; 1 runs in this process); client, a
    ``distributed.Client``, or scheduler, a Dask scheduler address, to run
    on Dask instead (results identical to the local run).
    Yields PAIR_DTYPE arrays, one per task, in task order, each sorted by
    (q, f).  Memory: Q's tables plus a bounded number of chunks in flight,
    whatever the size of F.  Raises ValueError/TypeError for bad arguments,
    FormatError/CorruptionError for unreadable sources.
    """
    tables = QueryTables(_query_values(queries), k, plan)
    opened = {}
    tasks = _tasks(stored, _check_chunk_size(chunk_size), opened)
    return _execute(tables, tasks, False, tables.k, [None] * len(tasks), opened, workers, client,
                    scheduler)


def self_join(source, k: int, **options):
    """Yield every near-duplicate pair inside one source, each unordered pair once.

    source: a uint64 array, an Index, or the path of an index or fingerprint
    file; Q and F are both its fingerprints.  Pairs have q < f, never
    (x, x).  Options as for join().  Memory: the source's tables (12 bytes
    per fingerprint per table) plus the chunks in flight.
    """
    plan = options.pop("plan", None)
    chunk_size = _check_chunk_size(options.pop("chunk_size", DEFAULT_CHUNK_SIZE))
    values = _query_values(source)
    tables = QueryTables(values, k, plan)
    opened = {}
    tasks = _tasks(source if isinstance(source, (str, os.PathLike, Index)) else tables.values,
                   chunk_size, opened)
    return _execute(tables, tasks, True, tables.k, [None] * len(tasks), opened,
                    **_exec_options(options))


def join_to_files(queries, stored, k: int, out_dir, *, self_join: bool = False, **options) -> list[str]:
    """Run join() (or self_join() when self_join=True) writing each task's pairs to a pair file.

    Each worker writes ``out_dir/pairs-NNNNNN.ndfp`` for its task, so pairs
    never travel back to the caller (on Dask, out_dir must be a shared
    path).  Read them with ``ndindex.fpfile.read_pairs(paths)``.  Returns the
    paths in task order.  Raises FileExistsError if out_dir holds a pair file
    of the same name.  Options as for join().
    """
    plan = options.pop("plan", None)
    chunk_size = _check_chunk_size(options.pop("chunk_size", DEFAULT_CHUNK_SIZE))
    out_dir = os.path.abspath(os.fsdecode(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    tables = QueryTables(_query_values(queries), k, plan)
    if self_join and not isinstance(stored, (str, os.PathLike, Index)):
        stored = tables.values
    opened = {}
    tasks = _tasks(stored, chunk_size, opened)
    paths = [os.path.join(out_dir, f"pairs-{i:06d}.ndfp") for i in range(len(tasks))]
    return list(_execute(tables, tasks, self_join, tables.k, paths, opened,
                         **_exec_options(options)))


def _exec_options(options: dict) -> dict:
    out = {name: options.pop(name, None) for name in ("workers", "client", "scheduler")}
    if options:
        raise TypeError(f"unexpected options: {', '.join(sorted(options))}")
    return out


def _check_chunk_size(chunk_size) -> int:
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return int(chunk_size)
