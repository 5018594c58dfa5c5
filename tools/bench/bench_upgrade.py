"""Benchmark ``ndindex upgrade``: a format-1 file of N fingerprints converted to format 2.

Run:  python tools/bench/bench_upgrade.py [--sizes 1000000] [--keys-every 1] [--dir DIR]

For each N: writes a format-1 file (every fingerprint compacted into the
tables, one text key per --keys-every fingerprints) with a minimal format-1
writer restated from the frozen spec (FORMAT.md at 9521845, section 7);
then times ``upgrade(src, out)`` by phase (read and check the source,
write the new index, verify and compare it) and, as the peer in the same
run, a fresh format-2 build of the same fingerprints and keys through the
same public calls (Index.create, add in the same batches, compact(full)).
The ratio upgrade / fresh build is the cost of reading and checking the old
file and of checking the new one; file sizes are reported beside it.

The writer here is not the format-1 library; a file it wrote (N = 100,000)
was opened, verify()-ed and read back by ndindex at 9521845 unchanged.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import time

import lmdb
import numpy as np

from ndindex import _core, codec, plan as plans
from ndindex.index import Index
from ndindex.upgrade import ADD_BATCH_FINGERPRINTS, upgrade

SEGMENT_MAX_BLOCKS = 63


def _frame(payload: bytes) -> bytes:
    return payload + struct.pack("<I", _core.crc32c(payload))


def write_v1(path: str, fps: np.ndarray, keys: list, k: int = 3) -> None:
    """Write a format-1 index holding sorted distinct fps, keys[i] (str or None) for fps[i]."""
    n = len(fps)
    plan = plans.choose_plan(n, k)
    env = lmdb.open(path, subdir=False, max_dbs=8, map_size=1 << 40, lock=False,
                    writemap=False, sync=False)
    with env.begin(write=True) as txn:
        dbs = {name: env.open_db(name.encode(), txn=txn, dupsort=name in ("docs", "keys"))
               for name in ("meta", "segments", "log", "docs", "keys", "removed")}
        txn.put(b"header", _frame(struct.pack("<8sHHBBBBQ", b"ndindex\0", 1, 1, 64, k,
                                              len(plan.tables), 0, n)), db=dbs["meta"])
        txn.put(b"plan", _frame(plan.to_bytes()), db=dbs["meta"])
        txn.put(b"state", _frame(struct.pack("<QQQQQQ", 1, 0, 0, n, n, 0)), db=dbs["meta"])
        for i, design in enumerate(plan.tables):
            values = np.sort(design.apply(fps))
            code = codec.HuffmanCode.from_values(values, codec.CODING_DELTA)
            txn.put(b"code:" + bytes([i]), _frame(code.to_bytes()), db=dbs["meta"])
            enc = codec.encode(values, code)
            blocks = enc.blocks.reshape(enc.n_blocks, codec.BLOCK_BYTES)
            n_seg = -(-enc.n_blocks // SEGMENT_MAX_BLOCKS)
            bounds = np.linspace(0, enc.n_blocks, n_seg + 1).round().astype(np.int64)
            for a, b in zip(bounds[:-1], bounds[1:]):
                header = bytearray(512)
                struct.pack_into("<HH", header, 4, b - a, 0)
                header[8:8 + 8 * (b - a)] = enc.keys[a:b].astype("<u8").tobytes()
                struct.pack_into("<I", header, 0, _core.crc32c(bytes(header[4:])))
                txn.put(bytes([i]) + struct.pack(">Q", int(enc.keys[b - 1])),
                        bytes(header) + blocks[a:b].tobytes(), db=dbs["segments"])
        for fp, key in zip(fps.tolist(), keys):
            if key is None:
                continue
            fp_key, raw = struct.pack(">Q", fp), b"\x01" + key.encode()
            txn.put(fp_key, struct.pack("<I", _core.crc32c(fp_key + raw)) + raw, db=dbs["docs"])
            txn.put(raw, fp_key + struct.pack("<I", _core.crc32c(raw + fp_key)), db=dbs["keys"])
    env.sync(True)
    env.close()


def fresh_build(path: str, fps: np.ndarray, keys: list) -> None:
    """The peer: the same data built as format 2 through the same public calls."""
    plan = plans.choose_plan(len(fps), 3)
    with Index.create(path, k=3, expected_n=len(fps), plan=plan,
                      background_compaction=False) as ix:
        for a in range(0, len(fps), ADD_BATCH_FINGERPRINTS):
            ix.add(fps[a:a + ADD_BATCH_FINGERPRINTS], keys=keys[a:a + ADD_BATCH_FINGERPRINTS])
        ix.compact(full=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--keys-every", type=int, default=1,
                    help="one key per this many fingerprints (0: no keys)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=here).stdout.strip()
    print(f"# bench_upgrade  {time.strftime('%Y-%m-%d')}  {platform.machine()}  "
          f"python {platform.python_version()}  commit {commit}  {os.cpu_count()} cores  "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'N':>10} {'keys':>10} {'v1 MB':>7} {'v2 MB':>7} {'fresh MB':>8} {'read s':>7} "
          f"{'write s':>7} {'check s':>7} {'total s':>7} {'fresh s':>7} {'ratio':>6}")
    scratch = args.dir or tempfile.mkdtemp(prefix="bench_upgrade.")
    try:
        for n in args.sizes:
            rng = np.random.default_rng(n)
            fps = np.unique(rng.integers(0, 2**64, n, dtype=np.uint64))
            keys = [f"https://example.org/doc/{i}" if args.keys_every and i % args.keys_every == 0
                    else None for i in range(len(fps))]
            src, out, fresh = (os.path.join(scratch, f"{name}-{n}.ndx")
                               for name in ("v1", "v2", "fresh"))
            for p in (src, out, fresh):
                for q in (p, p + "-lock"):
                    if os.path.exists(q):
                        os.unlink(q)
            write_v1(src, fps, keys)
            report = upgrade(src, out)
            t = time.perf_counter()
            fresh_build(fresh, fps, keys)
            fresh_s = time.perf_counter() - t
            s = report["seconds"]
            mb = lambda p: os.path.getsize(p) / 1e6  # noqa: E731
            print(f"{len(fps):>10,} {report['keys']:>10,} {mb(src):>7.1f} {mb(out):>7.1f} "
                  f"{mb(fresh):>8.1f} {s['read']:>7.2f} {s['write']:>7.2f} {s['check']:>7.2f} "
                  f"{s['total']:>7.2f} {fresh_s:>7.2f} {s['total'] / fresh_s:>6.2f}", flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
