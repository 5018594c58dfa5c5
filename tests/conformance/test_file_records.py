"""Conformance of the index file (FORMAT.md section 7) and of the inspector.

The reader here is written from the spec alone: struct layouts, CRC-32C
from the reference codec, zstd for record sub-blocks. It does not import
the library's record or chunk modules, so a change to the writer that the
spec does not describe fails here.
"""

import re
import struct
import subprocess
import sys
import pathlib

import lmdb
import numpy as np
import zstandard

from ndindex import codec_reference as ref
from ndindex.index import Index
from ndindex.plan import Plan

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = (ROOT / "format-spec" / "FORMAT.md").read_text()


def open_raw(path):
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=8)
    return env, {n: env.open_db(n, create=False) for n in (b"meta", b"log", b"chunks")}


def unframe(key: bytes, value: bytes) -> bytes:
    # [F2]: payload, then CRC-32C of the LMDB key followed by the payload.
    payload, (crc,) = value[:-4], struct.unpack("<I", value[-4:])
    assert ref.crc32c(key + payload) == crc, key
    return payload


def parse_manifest(payload: bytes):
    generation, next_run_id, n_runs = struct.unpack_from("<QII", payload)
    pos, runs = 16, []
    for _ in range(n_runs):
        (space, kind, level, flags, run_id, entries, chunks, merge_into, first, last,
         value_bytes) = struct.unpack_from("<BBBBIQIIQQQ", payload, pos)
        pos += 48
        (clen,) = struct.unpack_from("<H", payload, pos)
        cursor = payload[pos + 2:pos + 2 + clen]
        pos += 2 + clen
        (flen,) = struct.unpack_from("<H", payload, pos)
        pos += 2 + flen
        code = payload[pos + 1:pos + 1 + payload[pos]]
        pos += 1 + payload[pos]
        assert kind in (1, 2, 3, 4) and not flags & ~3 and flags != 3       # [M1]
        assert len(code) == (66 if kind == 1 else 0)                        # [M1]
        assert 1 <= run_id < next_run_id                                    # [M1]
        assert cursor == b"" or flags                                       # [M1]
        runs.append(dict(space=space, kind=kind, level=level, flags=flags, run_id=run_id,
                         entries=entries, chunks=chunks, first=first, last=last,
                         code=code, cursor=cursor))
    assert pos == len(payload)                                              # [M1]
    assert len({r["run_id"] for r in runs}) == len(runs)                    # [M1]
    return generation, next_run_id, runs


def read_fp_run(txn, db, run):
    """Values of a kind-1/2 run, chunk by chunk, checking [F12]-[F14]."""
    prefix = bytes([run["space"]]) + struct.pack(">I", run["run_id"])
    values, low, n_chunks = [], 0, 0
    cur = txn.cursor(db=db)
    ok = cur.set_range(prefix)
    while ok and cur.key().startswith(prefix):
        key, value = cur.key(), cur.value()
        assert len(key) == 13
        (crc, kind, flags, n, run_id, reserved, low_fence,
         entries) = struct.unpack_from("<IBBHIIQQ", value)
        assert len(value) == 32 + 1032 * n and 1 <= n <= 63                   # [F12]
        assert ref.crc32c(key + value[4:32 + 8 * n]) == crc                   # [F12]
        assert kind == run["kind"] and run_id == run["run_id"] and reserved == 0
        assert bool(flags & 1) == (n_chunks == 0)
        assert low_fence == low                                               # [F13]
        block_keys = struct.unpack_from(f"<{n}Q", value, 32)
        assert block_keys[-1] == struct.unpack(">Q", key[5:])[0]              # [F12]
        chunk_vals = []
        for j in range(n):
            block = value[32 + 8 * n + 1024 * j:32 + 8 * n + 1024 * (j + 1)]
            vals = ref.decode_block(block, run["code"]) if kind == 1 else ref.decode_raw_block(block)
            assert vals[-1] == block_keys[j]                                  # [F14]
            chunk_vals += vals
        assert len(chunk_vals) == entries                                     # [F14]
        values += chunk_vals
        low, n_chunks = block_keys[-1], n_chunks + 1
        last_flag = flags & 2
        ok = cur.next()
    assert n_chunks == run["chunks"] and last_flag                            # [F14]
    assert values == sorted(set(values)) and len(values) == run["entries"]     # [F14]
    return values


