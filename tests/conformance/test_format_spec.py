"""Conformance: the format spec's worked example and test vectors decode as written.

Each test cites the FORMAT.md statements it checks.
"""

import json
import math
import pathlib
import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ndindex import codec, codec_reference
from ndindex.codec import HuffmanCode
from ndindex.errors import CorruptionError

SPEC = pathlib.Path(__file__).resolve().parents[2] / "format-spec"
VECTORS = sorted((SPEC / "vectors").glob("*.json"))


def load(path):
    v = json.loads(path.read_text())
    return v, bytes.fromhex(v["code"]), bytes.fromhex(v["blocks"])


#: Raw-block vectors (5.3) name their writer in "raw"; the others are Huffman blocks.
RAW = [p for p in VECTORS if "raw" in json.loads(p.read_text())]
VALID = [p for p in VECTORS if "values" in json.loads(p.read_text()) and p not in RAW]
INVALID = [p for p in VECTORS if "error" in json.loads(p.read_text()) and p not in RAW]
#: The valid vectors of coding 2 (delta with restart tables, 5.4).
RESTART_VECTORS = [p for p in VALID if bytes.fromhex(json.loads(p.read_text())["code"])[0] == 2]


def test_vectors_present():
    names = {p.stem for p in VECTORS}
    assert {"block-example", "table-delta-2000", "bad-checksum", "bad-padding"} <= names
    # Coding 2 (5.4): valid blocks and tables, and one damage per statement.
    assert {"block-example-restarts", "block-restarts-short", "block-restarts-one",
            "block-restarts-extremes", "table-restarts-2000"} <= {p.stem for p in RESTART_VECTORS}
    statements = {p.stem: json.loads(p.read_text())["statement"] for p in INVALID}
    assert {statements[n] for n in ("bad-restart-width", "bad-restart-end", "bad-restart-value",
                                    "bad-restart-tail", "bad-restart-first", "bad-restart-padding",
                                    "bad-restart-overrun")} == {"B11", "B12", "B8", "B6"}


def test_raw_vectors_present():
    # 5.3: both forms, a run that mixes them, and a damage per rule of [B15].
    kinds = {p.stem: json.loads(p.read_text())["raw"] for p in RAW}
    assert {"raw-packed-400": "packed", "raw-plain-400": "plain", "raw-mixed": "packed",
            "raw-packed-consecutive": "packed"}.items() <= kinds.items()
    assert sum(k == "damaged" for k in kinds.values()) >= 5


@pytest.mark.parametrize("path", RAW, ids=lambda p: p.stem)
def test_raw_vector_decodes_or_is_rejected_by_both_decoders(path):
    # [B10], [B15]: the kernel's decoder and the reference agree; [B16]: a
    # writer of the vector's form reproduces its bytes.
    from ndindex import chunks
    v = json.loads(path.read_text())
    blocks = bytes.fromhex(v["blocks"])
    parts = [blocks[i:i + 1024] for i in range(0, len(blocks), 1024)]
    if v["raw"] == "damaged":
        assert codec_reference.crc32c(parts[0][4:]) == int.from_bytes(parts[0][:4], "little")
        with pytest.raises(CorruptionError, match=v["error"]):
            chunks.decode_raw(blocks)
        with pytest.raises(CorruptionError, match=v["error"]):
            codec_reference.decode_raw_block(parts[0])
        return
    want = [int(s) for s in v["values"]]
    assert chunks.decode_raw(blocks).tolist() == want
    assert [x for part in parts for x in codec_reference.decode_raw_block(part)] == want
    packed = v["raw"] == "packed"
    assert chunks.encode_raw(np.array(want, dtype=np.uint64), packed).blocks.tobytes() == blocks
    assert any(part[6] for part in parts) == packed


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vector_decodes_and_reencodes_byte_for_byte(path):
    # [B1]-[B9], [B11]-[B14], [H1]-[H5]: both decoders read the values; the
    # writer reproduces the bytes ([B9], and [B14] for coding 2).
    v, record, blocks = load(path)
    want = np.array([int(s) for s in v["values"]], dtype=np.uint64)
    code = HuffmanCode.from_bytes(record)
    np.testing.assert_array_equal(codec.decode(blocks, code), want)
    ref = []
    for i in range(0, len(blocks), 1024):
        ref += codec_reference.decode_block(blocks[i:i + 1024], record)
    assert ref == [int(s) for s in v["values"]]
    assert codec.encode(want, code).blocks.tobytes() == blocks


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_vector_rejected_by_both_decoders(path):
    v, record, blocks = load(path)
    code = HuffmanCode.from_bytes(record)
    if v["statement"] != "B2":  # the damage itself is rejected, not a stale checksum
        for i in range(0, len(blocks), 1024):
            crc = int.from_bytes(blocks[i:i + 4], "little")
            assert codec_reference.crc32c(blocks[i + 4:i + 1024]) == crc
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


