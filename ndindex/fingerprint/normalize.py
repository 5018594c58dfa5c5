"""Text normalisation: bytes -> str, Unicode NFKC and case folding.

The fingerprint of a text is defined on ``casefold(NFKC(text))`` (see
format-spec/fingerprinter.md [FP10]); white space is handled by the
tokeniser of each unit, not here, so that ``lines`` can still see line breaks.
"""

from __future__ import annotations

import codecs
import unicodedata

import numpy as np

#: How many leading bytes :func:`looks_binary` inspects; git's heuristic
#: (``buffer_is_binary``) looks at the first 8000 bytes for a NUL.
BINARY_SNIFF_BYTES = 8000

#: Fraction of the sniffed bytes that may be invalid UTF-8 or C0 controls
#: (other than tab, line feed, vertical tab, form feed, carriage return)
#: before the data counts as binary.
BINARY_MAX_CONTROL_FRACTION = 0.10

_CONTROL_BYTES = bytes(b for b in range(0x20) if b not in b"\t\n\x0b\x0c\r\x1b")


class BinaryDataError(ValueError):
    """Bytes given as text look like binary data (a NUL byte, or mostly
    invalid UTF-8 or control bytes); see :func:`looks_binary`."""


def normalize_text(text: str) -> str:
    """Return ``casefold(NFKC(text))``, the form every unit tokenises.

    Raises:
        TypeError: ``text`` is not a str.

    Cost: linear; CPython skips the NFKC work for text that its quick check
    already finds normalised (ASCII text always is).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    return text.casefold()


# NFKC and case folding need only look at runs of non-ASCII characters, each
# with the ASCII character before it (which a combining mark may compose
# with): ASCII characters are starters that nothing composes onto, no
# canonical composition has an ASCII second character, and case folding is
# per character.  The rest needs only ASCII lowering, done on the UTF-8 bytes
# (bytes.lower() touches A-Z only, and case folding never outputs A-Z).  The
# runs are found with numpy on the UTF-8 bytes (a regex scan ran at 90 MB/s);
# text with many runs (most non-Latin scripts) takes the whole-string path.
# The property tests check equality with normalize_text().
_MAX_RUNS_PER_BYTE = 1 / 64


def normalize_utf8(text: str) -> bytes:
    """Return ``normalize_text(text).encode("utf-8")``, faster.

    Lone surrogates (which str allows) are encoded as their 3-byte form
    ("surrogatepass"); the tokeniser reads them as invalid, non-word bytes.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if text.isascii():
        return text.encode("ascii").lower()
    data = text.encode("utf-8", "surrogatepass")
    high = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) >= 0x80)
    gaps = np.flatnonzero(np.diff(high) > 1)
    if len(gaps) + 1 > _MAX_RUNS_PER_BYTE * len(data):
        return normalize_text(text).encode("utf-8", "surrogatepass")
    starts = high[np.r_[0, gaps + 1]].tolist()
    ends = (high[np.r_[gaps, len(high) - 1]] + 1).tolist()
    parts, pos = [], 0
    for start, end in zip(starts, ends):
        if start > pos:
            start -= 1
        parts.append(data[pos:start])
        run = data[start:end].decode("utf-8", "surrogatepass")
        parts.append(unicodedata.normalize("NFKC", run).casefold()
                     .encode("utf-8", "surrogatepass"))
        pos = end
    parts.append(data[pos:])
    return b"".join(parts).lower()


def looks_binary(data: bytes | bytearray | memoryview) -> bool:
    """Return True when the leading bytes of ``data`` look like binary data.

    Binary means: a NUL byte among the first BINARY_SNIFF_BYTES bytes (git's
    rule), or more than BINARY_MAX_CONTROL_FRACTION of them (of at least 64)
    being C0 control
    bytes other than white space and ESC, or invalid UTF-8.  Empty data is
    text.
    """
    head = bytes(data[:BINARY_SNIFF_BYTES])
    if not head:
        return False
    if b"\x00" in head:
        return True
    controls = len(head) - len(head.translate(None, _CONTROL_BYTES))
    # final=False: a character cut by the sniff window is not an error
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoded = decoder.decode(head, final=len(data) <= BINARY_SNIFF_BYTES)
    invalid = decoded.count("\ufffd") - head.count("\ufffd".encode())
    # max(.., 64): a short text with one stray byte is still text
    return (controls + invalid) > BINARY_MAX_CONTROL_FRACTION * max(len(head), 64)


def many_texts(documents, what: str = "documents"):
    """documents, checked not to be one text: a str or bytes is iterable too,
    and taken as many it would be a document per character (or byte)."""
    if isinstance(documents, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be an iterable of texts, got one "
                        f"{type(documents).__name__}: give [text] for a single text")
    return documents


def decode_text(data: str | bytes | bytearray | memoryview, *, binary: str = "raise") -> str:
    """Return ``data`` as str; bytes are decoded as UTF-8.

    Invalid UTF-8 sequences become U+FFFD (``errors="replace"``), which is
    not a word character, so a bad byte splits a word rather than failing the
    whole document.  A str is returned unchanged.

    Args:
        data: str, or bytes-like UTF-8 text.
        binary: ``"raise"`` (default) raises BinaryDataError when
            :func:`looks_binary` says so; ``"text"`` decodes it anyway.

    Raises:
        BinaryDataError: binary data under ``binary="raise"``.
        TypeError: ``data`` is neither str nor bytes-like.
        ValueError: ``binary`` is not one of the two policies.
    """
    if isinstance(data, str):
        return data
    if binary not in ("raise", "text"):
        raise ValueError(f"binary must be 'raise' or 'text', got {binary!r}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"text must be str or bytes-like, got {type(data).__name__}")
    if binary == "raise" and looks_binary(data):
        raise BinaryDataError(
            f"input looks binary (NUL byte or >{BINARY_MAX_CONTROL_FRACTION:.0%} control or "
            f"invalid UTF-8 bytes in the first {BINARY_SNIFF_BYTES} bytes); "
            "fingerprint it anyway with binary='text' (a Fingerprinter(binary='text'))")
    return bytes(data).decode("utf-8", errors="replace")
