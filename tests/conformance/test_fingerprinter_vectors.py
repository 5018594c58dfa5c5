"""format-spec/vectors/fingerprinter-*: the record versions and the flip
probabilities of the default model ([FP61])."""

import json
import pathlib
import struct

import numpy as np

from ndindex.fingerprint import Fingerprinter, FlipModel

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "format-spec" / "vectors"
EXPECTED = json.loads((VECTORS / "fingerprinter-vectors.json").read_text())


def test_each_record_reads_with_its_version_and_model():  # [FP54], [FP61]
    for name in ("fingerprinter-v1.bin", "fingerprinter-v2.bin"):
        data = (VECTORS / name).read_bytes()
        want = EXPECTED[name]
        assert struct.unpack_from("<H", data, 4)[0] == want["version"]
        fp = Fingerprinter.from_bytes(data)
        model = None if want["flip_model"] is None else FlipModel.from_dict(want["flip_model"])
        assert fp.flip_model == model
        # every field but the flip model and the informative Unicode version is the default's
        mine, default = fp.to_dict(), Fingerprinter().to_dict()
        for d in (mine, default):
            d.pop("unicode_version"), d.pop("flip_model", None)
        assert mine == default
        assert Fingerprinter.from_bytes(fp.to_bytes()) == fp


def test_version_1_record_is_byte_for_byte_what_a_writer_without_model_writes():  # [FP54]
    data = (VECTORS / "fingerprinter-v1.bin").read_bytes()
    n = struct.unpack_from("<I", data, 6)[0]
    config = json.loads(data[10:10 + n])
    mine = Fingerprinter(flip_model=None).to_dict()
    mine["unicode_version"] = config["unicode_version"]   # informative: the writer's Python
    body = json.dumps(mine, sort_keys=True, separators=(",", ":")).encode()
    assert b"NDFP" + struct.pack("<HI", 1, len(body)) + body + struct.pack("<I", 0) == data


def test_flip_probabilities_of_the_worked_example():  # [FP80], [FP61]
    ex = EXPECTED["flip_probabilities"]
    fp = Fingerprinter(flip_model=FlipModel.from_dict(ex["model"]))
    _, weights = fp.simhash_with_weights(ex["text"])
    assert weights.tolist() == ex["weights"]
    want = np.array([float.fromhex(x) for x in ex["probabilities"]])
    assert np.allclose(fp.flip_probabilities(ex["text"]), want, rtol=1e-12, atol=0)
