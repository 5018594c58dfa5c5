"""Shared pieces of the fuzz targets: input slicing, codes, guarded buffers.

Nothing here needs atheris until ``fuzz`` runs, so the targets import (and
pytest replays them) without it.  Targets import this module inside
``instrumented.imports`` so that its branches count as coverage too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys

from ndindex import _core, codec

BLOCK_BYTES = codec.BLOCK_BYTES
PAGE_BYTES = mmap.PAGESIZE
#: Most blocks a decode input is cut into; the guarded buffer holds this many.
MAX_BLOCKS = 3


class ByteReader:
    """Consume a fuzz input from the front; reads past the end give zeros.

    atheris.FuzzedDataProvider does the same job, but the targets must run
    (and pytest must replay them) without atheris installed.
    """

    def __init__(self, data: bytes):
        self.data = bytes(data)
        self.pos = 0

    def take(self, n: int) -> bytes:
        """Return the next n bytes, zero-padded at the end of the input."""
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk + bytes(n - len(chunk))

    def u8(self) -> int:
        return self.take(1)[0]

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "little")

    def rest(self) -> bytes:
        """Return everything not consumed yet."""
        chunk = self.data[self.pos:]
        self.pos = len(self.data)
        return chunk


def complete_lengths(raw: bytes) -> bytes:
    """Turn 64 arbitrary bytes into the lengths of a complete code.

    Each byte asks for a length in 1..12; requests that would overfill the
    Kraft budget are lengthened, and leftover budget is then spent by
    shortening the longest codes.  Every input gives a valid code and the
    fuzzer steers lengths directly, which frequency-based construction
    (package-merge) would smooth away.
    """
    unit = 1 << codec.CODE_MAX_BITS
    lengths = [1 + b % codec.CODE_MAX_BITS for b in raw[:codec.CODE_SYMBOLS]]
    budget = unit
    for s in range(codec.CODE_SYMBOLS):
        later = codec.CODE_SYMBOLS - 1 - s  # each needs at least one unit
        while budget - (unit >> lengths[s]) < later:
            lengths[s] += 1
        budget -= unit >> lengths[s]
    # All weights are powers of two dividing `unit`, so the leftover is a
    # multiple of the smallest weight and this loop always ends at zero.
    while budget:
        s = max(range(codec.CODE_SYMBOLS),
                key=lambda i: (lengths[i] if (unit >> lengths[i]) <= budget else 0, -i))
        budget -= unit >> lengths[s]
        lengths[s] -= 1
    return bytes(lengths)


def _fixed_codes() -> list[codec.HuffmanCode]:
    """Return a few valid codes of each coding, from dense to sparse tables.

    Coding 2 (restart tables) comes last, so that the indices of the older
    codes, which the seeds name, stay as they were.
    """
    codes = []
    for coding in (codec.CODING_DELTA, codec.CODING_XOR, codec.CODING_RESTARTS):
        for n in (2, 1000, 10**6, 10**12):
            codes.append(codec.HuffmanCode.for_density(n, coding))
        codes.append(codec.HuffmanCode.from_lengths([6] * 64, coding))  # flat
        # Extremes: h=63 (the widest entry) or h=0 gets the one-bit code.
        for wide in (63, 0):
            asked = bytes(0 if s == wide else 6 for s in range(codec.CODE_SYMBOLS))
            codes.append(codec.HuffmanCode.from_lengths(complete_lengths(asked), coding))
    return codes


FIXED_CODES = _fixed_codes()


def code_from(reader: ByteReader) -> codec.HuffmanCode:
    """Pick a code from the input: one of FIXED_CODES or repaired raw lengths.

    u8 choice: bit 7 set takes 64 raw lengths next, with coding (choice &
    0x7F) % 3 (0 xor, 1 delta, 2 delta with restart tables); clear takes
    FIXED_CODES[choice % len(FIXED_CODES)].
    """
    choice = reader.u8()
    if choice & 0x80:
        coding = (choice & 0x7F) % 3
        return codec.HuffmanCode.from_lengths(complete_lengths(reader.take(codec.CODE_SYMBOLS)), coding)
    return FIXED_CODES[choice % len(FIXED_CODES)]


def crc32c(data: bytes) -> int:
    """Return the CRC-32C of data (the C kernel; the reference checks its own)."""
    return _core.crc32c(data)


def fix_crc(block: bytearray) -> None:
    """Store the right CRC-32C of bytes 4..1023 in bytes 0..3 of each block."""
    for off in range(0, len(block), BLOCK_BYTES):
        crc = _core.crc32c(bytes(block[off + 4:off + BLOCK_BYTES]))
        block[off:off + 4] = crc.to_bytes(4, "little")


class GuardedBuffer:
    """Memory with an inaccessible page on each side (an "electric fence").

    Without a sanitizer build, a decoder reading one byte past its block
    would go unnoticed; placed against a PROT_NONE page it segfaults, and
    the fuzzer records the input.  ``at_end`` puts the data flush against
    the trailing guard, ``at_start`` flush after the leading guard.
    Falls back to plain bytes where mprotect is unavailable.
    """

    def __init__(self, data_pages: int = 1):
        self.data_pages = data_pages
        self.map = mmap.mmap(-1, (data_pages + 2) * PAGE_BYTES)
        self.guarded = False
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
            end = base + (data_pages + 1) * PAGE_BYTES
            self.guarded = (libc.mprotect(base, PAGE_BYTES, 0) == 0
                            and libc.mprotect(end, PAGE_BYTES, 0) == 0)
        self.view = memoryview(self.map)

    def at_end(self, data: bytes) -> memoryview:
        """Return a read-only view of data placed right before the trailing guard."""
        if not self.guarded:
            return memoryview(bytes(data))
        stop = (self.data_pages + 1) * PAGE_BYTES
        self.view[stop - len(data):stop] = data
        return self.view[stop - len(data):stop].toreadonly()

    def at_start(self, data: bytes) -> memoryview:
        """Return a read-only view of data placed right after the leading guard."""
        if not self.guarded:
            return memoryview(bytes(data))
        self.view[PAGE_BYTES:PAGE_BYTES + len(data)] = data
        return self.view[PAGE_BYTES:PAGE_BYTES + len(data)].toreadonly()


GUARD = GuardedBuffer(data_pages=-(-MAX_BLOCKS * BLOCK_BYTES // PAGE_BYTES))


def corpus_files(fuzz_dir: str, target: str) -> list[str]:
    """Return the seed and regression inputs of a target, sorted."""
    found = []
    for kind in ("corpus", "regressions"):
        d = os.path.join(fuzz_dir, kind, target)
        if os.path.isdir(d):
            found += sorted(os.path.join(d, f) for f in os.listdir(d)
                            if not f.startswith(".") and os.path.isfile(os.path.join(d, f)))
    return found


def fuzz(check, argv: list[str] | None = None) -> None:
    """Run libFuzzer on a target's check (libFuzzer flags in argv, else
    sys.argv; see fuzz/README.md).  atheris is imported here, not above:
    replaying the corpus under pytest needs no fuzzer."""
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: pip install -e '.[fuzz]'")
    atheris.Setup(argv if argv is not None else sys.argv, check)
    atheris.Fuzz()
