"""Inspect an index file section by section, as format-spec/FORMAT.md lays it out.

Run:  python tools/inspect_index.py FILE [--blocks N]

It reads the file with plain ``lmdb`` and ``ndindex.codec_reference`` (the
decoder written from the spec), not with ndindex.Index, so that anything it
needs to know and the spec does not say shows up as a gap in the spec.
Every check it makes cites the spec statement; the first failure stops it
with exit status 1.
"""

from __future__ import annotations

import argparse
import struct
import sys

import lmdb

from ndindex import codec_reference as ref


def framed(value: bytes, what: str) -> bytes:
    """[F2]: payload + CRC-32C."""
    payload, crc = value[:-4], struct.unpack("<I", value[-4:])[0]
    if ref.crc32c(payload) != crc:
        raise SystemExit(f"{what}: checksum mismatch [F2]")
    return payload


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--blocks", type=int, default=1, help="blocks per table to decode and print")
    args = ap.parse_args(argv)
    env = lmdb.open(args.file, subdir=False, readonly=True, lock=False, max_dbs=8)
    names = [b"meta", b"segments", b"log", b"docs", b"keys", b"removed"]
    dbs = {n: env.open_db(n, create=False, dupsort=n in (b"docs", b"keys")) for n in names}
    with env.begin() as txn:
        # 7.2 header
        h = framed(txn.get(b"header", db=dbs[b"meta"]), "header")
        magic, rv, wv, f, k, t, reserved, expected_n = struct.unpack("<8sHHBBBBQ", h)
        print("== 7.2 header")
        print(f"magic {magic!r} read_version {rv} write_version {wv} f {f} k {k} t {t} "
              f"expected_n {expected_n}")
        if magic != b"ndindex\0" or f != 64 or reserved:
            raise SystemExit("header invalid [F4][F6]")
        # 6 plan
        plan = framed(txn.get(b"plan", db=dbs[b"meta"]), "plan")
        print("== 6 plan")
        print(f"f {plan[0]} k {plan[1]} tables {plan[2]}")
        perms = []
        for i in range(plan[2]):
            entry = plan[4 + 65 * i:4 + 65 * (i + 1)]
            perms.append((entry[0], list(entry[1:])))
            print(f"  table {i}: p={entry[0]} bits, MSB-first source bits {list(entry[1:9])}...")
        # 7.3 state and codes
        state = struct.unpack("<6Q", framed(txn.get(b"state", db=dbs[b"meta"]), "state"))
        print("== 7.3 state")
        print(dict(zip(["tables_generation", "log_next_seq", "removed_generation", "table_entries",
                        "code_n", "log_entries"], state)))
        codes = [framed(txn.get(b"code:" + bytes([i]), db=dbs[b"meta"]), f"code {i}")
                 for i in range(t)]
        print("== 4.1 codes: " + ", ".join(f"table {i} {'delta' if c[0] else 'xor'}"
                                            for i, c in enumerate(codes)))
        # 7.4 segments
        print("== 7.4 segments")
        cur = txn.cursor(db=dbs[b"segments"])
        per_table = {}
        for key, value in cur:
            table, last = key[0], struct.unpack(">Q", key[1:9])[0]
            crc, n, res = struct.unpack_from("<IHH", value)
            if ref.crc32c(value[4:512]) != crc or res or len(value) != 512 + 1024 * n:
                raise SystemExit(f"segment {key.hex()}: bad header [F7]")
            bkeys = struct.unpack_from(f"<{n}Q", value, 8)
            if bkeys[-1] != last:
                raise SystemExit(f"segment {key.hex()}: last key differs [F7]")
            seen = per_table.setdefault(table, [0, 0])
            for j in range(n):
                if seen[1] < args.blocks:
                    block = value[512 + 1024 * j:512 + 1024 * (j + 1)]
                    vals = ref.decode_block(block, codes[table])
                    if vals[-1] != bkeys[j]:
                        raise SystemExit(f"table {table}: block key differs from last value [B9]")
                    print(f"  table {table} block {seen[1]}: {len(vals)} values "
                          f"{vals[0]:#018x} .. {vals[-1]:#018x}")
                seen[1] += 1
            seen[0] += 1
        for table, (segs, blocks) in sorted(per_table.items()):
            print(f"  table {table}: {segs} segments, {blocks} blocks")
        # 7.5 log, 7.6 documents, tombstones
        log = sum(struct.unpack_from("<I", framed(v, "log"))[0] for _, v in txn.cursor(db=dbs[b"log"]))
        docs = txn.stat(dbs[b"docs"])["entries"]
        removed = txn.stat(dbs[b"removed"])["entries"]
        print(f"== 7.5 log: {log} fingerprints;  7.6 docs: {docs} keys;  tombstones: {removed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