def read_tombstones(txn, db, run):
    prefix = bytes([0xF0]) + struct.pack(">I", run["run_id"])
    out = {}
    for key, value in txn.cursor(db=db).iternext():
        if not key.startswith(prefix):
            continue
        crc, kind, flags, n, run_id, reserved, low, entries = struct.unpack_from("<IBBHIIQQ", value)
        assert ref.crc32c(key + value[4:]) == crc and kind == 4 and n == 0  # 7.8
        assert len(value) == 32 + 12 * entries
        for i in range(entries):
            fp, stamp = struct.unpack_from("<QI", value, 32 + 12 * i)
            out[fp] = stamp
    return out


def group_of(space, key):
    return key[:-8] if space == 0xF2 else key[:8]


def in_filter(filt, group):
    # 7.9: Bloom filter, 7 probes by double hashing of XXH64(group, seed 0).
    h = ref.xxh64(group, 0)
    m = 8 * len(filt)
    h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1
    return all(filt[((h1 + i * h2) % m) >> 3] >> (((h1 + i * h2) % m) & 7) & 1 for i in range(7))


def read_records(txn, db, run):
    """(key, flag, value) records of a kind-3 run, checking [F16] and the filters."""
    prefix = bytes([run["space"]]) + struct.pack(">I", run["run_id"])
    out, prev_sep = [], None
    dctx = zstandard.ZstdDecompressor()
    for key, value in txn.cursor(db=db).iternext():
        if not key.startswith(prefix):
            continue
        sep = key[5:]
        (crc, kind, flags, n_blocks, run_id, records, dir_bytes, fence_len,
         filter_bytes) = struct.unpack_from("<IBBHIIIHH", value)
        head_end = 24 + fence_len + dir_bytes + filter_bytes
        assert ref.crc32c(key + value[4:head_end]) == crc and kind == 3       # [F16]
        fence = value[24:24 + fence_len]
        assert (fence == b"") if flags & 1 else (fence == prev_sep)
        filt = value[head_end - filter_bytes:head_end]
        pos, chunk_recs = 24 + fence_len, []
        for _ in range(n_blocks):
            off, clen, rlen, bcrc, flen = struct.unpack_from("<IIIIH", value, pos)
            pos += 18 + flen
            stored = value[off:off + clen]
            assert ref.crc32c(stored) == bcrc and clen <= rlen                 # [F16]
            raw = stored if clen == rlen else dctx.decompress(stored, max_output_size=rlen)
            assert len(raw) == rlen
            p = 0
            while p < len(raw):
                klen, flag, vlen = struct.unpack_from("<HBI", raw, p)
                chunk_recs.append((raw[p + 7:p + 7 + klen], flag, raw[p + 7 + klen:p + 7 + klen + vlen]))
                p += 7 + klen + vlen
        assert len(chunk_recs) == records
        ks = [k for k, _, _ in chunk_recs]
        assert ks == sorted(set(ks)) and ks[-1] <= sep                          # [F16]
        assert prev_sep is None or ks[0] > prev_sep
        assert all(in_filter(filt, group_of(run["space"], k)) for k in ks)      # [F17]
        out += chunk_recs
        prev_sep = sep
    return out


