"""Conformance: the fingerprint-file vectors in format-spec/vectors decode as fpfile.md says.

Each test cites the fpfile.md statements it checks.
"""

import json
import pathlib
import struct

import numpy as np
import pytest

from ndindex import _core, errors, fpfile

SPEC = pathlib.Path(__file__).resolve().parents[2] / "format-spec"
EXPECTED = json.loads((SPEC / "vectors" / "fpfile-vectors.json").read_text())


@pytest.mark.parametrize("name", sorted(n for n, v in EXPECTED.items() if "error" not in v))
def test_good_vectors_decode(name):
    """[FF1]-[FF12], [FF16]-[FF18]: header, chunks, columns, footer and trailer."""
    want = EXPECTED[name]
    with fpfile.FingerprintReader(SPEC / "vectors" / name) as r:
        assert fpfile.KIND_NAMES[r.kind] == want["kind"]
        assert r.n_chunks == want["chunks"]
        chunks = list(r)
    if want["kind"] == "pairs":
        got = np.concatenate(chunks)
        assert [list(map(int, p)) for p in got.tolist()] == want["pairs"]
    elif "keys_hex" in want:
        assert np.concatenate([c[0] for c in chunks]).tolist() == want["fingerprints"]
        assert [k.hex() for c in chunks for k in c[1]] == want["keys_hex"]
    else:
        got = np.concatenate(chunks) if chunks else np.empty(0, np.uint64)
        assert got.tolist() == want["fingerprints"]


@pytest.mark.parametrize("name", sorted(n for n, v in EXPECTED.items() if "error" in v))
def test_bad_vectors_are_rejected(name):
    """[FF2], [FF3], [FF13], [FF19]: the reader's errors."""
    want = EXPECTED[name]
    error = getattr(errors, want["error"])
    with pytest.raises(error):
        with fpfile.FingerprintReader(SPEC / "vectors" / name) as r:
            list(r)


def test_minimal_vector_fields():
    """[FF1] magic, [FF4] header CRC, [FF6] chunk header, [FF9] columns, [FF16] trailer."""
    data = (SPEC / "vectors" / "fpfile-minimal.bin").read_bytes()
    assert data[:8] == b"\x89NDFP\r\n\x1a" and data[8:12] == b"\x01\x00\x00\x00"
    assert struct.unpack_from("<I", data, 12)[0] == _core.crc32c(data[:12])
    crc, count, raw, stored = struct.unpack_from("<IIII", data, 16)
    assert (count, raw) == (2, 16) and crc == _core.crc32c(data[20:32 + stored])
    footer_at, end = struct.unpack_from("<Q8s", data, len(data) - 16)
    assert end == b"NDFPEND\n" and footer_at == len(data) - 16 - 24 - 16
    assert struct.unpack_from("<IIIIQ", data, footer_at)[1:] == (0, 2, 0, 3)
