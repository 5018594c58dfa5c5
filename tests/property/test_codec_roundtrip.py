"""Hypothesis: codec round trips and C / reference decoder agreement."""

import numpy as np
from hypothesis import given, strategies as st

from ndindex import codec, codec_reference
from ndindex.codec import HuffmanCode

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@st.composite
def fingerprint_sets(draw):
    """Random, clustered and adversarial sorted distinct arrays."""
    kind = draw(st.sampled_from(["random", "clustered", "runs", "extremes"]))
    if kind == "random":
        vals = draw(st.lists(U64, min_size=1, max_size=600))
    elif kind == "clustered":
        centres = draw(st.lists(U64, min_size=1, max_size=5))
        offs = draw(st.lists(st.integers(0, 2**20), min_size=1, max_size=400))
        vals = [(c + o) % 2**64 for c in centres for o in offs]
    elif kind == "runs":  # long runs of near-identical values
        start = draw(U64)
        vals = [(start + i) % 2**64 for i in range(draw(st.integers(1, 3000)))]
    else:
        vals = draw(st.lists(st.sampled_from([0, 1, 2, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]),
                             min_size=1))
    return np.unique(np.array(vals, dtype=np.uint64))


@given(fingerprint_sets(), st.sampled_from([0, 1]), st.integers(2, 10**10))
def test_round_trip(x, coding, density):
    code = HuffmanCode.for_density(density, coding)
    enc = codec.encode(x, code)
    np.testing.assert_array_equal(codec.decode(enc, code), x)


@given(fingerprint_sets(), st.sampled_from([0, 1]))
def test_reference_decoder_agrees(x, coding):
    code = HuffmanCode.from_values(x, coding)
    enc = codec.encode(x, code)
    record = code.to_bytes()
    n_blocks = min(enc.n_blocks, 4)
    got = []
    for i in range(n_blocks):
        got += codec_reference.decode_block(bytes(enc.block(i)), record)
    from_c = codec.decode(enc.blocks[:n_blocks * codec.BLOCK_BYTES], code)
    np.testing.assert_array_equal(np.array(got, dtype=np.uint64), from_c)


@given(st.binary(min_size=1024, max_size=1024), st.sampled_from([0, 1]), st.booleans())
def test_decoders_agree_on_arbitrary_bytes(block, coding, fix_crc):
    """Any bytes: both decoders give the same values or both raise CorruptionError."""
    from ndindex import _core
    from ndindex.errors import CorruptionError
    b = bytearray(block)
    if fix_crc:
        b[0:4] = _core.crc32c(bytes(b[4:])).to_bytes(4, "little")
        b[4:6] = (int.from_bytes(b[4:6], "little") % 64).to_bytes(2, "little")
        b[0:4] = _core.crc32c(bytes(b[4:])).to_bytes(4, "little")
    code = HuffmanCode.for_density(10**6, coding)
    try:
        c_result = list(codec.decode(bytes(b), code))
    except CorruptionError:
        c_result = None
    try:
        r_result = codec_reference.decode_block(bytes(b), code.to_bytes())
    except CorruptionError:
        r_result = None
    assert c_result == r_result