def stored_set(path):
    """The stored fingerprints and (fingerprint, typed key) pairs, per [Q1]."""
    env, dbs = open_raw(path)
    with env.begin() as txn:
        meta = {k: unframe(k, v) for k, v in txn.cursor(db=dbs[b"meta"])}
        header = meta[b"header"]
        magic, rv, wv, f, k, t, coding, expected_n, file_id = struct.unpack("<8sHHBBBBQ16s", header)
        assert (magic, rv, f, len(header)) == (b"ndindex\0", 5, 64, 40)       # [F4]-[F6]
        assert (coding, wv) == (2, 5)  # the default coding makes a version-5 file
        plan = Plan.from_bytes(meta[b"plan"])
        assert len(plan.tables) == t                                          # [F6]
        state = struct.unpack("<7Q", meta[b"state"])
        assert state[0] == txn.id()                                           # [F9]
        generation, _, runs = parse_manifest(meta[b"manifest"])
        assert generation == state[4]
        # 7.6: the log, in sequence order.
        log = [(struct.unpack(">Q", key)[0], unframe(key, v)) for key, v in txn.cursor(db=dbs[b"log"])]
        assert [s for s, _ in log] == list(range(state[1], state[2]))          # [F7]
        adds, keyops = {}, {}
        for _, rec in log:
            na, nr, nkp, nkd, nrec = struct.unpack_from("<IIIII", rec)
            a = struct.unpack_from(f"<{na}Q", rec, 20)
            r = struct.unpack_from(f"<{nr}Q", rec, 20 + 8 * na)
            assert list(a) == sorted(set(a)) and not set(a) & set(r)
            for x in a:
                adds[x] = True
            for x in r:
                adds[x] = False
            pos = 20 + 8 * (na + nr)
            for i in range(nkp + nkd):
                fp, ln = struct.unpack_from("<QH", rec, pos)
                keyops[(fp, rec[pos + 10:pos + 10 + ln])] = i < nkp
                pos += 10 + ln
            for _ in range(nrec):
                space, flag, klen, vlen = struct.unpack_from("<BBHI", rec, pos)
                assert space in (0xF3, 0xF4) and flag in (0, 1)
                pos += 8 + klen + vlen
            assert not any(rec[pos:])                                        # [F19] padding
            assert pos == len(rec) or (len(rec) + 4 + 16) % 4096 == 0 and rv >= 5
        tombs = {}
        assert sum(1 for run in runs if run["kind"] == 4) <= 64              # [M3]
        for run in runs:
            if run["kind"] == 4:                                              # 7.8: the union
                tombs.update(read_tombstones(txn, dbs[b"chunks"], run))
        per_table = []
        for i in range(t):
            fps = set()
            for run in runs:
                if run["space"] == i:
                    assert not run["flags"], "no merge in progress in these files"
                    vals = np.array(read_fp_run(txn, dbs[b"chunks"], run), dtype=np.uint64)
                    fps |= set(int(x) for x in plan.tables[i].invert(vals))
            per_table.append(fps - set(tombs))
        assert all(s == per_table[0] for s in per_table)                      # [Q2]
        stored = {x for x in per_table[0] if adds.get(x, True)} | {x for x, v in adds.items() if v}
        key_pairs = {}
        for space in (0xF1, 0xF2):
            decided = {}
            for run in reversed([r for r in runs if r["space"] == space]):    # oldest first
                for rk, flag, _ in read_records(txn, dbs[b"chunks"], run):
                    decided[rk] = flag == 0
            pairs = set()
            for rk, present in decided.items():
                if present:
                    pairs.add((struct.unpack(">Q", rk[:8])[0], rk[8:]) if space == 0xF1
                              else (struct.unpack(">Q", rk[-8:])[0], rk[:-8]))
            key_pairs[space] = pairs
    env.close()
    for pair, present in keyops.items():
        for space in key_pairs:
            (key_pairs[space].add if present else key_pairs[space].discard)(pair)
    assert key_pairs[0xF1] == key_pairs[0xF2]                                  # 7.9 mirror
    return stored, key_pairs[0xF1], runs


