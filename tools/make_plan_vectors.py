"""Write the plan-record test vectors: format-spec/vectors/plans.json (FORMAT.md section 6).

Run:  python tools/make_plan_vectors.py
Deterministic: running it again leaves the file unchanged, which
tests/conformance/test_plan_vectors.py checks.  Each valid vector gives the
record (hex) and the fields a reader must find; each invalid one the record,
a word of the reader's error and the statement it breaks.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ndindex.plan import Plan, TableDesign, example_3_1, psm_plan  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "format-spec", "vectors",
                   "plans.json")
IDENTITY = tuple(range(63, -1, -1))


def valid(name: str, plan: Plan) -> dict:
    return {"name": name, "record": plan.to_bytes().hex(), "k": plan.k,
            "t": len(plan.tables), "probabilistic": plan.probabilistic,
            "prefix_bits": [t.prefix_bits for t in plan.tables],
            "permutations": [list(t.permutation) for t in plan.tables]}


def invalid(name: str, record: bytes, error: str, statement: str) -> dict:
    return {"name": name, "record": record.hex(), "error": error, "statement": statement}


def vectors() -> dict:
    """The vectors, as plans.json holds them."""
    four = example_3_1(4).to_bytes()
    psm = psm_plan(10_000_000, 3, header_bits=23)
    low_bits = tuple(range(11, -1, -1)) + tuple(range(63, 11, -1))
    permuted = Plan(k=10, tables=(TableDesign(low_bits, 12),), probabilistic=True)

    def patched(data: bytes, offset: int, value: int) -> bytes:
        out = bytearray(data)
        out[offset] = value
        return bytes(out)

    repeat = bytearray(four)
    repeat[4 + 65 * 3 + 1] = 17            # table 3 starts 15, 14, ...; 17 appears later too
    return {
        "note": "plan records (FORMAT.md section 6); made by tools/make_plan_vectors.py",
        "valid": [
            valid("example-3.1-four-tables", example_3_1(4)),
            valid("probabilistic-k3-p23", psm),
            valid("probabilistic-permuted-k10-p12", permuted),
            valid("one-table-scan-p0", Plan(k=0, tables=(TableDesign(IDENTITY, 0),))),
        ],
        "invalid": [
            invalid("short", four[:2], "expected at least 4", "P1"),
            invalid("length-off-by-one", four[:-1], "expected 264", "P1"),
            invalid("f-32", patched(four, 0, 32), "f is 32", "P2"),
            invalid("k-64", patched(four, 1, 64), "k is 64", "P3"),
            invalid("t-0", bytes([64, 3, 0, 0]), "t is 0", "P4"),
            invalid("flags-bit-1", patched(four, 3, 0x02), "reserved bits 0x02", "P5"),
            invalid("flags-bit-7-probabilistic", patched(psm.to_bytes(), 3, 0x81),
                    "reserved bits 0x80", "P5"),
            invalid("prefix-65", patched(four, 4 + 65 * 2, 65), "prefix_bits is 65", "P6"),
            invalid("permutation-byte-64", patched(four, 4 + 65 * 3 + 6, 64),
                    "permutation byte 5 is 64", "P7"),
            invalid("permutation-repeats", bytes(repeat), "repeats bit 17", "P7"),
            invalid("probabilistic-four-tables", patched(four, 3, 0x01),
                    "probabilistic (flags bit 0) with t=4", "P13"),
        ],
    }


def main() -> int:
    with open(OUT, "w") as fh:
        json.dump(vectors(), fh, indent=1)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
