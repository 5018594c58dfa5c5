"""Conformance: the plan-record vectors and the probabilistic example of FORMAT.md section 6.

Each test cites the statements it checks; format-spec/vectors/plans.json is
made by tools/make_plan_vectors.py.
"""

import importlib.util
import json
import pathlib
import re

import pytest

from ndindex.errors import FormatError
from ndindex.plan import F_BITS, Plan, flip_set_count, psm_plan

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = ROOT / "format-spec"
VECTORS = json.loads((SPEC / "vectors" / "plans.json").read_text())


@pytest.mark.parametrize("v", VECTORS["valid"], ids=lambda v: v["name"])
def test_valid_plan_vector_reads_and_rewrites_byte_for_byte(v):
    # [P1]-[P8], [P13]: the fields as listed; the writer gives back the bytes.
    record = bytes.fromhex(v["record"])
    plan = Plan.from_bytes(record)
    assert (plan.k, len(plan.tables), plan.probabilistic) == (v["k"], v["t"], v["probabilistic"])
    assert [t.prefix_bits for t in plan.tables] == v["prefix_bits"]
    assert [list(t.permutation) for t in plan.tables] == v["permutations"]
    assert record[3] == (1 if v["probabilistic"] else 0)                     # [P5]
    assert plan.to_bytes() == record


@pytest.mark.parametrize("v", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_plan_vector_is_rejected(v):
    with pytest.raises(FormatError, match=re.escape(v["error"])):
        Plan.from_bytes(bytes.fromhex(v["record"]))
    assert re.fullmatch(r"P\d+", v["statement"])


def test_vectors_are_what_the_generator_makes():
    spec = importlib.util.spec_from_file_location("make_plan_vectors",
                                                  ROOT / "tools" / "make_plan_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.vectors() == VECTORS
    assert {v["statement"] for v in VECTORS["invalid"]} >= {"P1", "P2", "P3", "P4", "P5", "P6",
                                                            "P7", "P13"}


def _section_6() -> str:
    text = (SPEC / "FORMAT.md").read_text()
    return text[text.index("### Probabilistic plans"):text.index("### How the reference planner")]


def test_spec_probabilistic_record_is_what_psm_plan_writes():
    # [P5], [P13]: the hex dump of the k = 3, p = 23 record in section 6.
    rows = re.findall(r"^    [0-9a-f]{4}: ((?:[0-9a-f]{2} )*[0-9a-f]{2})", _section_6(), re.M)
    record = bytes.fromhex("".join(r.replace(" ", "") for r in rows))
    assert len(record) == 4 + 65
    assert record == psm_plan(10_000_000, 3, header_bits=23).to_bytes()
    assert record[3] == 0x01


def test_spec_probabilistic_probe_example():
    # [P13]: Q, F, the prefixes, S and the distance rule d(F, Q) = d(F, Q_S) + |S|.
    section = _section_6()
    q, f = 0x0123456789ABCDEF, 0x0123456789ABCDEF ^ (1 << 62) ^ (1 << 45) ^ (1 << 3)
    p, shift = 23, F_BITS - 23
    assert f"`{f:#018X}`".replace("0X", "0x") in section
    assert f"`{q >> shift:#08X}`".replace("0X", "0x") in section
    assert f"`{f >> shift:#08X}`".replace("0X", "0x") in section
    s = (q >> shift) ^ (f >> shift)
    assert s == 0x200010 and f"`{s:#08x}`" in section
    q_s = q ^ (s << shift)
    assert f"`{q_s:#018X}`".replace("0X", "0x") in section
    lo = (f >> shift) << shift
    assert f"`{lo:#018X}`".replace("0X", "0x") in section
    assert bin(f ^ q).count("1") == bin(f ^ q_s).count("1") + bin(s).count("1") == 3
    assert flip_set_count(p, 3) == 2048 and "2,048" in section
