"""A file's text for the dedup job: decompress, tell binary from text, decode.

:func:`decompress` reads gzip, bzip2, xz/lzma and zstd data through its
decompressor, never holding more than a given number of output bytes, so a
small file that expands without bound (a decompression bomb) is refused, not
read into memory.  :func:`decode` turns bytes into str in three steps:

1. a byte-order mark names the codec (UTF-8, UTF-16, UTF-32);
2. else the bytes are strict UTF-8 (nearly every file; no guessing);
3. else a charset detector (chardet) names one, from the first DETECT_BYTES.

Before steps 2 and 3, bytes with a NUL (that are not UTF-16 shaped) or with
many C0 control bytes are binary.  When no codec decodes them, bytes that are
not binary are *undecodable*: the two are reported apart.  chardet was
chosen by ``tools/eval/eval_charset.py`` (results in
``tools/eval/results/charset.txt``): in this decision it decodes 95% of the
Latin-1 and cp1252 inputs and 98% of all, and calls no binary sample text;
charset-normalizer decodes about half of the Latin-1 and cp1252 ones, and
cchardet and chardetng call every binary sample text.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma

import zstandard

# The fingerprinter's binary test, without its rule that invalid UTF-8 is
# binary: here other character sets are text.  SNIFF_BYTES leading bytes are
# tested for NULs and C0 control bytes (not white space or ESC), of which a
# share of MAX_CONTROL_FRACTION makes the data binary.
from ndindex.fingerprint.normalize import BINARY_MAX_CONTROL_FRACTION as MAX_CONTROL_FRACTION
from ndindex.fingerprint.normalize import BINARY_SNIFF_BYTES as SNIFF_BYTES
#: Bytes a charset detector sees: enough for a verdict, bounded in time.
DETECT_BYTES = 64 << 10
#: Decompressors by file extension.
COMPRESSED_EXTENSIONS = frozenset(("gz", "bz2", "xz", "lzma", "zst"))

_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))
_CONTROL_BYTES = bytes(b for b in range(0x20) if b not in b"\t\n\x0b\x0c\r\x1b")


class NotText(Exception):
    """The bytes are not text; ``reason`` says why: "binary", "undecodable",
    "too large" (decompressed beyond the limit) or "corrupt" (bad compressed
    data; the message says more)."""

    def __init__(self, reason: str, message: str | None = None):
        super().__init__(message or reason)
        self.reason = reason


def _reader(data: bytes, extension: str):
    raw = io.BytesIO(data)
    if extension == "gz":
        return gzip.GzipFile(fileobj=raw)
    if extension == "bz2":
        return bz2.BZ2File(raw)
    if extension in ("xz", "lzma"):
        return lzma.LZMAFile(raw)
    if extension == "zst":
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    raise ValueError(f"not a compressed extension: {extension!r}")


def decompress(data: bytes, extension: str, limit: int) -> bytes:
    """Return the decompressed bytes of a .gz, .bz2, .xz, .lzma or .zst file.

    Parameters: data, the file's bytes; extension, its extension without the
    dot (one of COMPRESSED_EXTENSIONS); limit, the most output bytes kept.
    Raises NotText("too large") when the output exceeds limit (after reading
    at most limit + 1 bytes of it), NotText("corrupt") for bad data, and
    ValueError for another extension.  Memory: O(limit).
    """
    reader = _reader(data, extension)
    chunks, total = [], 0
    try:
        with reader:
            while total <= limit:
                chunk = reader.read(min(1 << 20, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
    except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as exc:
        raise NotText("corrupt", f"corrupt .{extension} data ({exc})") from None
    if total > limit:
        raise NotText("too large", f"decompresses to more than {limit:,} bytes")
    return b"".join(chunks)


def _utf16_shaped(head: bytes) -> bool:
    # UTF-16 text of Latin script has a NUL in nearly every other byte, on
    # one side only; binary NULs fall on both.
    even, odd = head[0::2].count(0), head[1::2].count(0)
    half = max(len(head) // 2, 1)
    return max(even, odd) > 0.3 * half and min(even, odd) < 0.02 * half


def _binary(head: bytes) -> bool:
    controls = len(head) - len(head.translate(None, _CONTROL_BYTES))
    return controls > MAX_CONTROL_FRACTION * max(len(head), 64)


def _detect(data: bytes) -> str | None:
    import chardet      # imported on first use: most runs meet no such file
    return chardet.detect(data[:DETECT_BYTES])["encoding"]


def _codec(name: str) -> str:
    """Return Python's name of a codec ("UTF_16LE" -> "utf-16-le"), or "" if unknown."""
    try:
        return codecs.lookup(name).name
    except LookupError:
        return ""


def decode(data: bytes) -> str:
    """Return the text of ``data``: by its byte-order mark, as UTF-8, or as the
    codec a detector names (see the module docstring).

    Raises NotText("binary") for binary data and NotText("undecodable") for
    data that is not binary but that no codec decodes.  Cost: one UTF-8
    decode for UTF-8 text; the detector runs only on other text and sees at
    most DETECT_BYTES.
    """
    for bom, name in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(name)
            except UnicodeDecodeError:
                raise NotText("undecodable", f"invalid {name} after its byte-order mark") \
                    from None
    head = data[:SNIFF_BYTES]
    if b"\0" in head:
        name = _detect(data) if _utf16_shaped(head) else None
        if name is None or not _codec(name).startswith("utf-16"):
            raise NotText("binary", "looks binary")
    else:
        if _binary(head):
            raise NotText("binary", "looks binary")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        name = _detect(data)
        if name is None:
            raise NotText("undecodable", "no character set decodes it")
    try:
        return data.decode(name, errors="replace")   # the detector saw only the head
    except LookupError:
        raise NotText("undecodable", f"unknown character set {name!r}") from None
