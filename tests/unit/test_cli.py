"""Every subcommand of the ``ndindex`` command, in-process through cli.main."""

from __future__ import annotations

import io
import json
import sys

import pytest

import ndindex
from ndindex.cli import main
from ndindex.fingerprint import Fingerprinter

DOC = ("The quick brown fox jumps over the lazy dog while the farmer sleeps in the "
       "afternoon sun and the cows graze quietly in the green meadow by the river. ") * 4


def run(capsys, *argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def ix(tmp_path, capsys):
    path = str(tmp_path / "t.ndx")
    assert run(capsys, "create", path, "-k", "4", "-n", "1000")[0] == 0
    return path


def test_create_json(tmp_path, capsys):
    status, out, err = run(capsys, "create", str(tmp_path / "c.ndx"), "-k", "10", "--json")
    doc = json.loads(out)
    assert status == 0 and err == ""
    assert doc["path"] == str(tmp_path / "c.ndx") and doc["k"] == 10
    assert doc["fingerprinter"] is True and doc["tables"] >= 1 and doc["expected_n"] == 1_000_000
    with ndindex.open(tmp_path / "c.ndx") as index:
        assert Fingerprinter.from_bytes(index.fingerprinter) == Fingerprinter()


def test_add_from_stdin_and_query_fingerprint(ix, capsys, monkeypatch):
    lines = "# a comment\n0x0123456789abcdef https://example.org/a page\n\n42\n0x0123456789abcdee\n"
    status, out, _ = run(capsys, "add", ix, "--json", stdin=lines, monkeypatch=monkeypatch)
    assert status == 0 and json.loads(out) == {"added": 3, "skipped": 0, "invalid": 0,
                                                "fingerprints": 3}
    status, out, _ = run(capsys, "query", ix, "0x0123456789abcdec", "--json")
    doc = json.loads(out)
    assert status == 0 and doc["k"] == 4 and doc["query_hex"] == "0x0123456789abcdec"
    assert [(m["fingerprint_hex"], m["distance"]) for m in doc["matches"]] == \
        [("0x0123456789abcdee", 1), ("0x0123456789abcdef", 2)]
    assert doc["matches"][1]["keys"] == ["https://example.org/a page"]
    assert doc["matches"][0]["keys"] == []
    status, out, _ = run(capsys, "query", ix, "0x0123456789abcdec")
    assert status == 0 and "0x0123456789abcdef  distance  2  https://example.org/a page" in out
    status, out, _ = run(capsys, "query", ix, "12345", "-k", "0")
    assert status == 1 and "0 matches" in out                 # like grep: nothing found


def test_add_from_file_with_a_bad_line(ix, tmp_path, capsys):
    (tmp_path / "fps.txt").write_text("1\n2 two\nnot-a-number\n")
    status, out, err = run(capsys, "add", ix, str(tmp_path / "fps.txt"))
    assert status == 2 and out == ""
    assert err == (f"ndindex: {tmp_path / 'fps.txt'}:3: not a fingerprint: 'not-a-number' "
                   "(decimal or 0x-hex)\n"
                   f"ndindex: {tmp_path / 'fps.txt'}: 1 invalid line; nothing added "
                   "(--skip-invalid adds the valid ones)\n")


def test_add_documents_and_query_text_and_file(ix, tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(DOC)
    (tmp_path / "docs" / "b.bin").write_bytes(b"\0\1\2" * 100)
    status, out, err = run(capsys, "add", ix, "--docs", str(tmp_path / "docs"), "--json")
    assert status == 0 and json.loads(out) == {"added": 1, "skipped": 1, "invalid": 0,
                                               "fingerprints": 1}
    assert err == f"ndindex: {tmp_path / 'docs' / 'b.bin'}: looks binary, skipped\n"
    status, out, _ = run(capsys, "query", ix, "--text", DOC.replace("lazy", "sleepy"), "--json")
    doc = json.loads(out)
    assert status == 0 and doc["matches"][0]["keys"] == [str(tmp_path / "docs" / "a.txt")]
    (tmp_path / "q.txt").write_text(DOC)
    status, out, _ = run(capsys, "query", ix, "--file", str(tmp_path / "q.txt"), "--json")
    assert json.loads(out)["matches"][0]["distance"] == 0


def test_remove_compact_stats_verify(ix, capsys, monkeypatch):
    run(capsys, "add", ix, stdin="1 one\n2 two\n3\n", monkeypatch=monkeypatch)
    status, out, _ = run(capsys, "remove", ix, "--fingerprint", "3", "--key", "one", "--json")
    assert status == 0 and json.loads(out) == {"removed": 2, "fingerprints": 1}
    status, out, _ = run(capsys, "compact", ix, "--json")
    doc = json.loads(out)
    assert status == 0 and doc["entries"] == 1 and "blocks_rewritten" in doc and "seconds" in doc
    status, out, _ = run(capsys, "stats", ix, "--json")
    doc = json.loads(out)
    assert status == 0 and doc["fingerprints"] == 1 and doc["k"] == 4 and doc["log_entries"] == 0
    assert doc["tables"][0]["entries"] == 1
    status, out, _ = run(capsys, "stats", ix)
    assert status == 0 and out.startswith(f"{ix}: 1 fingerprints, k=4")
    status, out, _ = run(capsys, "verify", ix, "--json")
    doc = json.loads(out)
    assert status == 0 and doc["ok"] is True and doc["table_entries"] == 1
    status, out, _ = run(capsys, "verify", ix)
    assert status == 0 and out.startswith(f"{ix}: ok")


def test_export_import_round_trip(ix, tmp_path, capsys, monkeypatch):
    run(capsys, "add", ix, stdin="5 five\n0xffffffffffffffff max\n", monkeypatch=monkeypatch)
    dump = str(tmp_path / "t.ndxdump")
    status, out, err = run(capsys, "export", ix, "-o", dump)
    assert status == 0 and out == "" and err == f"exported 2 fingerprints and 2 keys to {dump}\n"
    status, out, _ = run(capsys, "import", dump, str(tmp_path / "copy.ndx"), "--json")
    assert status == 0 and json.loads(out) == {"index": str(tmp_path / "copy.ndx"),
                                               "fingerprints": 2, "keys": 2}
    run(capsys, "export", str(tmp_path / "copy.ndx"), "-o", str(tmp_path / "again.ndxdump"))
    assert (tmp_path / "again.ndxdump").read_bytes() == (tmp_path / "t.ndxdump").read_bytes()
    status, _, err = run(capsys, "export", ix, "-o", dump)
    assert status == 2 and err == f"ndindex: {dump}: already exists\n"


@pytest.mark.parametrize("argv, message", [
    (["stats", "{tmp}/missing.ndx"], "ndindex: {tmp}/missing.ndx: no such index"),
    (["verify", "{tmp}/junk"], "{tmp}/junk: not an ndindex file"),
    (["import", "{tmp}/junk", "{tmp}/new.ndx"], "{tmp}/junk: dump is not a valid zstd stream"),
    (["import", "{tmp}/nothing", "{tmp}/new.ndx"], "ndindex: {tmp}/nothing: No such file"),
    (["query", "{tmp}/t.ndx"], "one of the arguments"),
    (["query", "{tmp}/t.ndx", "0x1", "-k", "9"], "k=9 is outside 0..4"),
    (["create", "{tmp}/t.ndx"], "ndindex: {tmp}/t.ndx: already exists"),
    (["remove", "{tmp}/t.ndx"], "remove needs --fingerprint"),
    (["add", "{tmp}/t.ndx", "{tmp}/nothing"], "{tmp}/nothing: No such file"),
    (["dedup", "{tmp}", "--min-size", "lots"], "not a size"),
])
def test_errors_are_one_line_with_status_2(ix, tmp_path, capsys, argv, message):
    (tmp_path / "junk").write_bytes(b"x" * 10_000)
    argv = [a.format(tmp=tmp_path) for a in argv]
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("ndindex: ")
    assert message.format(tmp=tmp_path) in err


@pytest.mark.parametrize("command", ["create", "add", "query", "remove", "compact", "stats",
                                     "verify", "plan", "export", "import", "dedup"])
def test_every_subcommand_has_help_with_examples_and_exit_codes(capsys, command):
    status, out, _ = run(capsys, command, "--help")
    assert status == 0 and "examples:" in out and f"ndindex {command}" in out
    assert "exit status:" in out and "130" in out
