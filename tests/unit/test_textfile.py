"""ndindex.textfile: decompression within a limit, binary versus text, charsets."""

from __future__ import annotations

import bz2
import gzip
import lzma

import pytest
import zstandard

from ndindex import textfile
from ndindex.textfile import NotText, decode, decompress

# Prose, as the detector meets it in files (a repeated phrase mix of several
# languages is no language: detectors are measured on real documents, see
# tools/eval/eval_charset.py).
TEXT = ("Le lendemain, à l'aube, nous partîmes vers le nord. La forêt était épaisse et "
        "l'air sentait la résine ; au détour d'un sentier, un vieil homme nous salua. Il "
        "nous raconta que son père, garde forestier, avait planté ces chênes après la "
        "guerre, et que chaque été les enfants du village venaient y cueillir des mûres. "
        "Nous déjeunâmes près d'une source, où l'eau était fraîche et limpide. Le soir, "
        "à l'auberge, on nous servit une soupe épaisse, du pain noir et un fromage de "
        "chèvre ; la patronne, très aimable, nous prêta même une lampe pour la nuit. ") * 6


@pytest.mark.parametrize("codec", ["utf-8", "utf-8-sig", "utf-16", "utf-32", "latin-1",
                                   "cp1252", "utf-16-le"])
def test_decode_finds_the_text_in_each_encoding(codec):
    assert decode(TEXT.encode(codec)) == TEXT


def test_utf8_needs_no_detector(monkeypatch):
    monkeypatch.setattr(textfile, "_detect", lambda data: pytest.fail("detector called"))
    assert decode(TEXT.encode()) == TEXT


@pytest.mark.parametrize("data", [b"\0\1\2\3" * 100, bytes(range(1, 32)) * 20,
                                  b"ELF\0" + bytes(range(256)) * 4])
def test_binary_data_is_binary(data):
    with pytest.raises(NotText) as caught:
        decode(data)
    assert caught.value.reason == "binary"


def test_text_no_codec_decodes_is_undecodable_not_binary(monkeypatch):
    with pytest.raises(NotText) as caught:
        decode(b"\xef\xbb\xbf" + TEXT.encode("cp1252"))     # a UTF-8 mark over cp1252
    assert caught.value.reason == "undecodable"
    monkeypatch.setattr(textfile, "_detect", lambda data: None)
    with pytest.raises(NotText) as caught:
        decode(TEXT.encode("cp1252"))
    assert caught.value.reason == "undecodable"


@pytest.mark.parametrize("ext, compress", [
    ("gz", gzip.compress), ("bz2", bz2.compress), ("xz", lzma.compress),
    ("lzma", lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE)),
    ("zst", lambda d: zstandard.ZstdCompressor().compress(d[:100])
     + zstandard.ZstdCompressor().compress(d[100:])),                 # two frames
])
def test_decompress_each_format_within_its_limit(ext, compress):
    data = TEXT.encode()
    assert decompress(compress(data), ext, len(data)) == data
    with pytest.raises(NotText) as caught:
        decompress(compress(data), ext, len(data) - 1)
    assert caught.value.reason == "too large"
    with pytest.raises(NotText) as caught:
        decompress(b"no such stream " * 8, ext, len(data))
    assert caught.value.reason == "corrupt" and str(caught.value).startswith(f"corrupt .{ext}")
    if ext != "zst":      # zstd's stream reader returns a cut last frame as it is
        with pytest.raises(NotText) as caught:
            decompress(compress(data)[:-20], ext, len(data))
        assert caught.value.reason == "corrupt"


def test_decompress_refuses_an_unknown_extension():
    with pytest.raises(ValueError, match="not a compressed extension"):
        decompress(b"", "zip", 10)