def test_header_record_matches_spec_example(tmp_path):
    # 7.2: the example header is what a k=3, 4-table, expected_n=1e6 index with
    # file_id 00..0f writes.
    section = SPEC[SPEC.index("### 7.2"):SPEC.index("### 7.3")]
    example = bytes.fromhex("".join(re.findall(r"```\n(.*?)```", section, re.S)[0].split()))
    payload = unframe(b"header", example)
    path = tmp_path / "h.ndx"
    Index.create(path, k=3, expected_n=1_000_000).close()
    env, dbs = open_raw(path)
    with env.begin() as txn:
        written = unframe(b"header", txn.get(b"header", db=dbs[b"meta"]))
    env.close()
    assert written[:24] == payload[:24]                                       # [F4]-[F6]
    assert payload[24:40] == bytes(range(16)) and len(written) == 40


def test_every_state_of_the_file_reads_by_the_spec(tmp_path):
    # A file through log, level runs, a full merge, removes and key changes:
    # at each point a reader written from section 7 finds the library's answer.
    path = tmp_path / "s.ndx"
    rng = np.random.default_rng(1)
    fps = np.unique(rng.integers(0, 2**64, 30000, dtype=np.uint64))
    model, keys = set(), set()
    ix = Index.create(path, k=3, expected_n=30000, background_compaction=False)

    def check(expect_kinds, absent=frozenset()):
        # py-lmdb refuses a second handle on an open file: close, read, reopen.
        nonlocal ix
        live = set(int(x) for x in ix.fingerprints())
        ix.close()
        stored, pairs, runs = stored_set(path)
        assert stored == model == live
        assert pairs == keys
        assert expect_kinds <= {r["kind"] for r in runs}
        assert not absent & {r["kind"] for r in runs}
        ix = Index.open(path, background_compaction=False)

    ix.add(fps[:20000])
    model |= set(int(x) for x in fps[:20000])
    check(set())                                                              # all in the log
    ix.compact()
    check({2})                                                                # raw runs
    ix.compact(full=True)
    check({1})                                                                # Huffman main
    ix.add(fps[20000:25000])
    model |= set(int(x) for x in fps[20000:25000])
    ix.compact()
    check({1, 2})                                                 # a level-1 run beside it
    ix.add(fps[25000:], keys=[f"d{i}" for i in range(len(fps) - 25000)])
    model |= set(int(x) for x in fps[25000:])
    keys |= {(int(x), b"\x01" + f"d{i}".encode()) for i, x in enumerate(fps[25000:])}
    ix.remove(fingerprints=fps[:50])
    model -= set(int(x) for x in fps[:50])
    check(set())
    ix._compactor.step(force_flush=True)         # the flush alone, merged into level 1
    check({1, 2, 3, 4})                          # records; tombstones for the main run
    ix.compact(full=True)
    check({1, 3}, absent={2, 4})      # the merges outdated the tombstones: they are gone
    ix.add([1, 2], keys=[b"b", "a"])
    ix.remove(keys=["d0"])
    model |= {1, 2}
    keys |= {(1, b"\x00b"), (2, b"\x01a")}
    keys -= {k for k in keys if k[1] == b"\x01d0"}
    model -= {int(fps[25000])}
    check(set())
    ix.close()


def test_inspector_reads_every_section(tmp_path):
    path = tmp_path / "i.ndx"
    with Index.create(path, k=3, expected_n=5000, background_compaction=False) as ix:
        ix.add(np.arange(1, 5001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        ix.compact(full=True)
        ix.add([7], keys=["seven"])
        ix.remove(fingerprints=[0x9E3779B97F4A7C15])
        ix.compact()
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "inspect_index.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "== 7.2 header" in out and "table 3:" in out
    assert re.search(r"table 0 run \d+: huffman", out, re.I), out
    assert "tombstone" in out.lower() and "records" in out.lower()
