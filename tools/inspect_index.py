"""Inspect an index file section by section, as format-spec/FORMAT.md lays it out.

Run:  python tools/inspect_index.py FILE [--blocks N]

It reads the file with plain ``lmdb`` (read-only) and
``ndindex.codec_reference`` (the block decoder written from the spec), not
with ndindex.Index, so that anything it needs to know and the spec does not
say shows up as a gap in the spec.  Every check cites the spec statement;
the first failure stops it with exit status 1.  (LMDB's own pages are
checked by ``ndindex verify``, format-spec/lmdb.md; this tool trusts LMDB to
read the file and checks ndindex's records.)
"""

from __future__ import annotations

import argparse
import os
import struct
import sys

import lmdb
import zstandard

from ndindex import codec_reference as ref
from ndindex.errors import CorruptionError

CODINGS = {0: "xor", 1: "delta", 2: "delta+restarts"}
KINDS = {1: "huffman", 2: "raw", 3: "records", 4: "tombstones"}
SPACES = {0xF0: "tombstones", 0xF1: "keys-by-fingerprint", 0xF2: "fingerprints-by-key",
          0xF3: "documents", 0xF4: "lookup-keys"}


def fail(why: str) -> None:
    raise SystemExit(f"inspect: {why}")


def framed(key: bytes, value: bytes, what: str) -> bytes:
    """[F2]: payload + CRC-32C of the key and the payload."""
    payload, crc = value[:-4], struct.unpack("<I", value[-4:])[0]
    if ref.crc32c(key + payload) != crc:
        fail(f"{what}: checksum mismatch [F2]")
    return payload


def parse_manifest(m: bytes) -> tuple:
    """7.5: (generation, next_run_id, runs); each run a dict."""
    generation, next_id, n = struct.unpack_from("<QII", m)
    pos, runs = 16, []
    for _ in range(n):
        space, kind, level, flags, run_id, entries, chunks, merge_into, first, last = \
            struct.unpack_from("<BBBBIQIIQQ", m, pos)
        pos += 40
        value_bytes, clen = struct.unpack_from("<QH", m, pos)
        pos += 10
        cursor = m[pos:pos + clen]
        pos += clen
        (flen,) = struct.unpack_from("<H", m, pos)
        pos += 2 + flen
        code_len = m[pos]
        code = m[pos + 1:pos + 1 + code_len]
        pos += 1 + code_len
        if kind not in KINDS or flags & ~3 or flags == 3 or run_id == 0 or run_id >= next_id \
                or code_len != (66 if kind == 1 else 0):
            fail(f"manifest: run {run_id} impossible [M1]")
        runs.append(dict(space=space, kind=kind, level=level, flags=flags, run_id=run_id,
                         entries=entries, chunks=chunks, first=first, last=last, cursor=cursor,
                         code=code))
    if pos != len(m):
        fail("manifest has trailing bytes [M1]")
    return generation, next_id, runs


def fp_chunk(key: bytes, value: bytes, run: dict, low_expected):
    """7.7: check a fingerprint chunk; return (block keys, blocks, flags, low fence)."""
    crc, kind, flags, n, run_id, reserved, low, entries = struct.unpack_from("<IBBHIIQQ", value)
    head = 32 + 8 * n
    if ref.crc32c(key + value[4:head]) != crc:
        fail(f"chunk {key.hex()}: header checksum mismatch [F12]")
    if kind != run["kind"] or run_id != run["run_id"] or reserved or flags & ~3 or \
            not 1 <= n <= 63 or len(value) != head + 1024 * n:
        fail(f"chunk {key.hex()}: header fields impossible [F12]")
    bkeys = struct.unpack_from(f"<{n}Q", value, 32)
    if list(bkeys) != sorted(set(bkeys)) or bkeys[-1] != struct.unpack(">Q", key[5:])[0]:
        fail(f"chunk {key.hex()}: block keys [F12]")
    if low_expected is not None and low != low_expected:
        fail(f"chunk {key.hex()}: fence {low} is not the previous chunk's last [F13]")
    blocks = [value[head + 1024 * j:head + 1024 * (j + 1)] for j in range(n)]
    return bkeys, blocks, flags, low


