"""Flip probabilities (ndindex.fingerprint.volatility) and the version-2
Fingerprinter record that stores their model (format-spec/fingerprinter.md)."""

import json
import math
import struct

import numpy as np
import pytest

from ndindex.errors import FormatError
from ndindex.fingerprint import DEFAULT_FLIP_MODEL, Fingerprinter, FlipModel, normalised_margins


def test_probabilities_follow_the_normal_survival_of_the_margin():  # [FP80]
    v = np.zeros(64)
    v[:4] = [2.0, -1.0, 0.0, 0.5]
    model = FlipModel(mu=0.1, sigma=0.3)
    rms = math.sqrt((4 + 1 + 0.25) / 64)
    p = model.probabilities(v)
    for j in range(64):
        want = 0.5 * math.erfc((abs(v[j]) / rms - 0.1) / (0.3 * math.sqrt(2)))
        assert p[j] == pytest.approx(want, rel=1e-12)
    assert p[2] == p[10] > p[3] > p[1] > p[0]        # small margin: volatile


def test_rows_and_empty_documents():
    model = FlipModel(mu=0.0, sigma=0.25)
    v = np.random.default_rng(1).normal(size=(5, 64))
    assert np.array_equal(model.probabilities(v)[3], model.probabilities(v[3]))
    assert np.allclose(model.probabilities(np.zeros(64)), 0.5)   # no features: z = 0
    assert np.array_equal(normalised_margins(np.zeros(64)), np.zeros(64))
    with pytest.raises(ValueError, match="shape"):
        model.probabilities(np.zeros(63))


def test_fit_recovers_a_planted_weight_change():
    rng = np.random.default_rng(7)
    a = rng.normal(size=(4000, 64)) * rng.uniform(1, 50, size=(4000, 1))   # any scale
    rms = np.sqrt((a * a).mean(axis=1, keepdims=True))
    b = a + rng.normal(scale=0.2, size=a.shape) * rms
    model = FlipModel.fit(a, b)
    # b -> a is used too, where b's own sign leans with the change: a small mu
    assert abs(model.mu) < 0.03 and model.sigma == pytest.approx(0.2, rel=0.05)
    # calibrated: predicted flips per pair match the observed count
    predicted = model.probabilities(a).sum(axis=1).mean()
    observed = ((a > 0) != (b > 0)).sum(axis=1).mean()
    assert predicted == pytest.approx(observed, rel=0.15)


@pytest.mark.parametrize("bad", [
    dict(mu=0.0, sigma=0.0), dict(mu=0.0, sigma=-1.0), dict(mu=float("nan"), sigma=1.0),
    dict(mu=0.0, sigma=float("inf")), dict(mu="0", sigma=1.0)])
def test_invalid_models_are_rejected(bad):
    with pytest.raises(ValueError):
        FlipModel(**bad)


def test_fit_needs_pairs_of_equal_shape():
    with pytest.raises(ValueError, match="equal shape"):
        FlipModel.fit(np.zeros((2, 64)), np.zeros((3, 64)))


def test_flip_probabilities_of_text_and_of_weights_agree():
    fp = Fingerprinter()
    text = "a short text about licences, copyright holders and their permissions"
    _, v = fp.simhash_with_weights(text)
    assert np.array_equal(fp.flip_probabilities(text), fp.flip_probabilities(v))
    assert np.array_equal(fp.flip_probabilities(text.encode()), fp.flip_probabilities(v))
    assert np.array_equal(Fingerprinter(flip_model=None).flip_probabilities(v),
                          DEFAULT_FLIP_MODEL.probabilities(v))


def record(fp: Fingerprinter) -> tuple[int, dict, bytes]:
    data = fp.to_bytes()
    version, n = struct.unpack_from("<HI", data, 4)
    return version, json.loads(data[10:10 + n]), data


def with_json(data: bytes, config: dict, version: int) -> bytes:
    body = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    n = struct.unpack_from("<I", data, 6)[0]
    return b"NDFP" + struct.pack("<HI", version, len(body)) + body + data[10 + n:]


def test_versions_written_and_read():  # [FP54]
    version, config, data = record(Fingerprinter())
    assert version == 2 and config["flip_model"] == DEFAULT_FLIP_MODEL.to_dict()
    assert Fingerprinter.from_bytes(data) == Fingerprinter()
    version, config, data = record(Fingerprinter(flip_model=None))
    assert version == 1 and "flip_model" not in config
    back = Fingerprinter.from_bytes(data)
    assert back.flip_model is None and back.to_bytes() == data
    custom = Fingerprinter(flip_model=FlipModel(mu=-0.5, sigma=2.0))
    assert Fingerprinter.from_bytes(custom.to_bytes()).flip_model == FlipModel(-0.5, 2.0)


def test_version_and_key_mismatches_are_rejected():  # [FP53], [FP54]
    _, config, data = record(Fingerprinter())
    with pytest.raises(FormatError, match="version 1 keys"):
        Fingerprinter.from_bytes(with_json(data, config, 1))       # v1 with a model
    del config["flip_model"]
    with pytest.raises(FormatError, match="version 2 keys"):
        Fingerprinter.from_bytes(with_json(data, config, 2))       # v2 without one


@pytest.mark.parametrize("model", [
    {"kind": "normal", "margin": "rms", "mu": 0.0},
    {"kind": "normal", "margin": "rms", "mu": 0.0, "sigma": 0.0},
    {"kind": "laplace", "margin": "rms", "mu": 0.0, "sigma": 1.0},
    {"kind": "normal", "margin": "raw", "mu": 0.0, "sigma": 1.0},
    {"kind": "normal", "margin": "rms", "mu": True, "sigma": 1.0},
    [0.0, 1.0],
])
def test_invalid_stored_models_are_format_errors(model):  # [FP81]
    _, config, data = record(Fingerprinter())
    config["flip_model"] = model
    with pytest.raises(FormatError, match="flip model|invalid fingerprinter"):
        Fingerprinter.from_bytes(with_json(data, config, 2))
