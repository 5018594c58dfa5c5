"""Benchmark opening an index: open + first query, the memory it maps in, the CLI's wall time.

Run:  python tools/bench/bench_open.py [--sizes 1000000 10000000 30000000] [--dir DIR] [--out FILE]

For each N (k = 3, the fingerprints of ``bench_stream.py``), the files in
--dir (default /work/benchdata) are used as ``bench_stream.py`` left them:
``fresh-N.ndx`` (a one-call build: one run per table) and, when present,
``stream-N.ndx`` (grown by the stream, then churned: several runs per
table, tombstones).  A missing fresh file is built here (``Index.create``,
one ``add``, ``compact(full=True)``).

Each figure comes from a fresh process (``python bench_open.py --child``,
the package imported before the clock starts), repeated --repeat times;
the median is reported:

- warm: the file's pages are in the page cache (read through once before
  the series); cold: every process first drops them with
  ``posix_fadvise(POSIX_FADV_DONTNEED)``, so the open and the first query
  read from the disk what they touch.
- open: ``Index.open(path, readonly=True)``; first query: ``query(q, 3)``
  with q a stored fingerprint with one bit flipped (keys fetched, as a user
  gets them); then a second query for contrast.  The writable open
  (``Index.open(path)``: journals replayed, compaction thread started) is
  timed too.
- RSS: the process's resident set (``/proc/self/status`` VmRSS; RssFile is
  the part that is file pages) after the imports, and after the first
  query; it should grow by what the query read, not by the file size.
  Major page faults (``getrusage``) count the pages read from disk.
- logged-N.ndx, for the smallest N: a copy of the fresh file with
  compaction.FLUSH_RECORDS - 1 durable one-item commits after it (compaction
  off): the longest log of small records the flush policy leaves, which
  the first query reads whole.  Deleted afterwards.
- CLI: the wall time of ``ndindex query FILE 0x...`` (the console script of
  this environment, as a user runs it) on the 10M file, warm and cold,
  with ``python -X importtime`` for where the import time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

K = 3
SEED = 9  # bench_stream.py's: the same fingerprints
TARGETS = dict(open_ms=5.0, cli_ms=150.0)


def stream_fingerprints(n: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, 2**64, size=n, dtype=np.uint64)


def status_kb() -> dict:
    """VmRSS, RssAnon and RssFile of this process, in KB."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                out[name] = int(rest.split()[0])
    return out


def drop_cache(path: str) -> None:
    """Drop the file's pages from the page cache (clean pages; nothing maps it now)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: str) -> None:
    with open(path, "rb", buffering=0) as fh:
        while fh.read(1 << 20):
            pass


def child(path: str, fp: int, cold: bool, writable: bool) -> dict:
    """One measurement, in this (fresh) process; printed as JSON."""
    from ndindex.index import Index
    if cold:
        drop_cache(path)
    before = status_kb()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    ix = Index.open(path, readonly=not writable)
    t1 = time.perf_counter()
    found = ix.query(fp, K)
    t2 = time.perf_counter()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    after = status_kb()
    t = time.perf_counter()
    ix.query(fp ^ 0b110, K)
    second = time.perf_counter() - t
    ix.close()
    return dict(open_ms=(t1 - t0) * 1e3, first_ms=(t2 - t1) * 1e3, total_ms=(t2 - t0) * 1e3,
                second_ms=second * 1e3, found=len(found), rss_before_kb=before["VmRSS"],
                rss_after_kb=after["VmRSS"], rss_file_kb=after["RssFile"] - before["RssFile"],
                major_faults=ru1.ru_majflt - ru0.ru_majflt, minor_faults=ru1.ru_minflt - ru0.ru_minflt)


def measure(path: str, fp: int, cold: bool, writable: bool, repeat: int) -> dict:
    """The median of `repeat` fresh processes, each running child()."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path, str(fp),
                              "cold" if cold else "warm", "rw" if writable else "ro"],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def cli_wall(path: str, fp: int, cold: bool, repeat: int) -> dict:
    """Wall time of `ndindex query path fp` (the environment's console script)."""
    exe = shutil.which("ndindex", path=os.path.dirname(sys.executable)) or "ndindex"
    times = []
    for _ in range(repeat):
        if cold:
            drop_cache(path)
        t = time.perf_counter()
        out = subprocess.run([exe, "query", path, f"0x{fp:016x}"], capture_output=True, text=True)
        times.append((time.perf_counter() - t) * 1e3)
        if out.returncode not in (0, 1):
            raise RuntimeError(f"ndindex query failed: {out.stderr.strip()}")
    return dict(median_ms=float(np.median(times)), min_ms=float(min(times)), output=out.stdout)


def python_floor(repeat: int) -> dict:
    """Wall time of the interpreter alone, and with numpy: the floor under any command."""
    out = {}
    for name, code in (("python", "pass"), ("python + numpy", "import numpy"),
                       ("python + ndindex.index", "import ndindex.index"),
                       ("python + ndindex.cli", "import ndindex.cli")):
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append((time.perf_counter() - t) * 1e3)
        out[name] = float(np.median(times))
    return out


