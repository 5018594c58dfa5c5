"""The docs pages' examples and the README's dedup command run as written.

A docs page's examples are its ```python blocks and the shell commands of
its ```sh run blocks.  Each page runs in a fresh temporary directory: first
its shell commands, one by one with bash, then its python blocks in order as
one script (later blocks use what earlier ones made) in a new interpreter,
so the examples run exactly as a reader would run them.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ndindex.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["embedding", "dedup", "batch"]
LICENSES = "/usr/share/common-licenses"
# Commands whose documented exit status 1 means "found" or "none", not failure.
STATUS_1_OK = ("ndindex dedup", "ndindex query")


def blocks(text: str, kind: str) -> list[str]:
    return [body for fence, body in re.findall(r"^```([^\n]*)\n(.*?)^```", text, re.S | re.M)
            if fence.strip() == kind]


def indented_blocks(text: str) -> list[list[str]]:
    """The indented (4-space) blocks of a markdown text, as lists of lines."""
    out, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("    "):
            current.append(line[4:])
        elif line.strip() == "" and current:
            current.append("")
        elif current:
            while current and current[-1] == "":
                current.pop()
            out.append(current)
            current = []
    return out


def environment() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def run_shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=environment(),
                          capture_output=True, text=True, timeout=120)
    allowed = (0, 1) if command.startswith(STATUS_1_OK) else (0,)
    assert done.returncode in allowed, f"{command}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.parametrize("page", PAGES)
def test_every_example_of_the_page_runs(page, tmp_path):
    text = (ROOT / "docs" / f"{page}.md").read_text()
    shell = [line for body in blocks(text, "sh run") for line in body.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    python = blocks(text, "python")
    assert python, f"docs/{page}.md has no python example"
    for command in shell:
        run_shell(command, tmp_path)
    (tmp_path / "page.py").write_text("\n\n".join(python))
    done = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_embedding_opens_what_it_made_when_run_again(tmp_path):
    first = blocks((ROOT / "docs" / "embedding.md").read_text(), "python")[0]
    (tmp_path / "first.py").write_text(first)
    for _ in range(2):
        done = subprocess.run([sys.executable, "first.py"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr


def test_dedup_page_shows_what_the_command_prints(tmp_path):
    """The report pasted in docs/dedup.md is what its commands print (in /tmp/demo)."""
    text = (ROOT / "docs" / "dedup.md").read_text()
    setup = [line for line in blocks(text, "sh run")[0].splitlines() if line.strip()]
    for command in setup[:-1]:
        run_shell(command, tmp_path)
    shown = indented_blocks(text)[0]
    printed = run_shell(setup[-1], tmp_path).stdout.replace(str(tmp_path), "/tmp/demo")
    assert printed.splitlines() == shown


def readme_outputs() -> tuple[list[str], list[str]]:
    """The two dedup reports the README shows: plain, then --follow-symlinks."""
    shown = [b for b in indented_blocks((ROOT / "README.md").read_text())
             if b and b[0].startswith(("ndindex: index", "cluster 1:"))]
    plain, followed = shown[0], shown[1]
    assert plain[0].startswith("ndindex: index ")     # stderr, not compared
    return plain[1:], followed


@pytest.mark.skipif(not os.path.isdir(LICENSES), reason=f"no {LICENSES} on this machine")
def test_readme_dedup_command_prints_what_the_readme_shows(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    plain, followed = readme_outputs()
    assert main(["dedup", LICENSES]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == plain
    assert err.startswith("ndindex: index ") and "dedup-b8ba2bc7cb9456cc.ndx" in err
    assert main(["dedup", LICENSES]) == 1
    assert "14 files checked (0 read, 14 unchanged)" in capsys.readouterr().out
    assert main(["dedup", LICENSES, "--follow-symlinks"]) == 1
    assert capsys.readouterr().out.splitlines() == followed


def test_readme_dedup_command_on_a_generated_tree(tmp_path, capsys, monkeypatch):
    """Where /usr/share/common-licenses is absent: the same command and report
    shape on a tree like it (two near-duplicates, symlinks sorting first)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "licenses"
    root.mkdir()
    rng = random.Random(7)
    words = [f"term{rng.randrange(3000)}" for _ in range(3000)]
    (root / "DOC-1").write_text(" ".join(words))
    (root / "DOC-2").write_text(" ".join(words[:2800] + ["revised"] * 40 + words[2800:]))
    (root / "OTHER").write_text(" ".join(rng.sample(words, 2000)))
    os.symlink("DOC-2", root / "DOC")
    assert main(["dedup", str(root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cluster 1: 2 near-duplicates")
    assert out[1].startswith("  *") and out[1].endswith("DOC-2")
    assert out[-2] == "3 files checked (3 read, 0 unchanged); skipped: 1 symlink not followed."
    assert main(["dedup", str(root), "--follow-symlinks"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2].strip() == f"also {root / 'DOC'} (symlink, not a copy)"
    assert out[-2] == ("3 files checked (0 read, 3 unchanged); 1 symlink to files or "
                       "directories already counted (links, not copies).")


def test_readme_quick_start_runs_twice(tmp_path):
    """The Quick start as written, twice in one directory: the second run opens
    the index the first one made (exist_ok) and prints the same."""
    readme = (ROOT / "README.md").read_text()
    quick = blocks(readme[readme.index("## Quick start"):], "python")[0]
    assert "exist_ok=True" in quick
    (tmp_path / "quick.py").write_text(quick)
    printed = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "quick.py"], cwd=tmp_path, env=environment(),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        printed.append(done.stdout)
    assert printed[0] == printed[1] and float(printed[0]) > 0


def test_readme_layout_lists_every_module_and_folder():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.index("\n## ")]
    listed = {line.split()[0] for line in layout.splitlines()
              if re.match(r"^ {6}\S", line)}           # the package's entries
    package = {p.name for p in (ROOT / "ndindex").glob("*.py")}
    package |= {p.name + "/" for p in (ROOT / "ndindex").iterdir()
                if p.is_dir() and (p.name == "_core" or (p / "__init__.py").exists())}
    assert package <= listed, sorted(package - listed)
    assert listed <= package, sorted(listed - package)      # nothing that is gone
    tops = {line.split()[0] for line in layout.splitlines() if re.match(r"^ {4}\S", line)}
    assert tops == {"ndindex/", "docs/", "format-spec/", "tests/", "fuzz/", "tools/"}
    for name in re.findall(r"[\w-]+\.md", layout[layout.index("docs/"):layout.index("tests/")]):
        assert (ROOT / "docs" / name).exists() or (ROOT / "format-spec" / name).exists(), name


def test_readme_key_cost_holds_at_small_scale(tmp_path):
    """README "What it costs": a fully compacted file grows by less than the
    key's length + 16 bytes per URL-like key (bench_keys.py measures it at 400,000)."""
    import numpy as np

    import ndindex
    n = 20_000
    fps = np.unique(np.random.default_rng(3).integers(0, 2**64, n, dtype=np.uint64))
    keys = [f"https://news.example.com/section{i % 13}/2024/{i % 12 + 1:02d}/"
            f"story-{i * 7919 % 100_003}.html" for i in range(len(fps))]
    sizes = []
    for name, ks in (("plain", None), ("keyed", keys)):
        path = tmp_path / f"{name}.ndx"
        with ndindex.Index.create(path, k=3, expected_n=len(fps)) as ix:
            for start in range(0, len(fps), 5000):
                ix.add(fps[start:start + 5000], keys=None if ks is None else ks[start:start + 5000])
            ix.compact(full=True)
        sizes.append(os.path.getsize(path))
    per_key = (sizes[1] - sizes[0]) / len(fps)
    key_length = sum(len(k) for k in keys) / len(keys)
    assert per_key <= key_length + 16, (per_key, key_length)


def test_docs_are_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        assert f"(docs/{page}.md)" in readme
