"""The journal of a durability="normal" writer: operations kept safe without an fsync each.

SQLite in WAL mode with synchronous=NORMAL, and RocksDB with its default
write options, append a commit to a log with one write() and no fsync: the
commit survives the process crashing (the bytes are in the OS's page
cache) and may be lost only if the OS itself goes down.  ndindex does the
same: a normal-durability writer appends each operation batch to its own
journal file beside the index, ``<index>.journal-<id>``, and a checkpoint
(every ``CHECKPOINT_SECONDS``, on ``sync()`` and on close) commits what it
holds into the index file durably.  The index file itself is only ever
changed by durable LMDB commits, so it is never corrupted.

The journal is exclusive to its writer (an flock held for its life); at
open, a writer replays the journals of writers that died (their locks are
free) after the position their last checkpoint recorded in the index
(meta record ``journal:<id>``), and deletes them.

Layout (FORMAT.md 7.9): a 40-byte header (magic, the index's file id, the
journal id, a generation), then records: u32 payload length, u32 CRC-32C of
(journal id, generation, payload), payload = a log record (7.5).  A torn or
damaged record ends the journal: what follows it was never acknowledged as
safe.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import struct

from ndindex import _core
from ndindex.descriptors import Descriptor
from ndindex.errors import CorruptionError

MAGIC = b"ndxjrnl\0"
HEADER = struct.Struct("<8s16sQQ")  # magic, index file id, journal id, generation
RECORD = struct.Struct("<II")       # payload length, crc
#: A journal is truncated once a checkpoint covers all of it and it exceeds this.
ROTATE_BYTES = 4 << 20
CHECKPOINT_SECONDS = 0.1


def journal_key(journal_id: int) -> bytes:
    """The meta key recording how far a journal's checkpoints reached."""
    return b"journal:" + journal_id.to_bytes(8, "big")


POSITION = struct.Struct("<QQ")  # generation, offset (bytes after the header)


class Journal:
    """This writer's journal: append, and note positions for checkpoints."""

    def __init__(self, index_path: str, file_id: bytes):
        self.journal_id = int.from_bytes(os.urandom(8), "big") or 1
        self.path = f"{index_path}.journal-{self.journal_id:016x}"
        self.generation = 0
        self._file = Descriptor(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        fd = self._file.fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, HEADER.pack(MAGIC, file_id, self.journal_id, 0))
        except BaseException:
            self._file.close()
            os.unlink(self.path)
            raise
        self._file_id = file_id
        self.offset = 0  # bytes of records after the header

    def append(self, payload: bytes) -> None:
        """Append one record with a single write(): safe from a process crash on return."""
        crc = _core.crc32c(self._salt() + payload)
        data = RECORD.pack(len(payload), crc) + payload
        written = _core.write_with_gil(self._file.fd, data)
        if written != len(data):
            # A torn record ends the journal for replay: every record
            # appended after it, acknowledged, would be lost with it.
            os.ftruncate(self._file.fd, HEADER.size + self.offset)
            raise OSError(errno.ENOSPC, "short write to the journal", self.path)
        self.offset += len(data)

    def records_after(self, offset: int) -> list:
        """The payloads of this generation's intact records that end past offset, in
        order; self.offset becomes the end of the last (an interrupted append()
        may have written its record and not counted it)."""
        data = os.pread(self._file.fd, os.fstat(self._file.fd).st_size, 0)
        records = list(_records(data, self.journal_id, self.generation))
        self.offset = records[-1][0] if records else 0
        return [payload for end, payload in records if end > offset]

    def _salt(self) -> bytes:
        return struct.pack("<QQ", self.journal_id, self.generation)

    def position(self) -> bytes:
        """The record value of the current position (for the checkpoint's commit)."""
        return POSITION.pack(self.generation, self.offset)

    def rotate_if_large(self) -> None:
        """After a checkpoint covering everything: start over if the file grew large.

        Truncate first, then bump the generation in the header: a crash in
        between leaves a file shorter than the checkpointed offset, which
        replays nothing.
        """
        if self.offset < ROTATE_BYTES:
            return
        os.ftruncate(self._file.fd, HEADER.size)
        self.generation += 1
        # Through a descriptor of its own: on Linux a pwrite() to an O_APPEND
        # one appends, whatever the offset, and the new header followed the
        # old one, which every read then took for the journal's: the records
        # appended since were unreadable, to a crash's replay too.
        with Descriptor(self.path, os.O_WRONLY) as fd:
            os.pwrite(fd, HEADER.pack(MAGIC, self._file_id, self.journal_id, self.generation), 0)
        self.offset = 0

    def close(self, delete: bool) -> None:
        if self._file.fd < 0:
            return
        if delete:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self._file.close()  # releases the lock


def orphans(index_path: str, file_id: bytes):
    """Yield (path, journal_id, generation, records) of journals whose writer is gone.

    records is a list of (end offset, payload) of every intact record, in
    order.  A journal still locked by a live writer is skipped; one that
    belongs to another index file is ignored.  The caller replays, commits,
    then calls ``discard(path)``.
    """
    for path in sorted(glob.glob(glob.escape(index_path) + ".journal-*")):
        try:
            journal = Descriptor(path, os.O_RDWR)
        except OSError:
            continue
        with journal as fd:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer is alive
            data = os.pread(fd, os.fstat(fd).st_size, 0)
        if len(data) < HEADER.size:
            yield path, None, 0, []
            continue
        magic, fid, journal_id, generation = HEADER.unpack_from(data)
        if magic != MAGIC or fid != file_id:
            continue
        yield path, journal_id, generation, list(_records(data, journal_id, generation))


def _records(data: bytes, journal_id: int, generation: int):
    salt = struct.pack("<QQ", journal_id, generation)
    pos = HEADER.size
    while pos + RECORD.size <= len(data):
        n, crc = RECORD.unpack_from(data, pos)
        start = pos + RECORD.size
        payload = data[start:start + n]
        if len(payload) != n or _core.crc32c(salt + payload) != crc:
            return  # a torn tail: never acknowledged as safe
        pos = start + n
        yield pos - HEADER.size, payload


def unpack_position(value) -> tuple[int, int]:
    raw = bytes(value)
    if len(raw) != POSITION.size:
        raise CorruptionError("journal position record has the wrong size", database="meta")
    return POSITION.unpack(raw)
