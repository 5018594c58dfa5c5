"""Conformance: format-spec/vectors/documents.json decodes as documents.md says."""

import json
import pathlib

import numpy as np
import pytest

from ndindex.docrecord import decode_record, encode_record
from ndindex.errors import CorruptionError, FormatError
from ndindex.fingerprint import Fingerprinter, extract
from ndindex.fingerprint.bands import KeyDesign, KeyMaker, deletion_keys, exact_key
from ndindex.documents import fingerprint_documents, verify, DocumentSketches

SPEC = pathlib.Path(__file__).resolve().parents[2] / "format-spec"
VECTORS = json.loads((SPEC / "vectors" / "documents.json").read_text())


@pytest.mark.parametrize("vector", VECTORS["records"], ids=lambda v: v["hex"][:16])
def test_records_decode_and_encode(vector):
    """[DR01]-[DR07], [DR14]: values, parameter choice, byte-exact encoding."""
    record = bytes.fromhex(vector["hex"])
    assert decode_record(record).tolist() == vector["values"]
    assert record[1] == vector["rice_parameter"]
    assert encode_record(np.array(vector["values"], np.uint32)) == record


@pytest.mark.parametrize("vector", VECTORS["bad_records"], ids=lambda v: v["why"])
def test_bad_records_raise_corruption(vector):
    """[DR02]-[DR04], [DR10]-[DR13]."""
    with pytest.raises(CorruptionError):
        decode_record(bytes.fromhex(vector["hex"]))


def test_worked_example():
    """Section 6: the record of [5, 900, 70000]."""
    assert encode_record(np.array([5, 900, 70000], np.uint32)).hex() == "010e030a007ec35b6f00"


@pytest.mark.parametrize("vector", VECTORS["keys"], ids=lambda v: v["text"][:20])
def test_lookup_keys(vector):
    """[DK20]-[DK24]: exact, band and deletion keys of texts, in order."""
    fp = Fingerprinter()
    maker = KeyMaker(KeyDesign(), fp.minhash_seed)
    feats = extract(fp.text(vector["text"]), fp.minhash_features)
    sketch = fp.sketch(vector["text"])
    assert sketch.tolist() == vector["sketch"]
    assert f"{exact_key(sketch):016x}" == vector["exact_key"]
    if vector["band_keys"]:
        assert [f"{k:016x}" for k in maker.band_keys(feats).tolist()] == vector["band_keys"]
    if vector["deletion_keys"]:
        assert [f"{k:016x}" for k in deletion_keys(sketch).tolist()] == vector["deletion_keys"]
    want = [vector["exact_key"]] + vector["band_keys"] + vector["deletion_keys"]
    assert vector["lookup_keys"] == want
    assert [f"{k:016x}" for k in maker.lookup_keys(feats, sketch).tolist()] == want
    docs = fingerprint_documents([vector["text"]], workers=1)
    assert [f"{k:016x}" for k in docs.lookup_keys(0).tolist()] == want


def test_key_design_record():
    """[DK40]-[DK41]."""
    record = bytes.fromhex(VECTORS["design"]["hex"])
    assert KeyDesign.from_bytes(record) == KeyDesign(VECTORS["design"]["bands"],
                                                     VECTORS["design"]["rows"])
    assert KeyDesign().to_bytes() == record
    for bad in (record[:-1], b"XXKD" + record[4:], record[:4] + b"\x02\x00" + record[6:],
                record[:6] + b"\x00\x00" + record[8:], record[:8] + b"\x41\x00"):
        with pytest.raises(FormatError):
            KeyDesign.from_bytes(bad)


@pytest.mark.parametrize("vector", VECTORS["similarity"], ids=str)
def test_similarity(vector):
    """[DV30]: the kernel's similarity of sketch pairs."""
    a, b = vector["a"], vector["b"]
    docs = DocumentSketches(np.array(a + b, np.uint32), np.array([0, len(a), len(a) + len(b)]),
                            np.empty(0, np.uint64), np.zeros(3, np.int64), vector["k"],
                            KeyDesign())
    assert verify(docs, [0], [1])[0] == pytest.approx(vector["similarity"])