#: The header's read version (packed raw blocks need 4, [B15]).
READ_VERSION = 0


def decode_raw(block: bytes) -> list:
    """5.3: a raw block, plain or packed."""
    try:
        values = ref.decode_raw_block(block)
    except CorruptionError as exc:
        fail(f"raw block invalid [B10]/[B15]: {exc}")
    if block[6] and READ_VERSION < 4:
        fail(f"a packed raw block in a file of read version {READ_VERSION} [B15]")
    return values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--blocks", type=int, default=1, help="blocks per run to decode and print")
    args = ap.parse_args(argv)
    env = lmdb.open(os.fsencode(args.file), subdir=False, readonly=True, lock=False, max_dbs=8)
    try:
        dbs = {n: env.open_db(n.encode(), create=False) for n in ("meta", "log", "chunks")}
    except lmdb.NotFoundError:
        fail("not a format-2 index: a named database is missing [F1]")
    with env.begin() as txn:
        meta = dbs["meta"]
        h = framed(b"header", txn.get(b"header", db=meta), "header")
        magic, rv, wv, f, k, t, coding, expected_n, file_id = struct.unpack("<8sHHBBBBQ16s", h)
        print("== 7.2 header")
        print(f"magic {magic!r} read_version {rv} write_version {wv} f {f} k {k} t {t} "
              f"coding {CODINGS.get(coding, coding)} expected_n {expected_n} file_id {file_id.hex()}")
        if magic != b"ndindex\0" or f != 64 or coding > 2 or len(h) != 40 or \
                rv < (3 if coding == 2 else 2):
            fail("header invalid [F4]-[F6]")
        if rv > 5:
            fail(f"read version {rv}: newer than this inspector's 5 [V1]")
        global READ_VERSION
        READ_VERSION = rv
        plan = framed(b"plan", txn.get(b"plan", db=meta), "plan")
        print("== 6 plan")
        print(f"f {plan[0]} k {plan[1]} tables {plan[2]} flags {plan[3]:#04x}"
              + (" (probabilistic)" if plan[3] & 1 else ""))
        if plan[2] != t:
            fail("header and plan disagree on t [F6]")
        if plan[3] & 0xFE or (plan[3] & 1 and plan[2] != 1):
            fail("plan flags: a reserved bit, or a probabilistic plan of t != 1 [P5] [P13]")
        for i in range(plan[2]):
            entry = plan[4 + 65 * i:4 + 65 * (i + 1)]
            print(f"  table {i}: p={entry[0]} bits, MSB-first source bits {list(entry[1:9])}...")
        state = struct.unpack("<7Q", framed(b"state", txn.get(b"state", db=meta), "state"))
        st = dict(zip(["txnid", "log_first_seq", "log_next_seq", "log_ops", "manifest_generation",
                       "journal_id", "journal_offset"], state))
        print("== 7.4 state")
        print(st)
        if st["txnid"] != txn.id():
            fail(f"state written by transaction {st['txnid']}, read in {txn.id()} [F9]")
        generation, next_id, runs = parse_manifest(
            framed(b"manifest", txn.get(b"manifest", db=meta), "manifest"))
        print(f"== 7.5 manifest: generation {generation}, next run id {next_id}, {len(runs)} runs")
        if generation != st["manifest_generation"]:
            fail("manifest generation differs from the state's [M1]")
        tombstone_runs = sum(1 for r in runs if r["space"] == 0xF0)
        if tombstone_runs > (64 if rv >= 5 else 1):
            fail(f"{tombstone_runs} tombstone runs in a file of read version {rv} [M3]")
        # 7.6 the log
        ops = 0
        cur = txn.cursor(db=dbs["log"])
        seqs = []
        for key, value in cur:
            payload = framed(key, value, f"log record {key.hex()}")
            na, nr, npu, nd, nrec = struct.unpack_from("<IIIII", payload)
            ops += na + nr + npu + nd + nrec
            seqs.append(struct.unpack(">Q", key)[0])
        if seqs != list(range(st["log_first_seq"], st["log_next_seq"])):
            fail("log records are not exactly log_first_seq..log_next_seq-1 [F7]")
        print(f"== 7.6 log: {len(seqs)} records, {ops} operations")
        if ops != st["log_ops"]:
            fail("log operations differ from the state's [F7]")
        # 7.7-7.9 every run's chunks
        print("== 7.7-7.9 runs")
        for run in runs:
            prefix = bytes([run["space"]]) + run["run_id"].to_bytes(4, "big")
            name = SPACES.get(run["space"], f"table {run['space']}")
            cur = txn.cursor(db=dbs["chunks"])
            found = cur.set_range(prefix)
            chunks, low, shown = 0, None, 0
            records = 0
            while found and cur.key()[:5] == prefix:
                key, value = bytes(cur.key()), bytes(cur.value())
                chunks += 1
                if run["kind"] in (1, 2):
                    bkeys, blocks, flags, lo = fp_chunk(key, value, run, low)
                    for j, block in enumerate(blocks[:max(0, args.blocks - shown)]):
                        vals = ref.decode_block(block, run["code"]) if run["kind"] == 1 \
                            else decode_raw(block)
                        if vals[-1] != bkeys[j]:
                            fail(f"{name}: block key differs from its last value [F14]")
                        print(f"  {name} run {run['run_id']} block {shown}: {len(vals)} values "
                              f"{vals[0]:#018x} .. {vals[-1]:#018x}")
                        shown += 1
                    low = bkeys[-1]
                elif run["kind"] == 4:
                    crc, kind, flags, n, rid, res, lo, entries = struct.unpack_from("<IBBHIIQQ", value)
                    if ref.crc32c(key + value[4:]) != crc or kind != 4 or n or res or \
                            len(value) != 32 + 12 * entries:
                        fail(f"tombstone chunk {key.hex()} invalid [F15]")
                    records += entries
                else:
                    crc, kind, flags, nb, rid, nrec, dir_bytes, fence_len, filter_bytes = \
                        struct.unpack_from("<IBBHIIIHH", value)
                    end = 24 + fence_len + dir_bytes + filter_bytes
                    if ref.crc32c(key + value[4:end]) != crc or kind != 3:
                        fail(f"record chunk {key.hex()} invalid [F16]")
                    off, clen, rlen, bcrc, flen = struct.unpack_from("<IIIIH", value, 24 + fence_len)
                    comp = value[off:off + clen]
                    if ref.crc32c(comp) != bcrc or clen > rlen:
                        fail(f"record chunk {key.hex()}: sub-block checksum [F16]")
                    raw = comp if clen == rlen else \
                        zstandard.ZstdDecompressor().decompress(comp, max_output_size=rlen)
                    klen, flag, vlen = struct.unpack_from("<HBI", raw)
                    if shown < args.blocks:
                        print(f"  {name} run {run['run_id']}: first record {raw[7:7 + klen]!r} "
                              f"{'put' if flag == 0 else 'delete'}")
                        shown += 1
                    records += nrec
                found = cur.next()
            cur.close()
            extra = f", {records} entries" if run["kind"] in (3, 4) else ""
            print(f"  {name} run {run['run_id']}: {KINDS[run['kind']]}, level {run['level']}, "
                  f"{run['entries']} entries in the manifest, {chunks} chunks{extra}"
                  + (f", merging (cursor {run['cursor'].hex()})" if run["flags"] else ""))
            if not run["flags"] and chunks != run["chunks"]:
                fail(f"{name} run {run['run_id']}: {chunks} chunks, manifest says {run['chunks']}")
        journals = [key for key, _ in txn.cursor(db=meta) if bytes(key).startswith(b"journal:")]
        print(f"== 7.10 journal positions: {len(journals)}")
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
