"""The `ndindex plan` subcommand, run in-process through ndindex.cli.main."""

import json

import pytest

import ndindex
from ndindex.cli import main
from ndindex.plan import Plan, choose_plan


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_plan_text_names_chosen_design_and_candidates(capsys):
    status, out, err = run(capsys, "plan", "-n", "10000000", "-k", "3")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "chosen: 4 tables, p=16..16 (4x16 choose 1)"
    assert "152.6 entries per probe" in lines[1]
    assert "estimated query cost 8 block decodes" in lines[1]
    rows = [line for line in lines if line.startswith("  ") and ".." in line and "choose" in line]
    chosen = [row for row in rows if row.lstrip().startswith("*")]
    assert len(chosen) == 1 and chosen[0].split()[1:3] == ["4", "16..16"]
    ten = next(row for row in rows if row.split()[0] == "10")
    assert ten.split()[1:4] == ["25..26", "0.298", "2.5"]      # t, p range, entries, rel. cost


def test_plan_count_suffixes_and_json(capsys):
    status, out, _ = run(capsys, "plan", "-n", "8B", "-k", "3", "--json")
    assert status == 0
    doc = json.loads(out)
    assert doc["n"] == 8_000_000_000 and doc["k"] == 3
    assert doc["chosen"]["tables"] == 10
    assert (doc["chosen"]["p_min"], doc["chosen"]["p_max"]) == (25, 26)
    assert Plan.from_bytes(bytes.fromhex(doc["chosen"]["plan_record_hex"])) == \
        choose_plan(8_000_000_000, 3)
    assert [c["chosen"] for c in doc["candidates"]].count(True) == 1
    for c in doc["candidates"]:
        assert set(c) >= {"tables", "p_min", "p_max", "expected_probe_entries",
                          "estimated_query_cost", "relative_query_cost", "scheme"}


def test_plan_max_tables_marks_excluded_candidates(capsys):
    status, out, _ = run(capsys, "plan", "-n", "8e9", "-k", "3", "--max-tables", "9", "--json")
    doc = json.loads(out)
    assert status == 0 and doc["chosen"]["tables"] == 4
    assert all(c["within_budget"] == (c["tables"] <= 9) for c in doc["candidates"])


def test_plan_tables_flag_prints_every_table(capsys):
    status, out, _ = run(capsys, "plan", "-n", "1M", "-k", "3", "--tables")
    assert status == 0
    assert out.count("  table ") == 4
    assert "table 1: p=16  in[47:32]->out[63:48]" in out


@pytest.mark.parametrize("argv, message", [
    (["plan", "-n", "10", "-k", "13"], "k must be in 0..12, got 13"),
    (["plan", "-n", "0", "-k", "3"], "expected_n must be in 1..2^64-1"),
    (["plan", "-n", "1e30", "-k", "3"], "expected_n must be in 1..2^64-1"),
    (["create", "big.ndx", "-n", "1e30"], "expected_n must be in 1..2^64-1"),
    (["plan", "-n", "1e6", "-k", "3", "--max-tables", "2"], "too few for k=3"),
    (["plan", "-n", "ten", "-k", "3"], "not a count"),
    (["plan", "-k", "3"], "required: -n"),
    ([], "required: COMMAND"),
])
def test_errors_are_one_line_with_status_2(capsys, argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)         # create's file name is relative
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("ndindex: error: ") and message in err


def test_help_exits_zero(capsys):
    status, out, _ = run(capsys, "plan", "--help")
    assert status == 0 and "--max-tables" in out


def test_version_names_the_package_and_the_file_format_it_writes(capsys):
    from ndindex.records import FORMAT_VERSION
    status, out, _ = run(capsys, "--version")
    assert status == 0
    assert out.strip() == f"ndindex {ndindex.__version__} (file format {FORMAT_VERSION})"