def test_worked_example_of_coding_2_in_spec_is_what_the_writer_makes():
    # Section 9, coding 2: the restart table printed in the document, with the
    # block's checksum, is what the writer makes of the same values; both
    # decoders read it, and a probe at or above 1005 finds 1010 from record 2.
    text = (SPEC / "FORMAT.md").read_text()
    section = text[text.index("## 9. Worked example"):text.index("## 10.")]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    record = b"\x02" + bytes.fromhex("".join(blocks[0].split()))[1:]
    table = bytes.fromhex("".join(blocks[2].split()))
    code = HuffmanCode.from_bytes(record)
    block = bytes(codec.encode(np.array([1000, 1001, 1003, 1010, 1040], np.uint64), code).block(0))
    assert block[1024 - len(table):] == table and block[:4] == bytes.fromhex("e4e32190")
    assert section.count("`e4 e3 21 90`") == 1
    assert codec_reference.decode_block(block, record) == [1000, 1001, 1003, 1010, 1040]
    assert codec_reference.restart_points(block, record)[1] == (2, 1003, 7)
    assert codec.probe(block, code, 1010, 64, 0) == [1010]


def test_crc_check_value():
    # [C1]
    assert codec_reference.crc32c(b"123456789") == 0xE3069283


# --- the writer's rules, restart tables ([B9], [B13], [B14]) -----------------


def table_bytes(w):
    """T of 5.4."""
    return 1 + math.ceil(3 * (13 + w) / 8)