def import_profile(path: str, fp: int, top: int = 12) -> list[str]:
    """The modules with the largest cumulative import time of one ndindex query (-X importtime)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "ndindex", "query", path,
                          f"0x{fp:016x}"], capture_output=True, text=True)
    rows = []
    for line in out.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            rows.append((int(parts[1]), int(parts[0]), parts[2].strip()))
    total = sum(s for _, s, _ in rows)
    heavy = sorted(rows, reverse=True)[:top]
    return [f"imports total (self times summed) {total / 1000:.1f} ms; largest cumulative:"] + \
        [f"  {c / 1000:7.1f} ms  {name}" for c, s, name in heavy]


def build_fresh(n: int, path: str) -> None:
    from ndindex.index import Index
    with Index.create(path, k=K, expected_n=n) as ix:
        ix.add(stream_fingerprints(n))
        ix.compact(full=True)


def build_logged(fresh: str, path: str, n: int) -> None:
    """fresh, then FLUSH_RECORDS - 1 one-item durable commits, left in the log."""
    from ndindex import compaction
    from ndindex.index import Index
    shutil.copy(fresh, path)
    extra = np.random.default_rng(SEED + 1).integers(0, 2**64, compaction.FLUSH_RECORDS - 1,
                                                     dtype=np.uint64)
    with Index.open(path, background_compaction=False) as ix:
        for fp in extra.tolist():
            ix.add(fp)
        assert ix.stats()["log_records"] == len(extra)


def load_line() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        path, fp, temp, mode = argv[1:5]
        print(json.dumps(child(path, int(fp), temp == "cold", mode == "rw")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 30_000_000])
    ap.add_argument("--dir", default="/work/benchdata", help="where bench_stream.py left its files")
    ap.add_argument("--repeat", type=int, default=7, help="processes per figure (median)")
    ap.add_argument("--cli-size", type=int, default=10_000_000, help="the index ndindex query runs on")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=here).stdout.strip()
    lines = [f"# python tools/bench/bench_open.py {' '.join(argv)}".rstrip(),
             f"# bench_open  {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  "
             f"{platform.machine()}  python {platform.python_version()}  {os.cpu_count()} cores  "
             f"k={K}  repeat={args.repeat} (median)  load before {load_line()}"]
    print("\n".join(lines), flush=True)

    def emit(text=""):
        print(text, flush=True)
        lines.append(text)

    emit()
    emit(f"{'file':<24}{'MB':>7} {'cache':<5}{'open ms':>9}{'1st q ms':>9}{'total ms':>9}"
         f"{'2nd q ms':>9}{'RSS MB':>8}{'+RSS MB':>8}{'+file MB':>9}{'majflt':>7}{'rw open+q':>10}"
         f"  target total <= {TARGETS['open_ms']:.0f} ms")
    cli_file = None
    for n in args.sizes:
        fp = int(stream_fingerprints(n)[0]) ^ 1
        fresh = os.path.join(args.dir, f"fresh-{n}.ndx")
        if not os.path.exists(fresh):
            print(f"  building {fresh}", file=sys.stderr, flush=True)
            build_fresh(n, fresh)
        if n == args.cli_size:
            cli_file = (fresh, fp)
        logged = os.path.join(args.dir, f"logged-{n}.ndx")
        if n == min(args.sizes):
            build_logged(fresh, logged, n)
        for path in (fresh, os.path.join(args.dir, f"stream-{n}.ndx"), logged):
            if not os.path.exists(path):
                continue
            warm(path)
            for cold in (False, True):
                m = measure(path, fp, cold, False, args.repeat)
                rw = measure(path, fp, cold, True, args.repeat)
                ok = "PASS" if m["total_ms"] <= TARGETS["open_ms"] else "FAIL"
                emit(f"{os.path.basename(path):<24}{os.path.getsize(path) / 1e6:>7.0f} "
                     f"{'cold' if cold else 'warm':<5}{m['open_ms']:>9.2f}{m['first_ms']:>9.2f}"
                     f"{m['total_ms']:>9.2f}{m['second_ms']:>9.3f}{m['rss_after_kb'] / 1024:>8.1f}"
                     f"{(m['rss_after_kb'] - m['rss_before_kb']) / 1024:>8.2f}"
                     f"{m['rss_file_kb'] / 1024:>9.2f}{m['major_faults']:>7.0f}"
                     f"{rw['total_ms']:>10.2f}  {ok}")
        for p in (logged, logged + "-lock"):
            if os.path.exists(p):
                os.unlink(p)
    emit()
    if cli_file is not None:
        path, fp = cli_file
        # pip compiles a package's bytecode when it installs it; an editable
        # install under PYTHONDONTWRITEBYTECODE would compile every module
        # on every run instead (about 60 ms more here).
        import ndindex
        subprocess.run([sys.executable, "-m", "compileall", "-q",
                        os.path.dirname(ndindex.__file__)], check=False, capture_output=True)
        warm(path)
        for cold in (False, True):
            c = cli_wall(path, fp, cold, args.repeat)
            ok = "PASS" if c["median_ms"] <= TARGETS["cli_ms"] else "FAIL"
            emit(f"ndindex query {os.path.basename(path)} 0x{fp:016x} ({'cold' if cold else 'warm'}):"
                 f" {c['median_ms']:.0f} ms median, {c['min_ms']:.0f} ms best"
                 f"  (target <= {TARGETS['cli_ms']:.0f} ms)  {ok}")
        emit("  its output: " + c["output"].strip().replace("\n", " | "))
        floor = python_floor(args.repeat)
        emit("  floor (median wall ms of a process that only imports): "
             + ", ".join(f"{k} {v:.0f}" for k, v in floor.items()))
        for line in import_profile(path, fp):
            emit("  " + line)
    emit(f"# load after {load_line()}")
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
