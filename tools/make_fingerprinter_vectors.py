"""Write the Fingerprinter record vectors in format-spec/vectors/ (fingerprinter.md [FP61]).

Deterministic for one Python (the records name its Unicode version, an
informative field).  Run: python tools/make_fingerprinter_vectors.py
"""

from __future__ import annotations

import json
import pathlib

from ndindex.fingerprint import Fingerprinter

OUT = pathlib.Path(__file__).resolve().parent.parent / "format-spec" / "vectors"
TEXT = "The quick brown fox jumps over the lazy dog."


def main() -> None:
    v1 = Fingerprinter(flip_model=None)
    v2 = Fingerprinter()
    (OUT / "fingerprinter-v1.bin").write_bytes(v1.to_bytes())
    (OUT / "fingerprinter-v2.bin").write_bytes(v2.to_bytes())
    _, weights = v2.simhash_with_weights(TEXT)
    probs = v2.flip_probabilities(TEXT)
    obj = {
        "fingerprinter-v1.bin": {"version": 1, "flip_model": None,
                                 "note": "the default configuration without a flip model"},
        "fingerprinter-v2.bin": {"version": 2, "flip_model": v2.flip_model.to_dict(),
                                 "note": "the default configuration"},
        "flip_probabilities": {
            "text": TEXT, "model": v2.flip_model.to_dict(),
            "weights": weights.tolist(),
            "probabilities": [float.hex(float(p)) for p in probs],
            "note": "V of the text under the default features, and p_j = "
                    "erfc((|V_j| / rms(V) - mu) / (sigma sqrt 2)) / 2 as float.hex; "
                    "a reader's libm may differ in the last bit"},
    }
    (OUT / "fingerprinter-vectors.json").write_text(json.dumps(obj, indent=1) + "\n")


if __name__ == "__main__":
    main()