def spec_blocks(values, record):
    """[B9] and [B14] from the spec alone: (count, w) of each block a writer
    makes of values (w is None for codings 0 and 1)."""
    coding, lengths = record[0], record[2:]

    def fill(i, cap):  # fingerprints in a block whose first is values[i]
        used, j = 0, i + 1
        while j < len(values):
            d = values[j] ^ values[j - 1] if coding == 0 else values[j] - values[j - 1]
            h = d.bit_length() - 1
            if used + lengths[h] + h > cap:
                break
            used += lengths[h] + h
            j += 1
        return j - i

    out, i = [], 0
    while i < len(values):
        if coding == 2:
            most = fill(i, 8 * (1010 - table_bytes(0)))
            w = (values[i + 3 * most // 4] - values[i]).bit_length()
            n = fill(i, 8 * (1010 - table_bytes(w)))
        else:
            w, n = None, fill(i, 8 * 1010)
        out.append((n, w))
        i += n
    return out


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vector_fills_blocks_as_spec_says(path):
    # [B9], [B14]: each block's count, and coding 2's w, follow from the
    # values and the code lengths alone; [B11]: w is byte 1023.
    v, record, blocks = load(path)
    values = [int(s) for s in v["values"]]
    got = [(int.from_bytes(blocks[i + 4:i + 6], "little"), blocks[i + 1023] if record[0] == 2 else None)
           for i in range(0, len(blocks), 1024)]
    assert got == spec_blocks(values, record)


@pytest.mark.parametrize("path", RESTART_VECTORS, ids=lambda p: p.stem)
def test_decoding_from_each_restart_gives_the_tail(path):
    # [B13]: fingerprint e_r is first + value and entry e_r + 1 begins at
    # bit end; the records name e_r = floor(r count / 4) (5.4).
    v, record, blocks = load(path)
    for i in range(0, len(blocks), 1024):
        block = blocks[i:i + 1024]
        check_restarts(block, record, codec_reference.decode_block(block, record))


def check_restarts(block, record, full):
    """[B13] on one block: decoding from each restart point gives the tail of
    its full decode, and a reader looking for x may start at the last point
    with e_r >= 1 at or below x: nothing before it reaches x."""
    count = int.from_bytes(block[4:6], "little")
    points = codec_reference.restart_points(block, record)
    assert [e for e, _, _ in points] == [r * count // 4 for r in (1, 2, 3)]
    for e, value, end in points:
        assert value == full[e]
        assert list(codec_reference.iter_block(block, record, start=(e, value, end))) == full[e:]
    for x in (full[0], full[-1], *(value + d for _, value, _ in points for d in (-1, 0, 1))):
        usable = [pt for pt in points if pt[0] >= 1 and pt[1] <= x]
        if not usable:
            continue
        e, value, end = usable[-1]
        assert all(f < x for f in full[:e])
        tail = list(codec_reference.iter_block(block, record, start=(e, value, end)))
        assert [f for f in tail if f >= x] == [f for f in full if f >= x]


def test_restart_points_of_the_example():
    # 5.4 on block-example-restarts: count 5, so e_r = 1, 2, 3; entries end
    # at bits 3, 7 and 12 (section 9's bitstream); w = 4, T = 8.
    v, record, block = load(SPEC / "vectors" / "block-example-restarts.json")
    assert block[1023] == 4 and table_bytes(4) == 8
    assert codec_reference.restart_points(block, record) == [(1, 1001, 3), (2, 1003, 7), (3, 1010, 12)]
    # The bitstream is 8 (1010 - 8) bits: the rest up to the table is padding.
    assert block[14:17] == bytes.fromhex("04b9c0") and not any(block[17:1016])


# --- coding 2: C writer, C decoder, reference decoder and probe agree --------

U64 = st.integers(min_value=0, max_value=2**64 - 1)
M64 = 2**64 - 1


@st.composite
def sorted_tables(draw):
    """Sorted distinct uint64 arrays: random, dense, clustered, near 2^64, extremes."""
    kind = draw(st.sampled_from(["listed", "random", "dense", "clustered", "top", "extremes"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 2500))
    if kind == "listed":
        vals = np.array(draw(st.lists(U64, min_size=1, max_size=200)), dtype=np.uint64)
    elif kind == "random":
        vals = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    elif kind == "dense":  # gaps below 2^g: small h, long blocks
        g = draw(st.integers(0, 24))
        gaps = rng.integers(1, 2**g + 1, size=n, dtype=np.uint64)
        start = draw(st.integers(0, 2**63))
        vals = np.uint64(start) + np.cumsum(gaps)  # below 2^63 + n 2^24
    elif kind == "clustered":
        centres = rng.integers(0, 2**64 - 2**32, size=draw(st.integers(1, 5)), dtype=np.uint64)
        vals = (centres[:, None] + rng.integers(0, 2**draw(st.integers(1, 32)), size=(len(centres), n // 5 + 1),
                                                dtype=np.uint64)).ravel()
    elif kind == "top":
        vals = np.uint64(M64) - rng.integers(0, 2**draw(st.integers(1, 40)), size=n, dtype=np.uint64)
    else:
        vals = np.array(draw(st.lists(st.sampled_from([0, 1, 2, 3, 2**32, 2**63 - 1, 2**63, 2**63 + 1,
                                                       M64 - 2, M64 - 1, M64]), min_size=1)),
                        dtype=np.uint64)
    return np.unique(vals)


def probe_queries(data, values):
    """(q, p, k) triples: q equal or near a stored value, a few bits off one,
    below or above them all, or anywhere; p in 0..64, k in 0..8."""
    near = st.sampled_from(values).flatmap(lambda v: st.one_of(
        st.just(v),
        st.integers(-3, 3).map(lambda d: min(max(v + d, 0), M64)),
        st.lists(st.integers(0, 63), max_size=4).map(lambda bs: v ^ sum(1 << b for b in set(bs)))))
    edge = st.sampled_from(sorted({0, M64, max(values[0] - 1, 0), min(values[-1] + 1, M64)}))
    q = st.one_of(near, near, edge, U64)
    return data.draw(st.lists(st.tuples(q, st.integers(0, 64), st.integers(0, 8)), min_size=1, max_size=6))


def brute_force(values, q, p, k):
    return [v for v in values if (p == 0 or (v ^ q) >> (64 - p) == 0) and bin(v ^ q).count("1") <= k]


@given(sorted_tables(), st.one_of(st.none(), st.integers(2, 10**12)), st.data())
def test_coding2_c_and_reference_agree_and_probe_is_a_filter(x, density, data):
    # [B11]-[B14]: blocks the C writer makes decode the same in C and in the
    # reference, restart by restart ([B13]); a probe of each block is a
    # filter of its values by prefix and distance, whatever restart it
    # starts from.
    code = HuffmanCode.from_values(x, 2) if density is None else HuffmanCode.for_density(density, 2)
    record = code.to_bytes()
    enc = codec.encode(x, code)
    np.testing.assert_array_equal(codec.decode(enc, code), x)
    want = [int(v) for v in x]
    assert spec_blocks(want, record) == \
        [(int.from_bytes(enc.block(i)[4:6], "little"), enc.block(i)[1023]) for i in range(enc.n_blocks)]
    start = 0
    for i in range(enc.n_blocks):
        block = bytes(enc.block(i))
        ref = codec_reference.decode_block(block, record)
        assert [int(v) for v in codec.decode(block, code)] == ref == want[start:start + len(ref)]
        start += len(ref)
        if i < 3:
            check_restarts(block, record, ref)
        for q, p, k in probe_queries(data, ref):
            assert codec.probe(block, code, q, p, k) == brute_force(ref, q, p, k), (i, hex(q), p, k)
    assert start == len(want)


def test_probe_rejects_an_entry_that_runs_into_the_restart_table():
    # [B6], [B11]: probing for every value decodes every entry, so it meets
    # the overrun that decode rejects (as it does for codings 0 and 1).
    v, record, block = load(SPEC / "vectors" / "bad-restart-overrun.json")
    with pytest.raises(CorruptionError, match=v["error"]):
        codec.probe(block, HuffmanCode.from_bytes(record), 1000, 0, 64)


def test_vector_generator_reproduces_every_committed_vector(tmp_path):
    # The vectors are the contract: tools/make_vectors.py, run again, must
    # write the same bytes (an encoder heuristic that moved once changed
    # table-xor-2000's code; the generator now pins the tables' codes).
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_vectors",
                                                  SPEC.parent / "tools" / "make_vectors.py")
    make_vectors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_vectors)
    make_vectors.main(tmp_path)
    made = sorted(p.name for p in tmp_path.glob("*.json"))
    committed = sorted(p.name for p in (SPEC / "vectors").glob("*.json")
                       if p.name in made or p.name.startswith(("block-", "bad-", "table-")))
    assert made == committed
    for name in made:
        assert (tmp_path / name).read_bytes() == (SPEC / "vectors" / name).read_bytes(), name
