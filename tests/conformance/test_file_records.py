"""Conformance of the index file's records (FORMAT.md section 7) and the inspector."""

import re
import struct
import subprocess
import sys
import pathlib

import lmdb
import numpy as np

from ndindex import codec_reference as ref
from ndindex.index import Index

ROOT = pathlib.Path(__file__).resolve().parents[2]


def raw_env(path):
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=8)
    return env, {n: env.open_db(n, create=False, dupsort=n in (b"docs", b"keys"))
                 for n in (b"meta", b"segments", b"log", b"docs", b"keys", b"removed")}


def test_header_record_matches_spec_example(tmp_path):
    # 7.2: the example header is the one a k=3, 4-table, expected_n=1e6 index writes.
    path = tmp_path / "h.ndx"
    Index.create(path, k=3, expected_n=1_000_000).close()
    text = (ROOT / "format-spec" / "FORMAT.md").read_text()
    section = text[text.index("### 7.2"):text.index("### 7.3")]
    example = bytes.fromhex("".join(re.findall(r"```\n(.*?)```", section, re.S)[0].split()))
    env, dbs = raw_env(path)
    with env.begin() as txn:
        assert txn.get(b"header", db=dbs[b"meta"]) == example  # [F4][F5][F6]
    env.close()


def test_segments_logs_and_documents_follow_the_spec(tmp_path):
    path = tmp_path / "s.ndx"
    rng = np.random.default_rng(1)
    fps = rng.integers(0, 2**64, 30000, dtype=np.uint64)
    with Index.create(path, k=3, expected_n=30000, log_limit=10**9) as ix:
        ix.add(fps)
        ix.compact()
        ix.add([1, 2, 3], keys=["a", b"b", "c"])
        ix.remove(fingerprints=[int(fps[0])])
    env, dbs = raw_env(path)
    with env.begin() as txn:
        codes = [txn.get(b"code:" + bytes([i]), db=dbs[b"meta"])[:-4] for i in range(4)]
        per_table = {}
        for key, value in txn.cursor(db=dbs[b"segments"]):
            crc, n, reserved = struct.unpack_from("<IHH", value)
            assert ref.crc32c(value[4:512]) == crc and reserved == 0          # [F7]
            assert len(value) == 512 + 1024 * n and 1 <= n <= 63             # [F7]
            keys = struct.unpack_from(f"<{n}Q", value, 8)
            assert keys[-1] == struct.unpack(">Q", key[1:])[0]                # [F7]
            for j in range(n):
                vals = ref.decode_block(value[512 + 1024 * j:512 + 1024 * (j + 1)], codes[key[0]])
                assert vals[-1] == keys[j]                                     # [F8]
                per_table.setdefault(key[0], []).extend(vals)
        for vals in per_table.values():
            assert vals == sorted(vals) and len(vals) == len(set(vals)) == len(np.unique(fps))
        (count,) = struct.unpack_from("<I", next(iter(txn.cursor(db=dbs[b"log"])))[1])
        assert count == 3                                                       # 7.5
        fp_key = struct.pack(">Q", 1)
        value = txn.get(fp_key, db=dbs[b"docs"])
        assert value[4:] == b"\x01a" and struct.unpack("<I", value[:4])[0] == ref.crc32c(fp_key + b"\x01a")
        kv = txn.get(b"\x00b", db=dbs[b"keys"])
        assert kv[:8] == struct.pack(">Q", 2)                                   # [F12]
        tomb = struct.pack(">Q", int(fps[0]))
        assert txn.get(tomb, db=dbs[b"removed"]) == struct.pack("<I", ref.crc32c(tomb))  # [F14]
    env.close()


def test_inspector_reads_a_file(tmp_path):
    path = tmp_path / "i.ndx"
    with Index.create(path, k=3, expected_n=5000) as ix:
        ix.add(np.arange(1, 5001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "inspect_index.py"), str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "== 7.2 header" in out and "table 3:" in out and "tombstones: 0" in out
