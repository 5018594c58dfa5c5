"""A damaged LMDB lock file (``INDEX-lock``) is a typed error, never a crash.

Every process with an index open maps the lock file: LMDB keeps there the
newest transaction id, the count of reader slots in use and the slots.  It
trusts those values while any process has the file open (the first opener
writes it afresh).  A count past the table made a reader's open, a
writer's commit and close walk past the mapping (SIGSEGV); a wrong
transaction id made readers fail with an error that blamed the index file,
and would have had a writer build on the older meta page.  Each case runs
in child processes, beside one that holds the index open, so that a crash
fails the test instead of ending the run (format-spec/lmdb.md section 11).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from ndindex import _core
from ndindex.index import Index

pytestmark = pytest.mark.skipif(_core.lmdb_lock_layout() is None,
                                reason="the lock file's layout is not known here")

#: Holds the index open (read-only, one snapshot taken) until its stdin closes.
HOLDER = """
import sys, ndindex
ix = ndindex.open(sys.argv[1], readonly=True)
ix.query(1)
print("holding", flush=True)
sys.stdin.read()
"""

#: Opens the index (read-only or not) and reports each call's outcome.
OPENER = """
import sys, ndindex
path, mode = sys.argv[1], sys.argv[2]
try:
    with ndindex.open(path, readonly=(mode == "ro")) as ix:
        if mode == "rw":
            ix.add([12345])
        print("ok", len(ix.query(7, k=0)))
except Exception as exc:
    print(type(exc).__name__, getattr(exc, "database", None), exc)
"""


def make_index(tmp_path) -> str:
    path = str(tmp_path / "ix.ndx")
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add(np.arange(1, 2001, dtype=np.uint64))
        ix.compact()
    return path


def damage_lock(path: str, field: str, value: int) -> None:
    """Write value over the lock file's transaction id or reader count."""
    txnid_at, count_at, txnid_bytes = _core.lmdb_lock_layout()
    at, fmt = (txnid_at, "=Q" if txnid_bytes == 8 else "=I") if field == "txnid" \
        else (count_at, "=I")
    with open(path + "-lock", "r+b") as f:
        f.seek(at)
        f.write(struct.pack(fmt, value))


class Holder:
    """A child process with the index open, so that the lock file stays live."""

    def __init__(self, path):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "holding"

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def run(code: str, *args) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    return done.stdout.strip()


@pytest.mark.parametrize("field, value, words", [
    ("count", 0x7FFFFFFF, "reader slots"),
    ("count", 4096, "reader slots"),
    ("txnid", 2**64 - 1, "names transaction"),
    ("txnid", 1, "names transaction"),
])
def test_a_damaged_lock_file_another_process_holds_is_a_typed_error_naming_it(
        tmp_path, field, value, words):
    """[L39] [L40]: refused before LMDB walks the slots or builds on a meta page."""
    path = make_index(tmp_path)
    holder = Holder(path)
    try:
        damage_lock(path, field, value)
        for mode in ("ro", "rw"):
            out = run(OPENER, path, mode)
            assert out.startswith("CorruptionError lock "), out
            assert f"{path}-lock: LMDB's lock file is damaged" in out and words in out, out
    finally:
        holder.close()
    # With no process left, the next open writes the lock file afresh.
    assert run(OPENER, path, "rw") == "ok 1"
    with Index.open(path, readonly=True) as ix:
        assert len(ix) == 2001 and ix.query(12345, k=0)


WRITER = """
import sys, subprocess, ndindex
path, field, value, holder = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, sys.argv[5])
from test_lock_file import damage_lock
ix = ndindex.open(path)
ix.add([7 << 40])
ix.query(7 << 40)  # the snapshot of that commit: reads go on from it
other = subprocess.Popen([sys.executable, "-c", holder, path], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
assert other.stdout.readline().strip() == "holding"
damage_lock(path, field, value)
for name, call in [("add", lambda: ix.add([8 << 40])), ("compact", lambda: ix.compact(full=True))]:
    try:
        call()
        print(name, "returned")
    except Exception as exc:
        print(name, type(exc).__name__, getattr(exc, "database", None))
print("query", [m.fingerprint >> 40 for m in ix.query(7 << 40, k=0)])
ix.close()
other.stdin.close()
other.wait()
print("closed")
"""


@pytest.mark.parametrize("field, value", [("count", 0x7FFFFFFF), ("txnid", 1),
                                          ("txnid", 2**64 - 1)])
def test_a_writer_whose_lock_file_is_damaged_refuses_to_write_and_loses_nothing(
        tmp_path, field, value):
    """[L39] [L40] in a process that had the index open before the damage."""
    path = make_index(tmp_path)
    out = run(WRITER, path, field, str(value), HOLDER, os.path.dirname(__file__)).splitlines()
    assert out == ["add CorruptionError lock", "compact CorruptionError lock", "query [7]",
                   "closed"], out
    with Index.open(path) as ix:  # the lock file afresh: writes go on
        assert len(ix) == 2001 and ix.query(7 << 40, k=0) and not ix.query(8 << 40, k=0)
        ix.add([8 << 40])
        ix.verify()


def test_a_lock_file_header_lmdb_refuses_names_the_lock_file_not_the_index(tmp_path):
    """[L41]"""
    path = make_index(tmp_path)
    holder = Holder(path)
    try:
        with open(path + "-lock", "r+b") as f:
            f.write(b"\0\0\0\0")  # the magic
        for mode in ("ro", "rw"):
            out = run(OPENER, path, mode)
            assert out.startswith("CorruptionError lock ") and "MDB_INVALID" in out, out
            assert "not an ndindex file" not in out
    finally:
        holder.close()
    assert run(OPENER, path, "ro") == "ok 1"


def test_a_damaged_lock_file_no_process_has_open_is_written_afresh(tmp_path):
    path = make_index(tmp_path)
    for field, value in (("count", 0x7FFFFFFF), ("txnid", 2**64 - 1)):
        damage_lock(path, field, value)
        assert run(OPENER, path, "rw") == "ok 1"
    with open(path + "-lock", "r+b") as f:
        f.write(os.urandom(4096))
    assert run(OPENER, path, "ro") == "ok 1"
