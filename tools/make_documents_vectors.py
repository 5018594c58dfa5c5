#!/usr/bin/env python3
"""Write format-spec/vectors/documents.json: the test vectors of
format-spec/documents.md (records, lookup keys, key design, similarity).

    python tools/make_documents_vectors.py

The conformance test (tests/conformance/test_documents_vectors.py) decodes
every vector with the reference code and compares field by field.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from ndindex.docrecord import encode_record
from ndindex.fingerprint import Fingerprinter, bottom_k_jaccard, extract
from ndindex.fingerprint.bands import KeyDesign, KeyMaker, deletion_keys, exact_key

OUT = pathlib.Path(__file__).resolve().parents[1] / "format-spec" / "vectors" / "documents.json"

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "The quick brown fox jumps over the lazy dog again.",
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this "
    "software and associated documentation files (the \"Software\"), to deal in the Software "
    "without restriction.",
]


def main() -> None:
    rng = np.random.default_rng(2026)
    sketches = [[], [0], [2**32 - 1], [5, 900, 70000], [0, 1, 2, 3],
                sorted(rng.choice(2**32, 12, replace=False).tolist()),
                sorted(rng.choice(2**20, 40, replace=False).tolist())]
    records = [{"values": s, "rice_parameter": encode_record(np.array(s, np.uint32))[1],
                "hex": encode_record(np.array(s, np.uint32)).hex()} for s in sketches]
    good = encode_record(np.array([5, 900, 70000], np.uint32))
    bad = [
        {"hex": "", "statement": "DR02", "why": "shorter than 3 bytes"},
        {"hex": "02" + good[1:].hex(), "statement": "DR02", "why": "version 2"},
        {"hex": "0120" + good[2:].hex(), "statement": "DR02", "why": "parameter 32"},
        {"hex": good[:2].hex() + "8300" + good[3:].hex(), "statement": "DR03",
         "why": "count not minimally coded"},
        {"hex": good[:-1].hex(), "statement": "DR10", "why": "truncated"},
        {"hex": good.hex() + "00", "statement": "DR13", "why": "trailing byte"},
        {"hex": good[:-1].hex() + bytes([good[-1] | 0x80]).hex(), "statement": "DR12",
         "why": "nonzero padding"},
        {"hex": "011f02" + "ff" * 12, "statement": "DR11", "why": "value above 2^32 - 1"},
        {"hex": "010300", "statement": "DR04", "why": "empty record with parameter 3"},
    ]
    fp = Fingerprinter()
    maker = KeyMaker(KeyDesign(), fp.minhash_seed)
    keys = []
    for text in TEXTS:
        feats = extract(fp.text(text), fp.minhash_features)
        sketch = fp.sketch(text)
        keys.append({"text": text, "sketch": sketch.tolist(),
                     "exact_key": f"{exact_key(sketch):016x}",
                     "band_keys": [f"{k:016x}" for k in maker.band_keys(feats).tolist()]
                     if len(sketch) >= maker.design.rows else [],
                     "deletion_keys": [f"{k:016x}" for k in deletion_keys(sketch).tolist()]
                     if 5 <= len(sketch) <= 9 else [],
                     "lookup_keys": [f"{k:016x}" for k in maker.lookup_keys(feats, sketch)]})
    sims = []
    for a, b, k in [([1, 2, 3], [2, 3, 4], 1024), ([1, 2, 3], [2, 3, 4], 2), ([], [], 4),
                    ([], [7], 4), ([1, 5, 9, 12], [1, 5, 10, 12], 3)]:
        sims.append({"a": a, "b": b, "k": k,
                     "similarity": bottom_k_jaccard(np.array(a), np.array(b), k)})
    design = {"bands": 20, "rows": 5, "hex": KeyDesign().to_bytes().hex()}
    OUT.write_text(json.dumps({"records": records, "bad_records": bad, "keys": keys,
                               "design": design, "similarity": sims}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
