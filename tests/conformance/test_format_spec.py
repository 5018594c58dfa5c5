"""Conformance: the format spec's worked example and test vectors decode as written.

Each test cites the FORMAT.md statements it checks.
"""

import json
import pathlib
import re

import numpy as np
import pytest

from ndindex import codec, codec_reference
from ndindex.codec import HuffmanCode
from ndindex.errors import CorruptionError

SPEC = pathlib.Path(__file__).resolve().parents[2] / "format-spec"
VECTORS = sorted((SPEC / "vectors").glob("*.json"))


def load(path):
    v = json.loads(path.read_text())
    return v, bytes.fromhex(v["code"]), bytes.fromhex(v["blocks"])


def test_vectors_present():
    names = {p.stem for p in VECTORS}
    assert {"block-example", "table-delta-2000", "bad-checksum", "bad-padding"} <= names


@pytest.mark.parametrize("path", [p for p in VECTORS if "values" in json.loads(p.read_text())],
                         ids=lambda p: p.stem)
def test_valid_vector_decodes_and_reencodes_byte_for_byte(path):
    # [B1]-[B9], [H1]-[H5]: both decoders read the values; the writer reproduces the bytes.
    v, record, blocks = load(path)
    want = np.array([int(s) for s in v["values"]], dtype=np.uint64)
    code = HuffmanCode.from_bytes(record)
    np.testing.assert_array_equal(codec.decode(blocks, code), want)
    ref = []
    for i in range(0, len(blocks), 1024):
        ref += codec_reference.decode_block(blocks[i:i + 1024], record)
    assert ref == [int(s) for s in v["values"]]
    assert codec.encode(want, code).blocks.tobytes() == blocks


@pytest.mark.parametrize("path", [p for p in VECTORS if "error" in json.loads(p.read_text())],
                         ids=lambda p: p.stem)
def test_invalid_vector_rejected_by_both_decoders(path):
    v, record, blocks = load(path)
    code = HuffmanCode.from_bytes(record)
    with pytest.raises(CorruptionError, match=v["error"]):
        codec.decode(blocks, code)
    with pytest.raises(CorruptionError, match=v["error"]):
        codec_reference.decode_block(blocks, record)


def test_worked_example_in_spec_decodes():
    # Section 9: the hex in the document itself is the example's block and code.
    text = (SPEC / "FORMAT.md").read_text()
    section = text[text.index("## 9. Worked example"):text.index("## 10.")]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    record = bytes.fromhex("".join(blocks[0].split()))
    head = bytes.fromhex("".join(blocks[1].split()))
    block = head + bytes(1024 - len(head))
    assert codec_reference.decode_block(block, record) == [1000, 1001, 1003, 1010, 1040]
    code = HuffmanCode.from_bytes(record)
    assert list(codec.decode(block, code)) == [1000, 1001, 1003, 1010, 1040]


def test_crc_check_value():
    # [C1]
    assert codec_reference.crc32c(b"123456789") == 0xE3069283
