"""ndindex/__init__.py and the cli modules import lazily: what loads with `import ndindex` and `ndindex query`.

Each check runs in a fresh interpreter, since this test process has
imported everything already.  Speed is measured by tools/bench/bench_open.py;
these tests pin down which modules load, which is what the speed follows.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import numpy as np
import pytest

import ndindex
from ndindex.index import Index

#: Modules neither `import ndindex` nor a fingerprint query needs.
HEAVY_FOR_QUERY = ["ndindex.fingerprint", "ndindex.batch", "ndindex.dedup", "ndindex.documents",
                   "ndindex.textfile", "ndindex.upgrade", "ndindex.dump", "sqlite3",
                   "multiprocessing", "csv", "dask",
                   # a reader neither batches on threads nor makes random names
                   "concurrent.futures", "secrets", "ndindex.recover"]
#: ... and these `import ndindex` alone does not need either.
HEAVY_FOR_IMPORT = HEAVY_FOR_QUERY + ["zstandard", "numpy", "lmdb", "ndindex.index"]


def loaded_after(code: str) -> set:
    """The modules loaded in a fresh interpreter after running code."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_ndindex_loads_no_heavy_module():
    loaded = loaded_after("import ndindex")
    assert "ndindex.errors" in loaded
    assert sorted(loaded & set(HEAVY_FOR_IMPORT)) == []


def test_cli_query_of_a_fingerprint_loads_only_the_index(tmp_path):
    path = str(tmp_path / "ix.ndx")
    with Index.create(path, k=3, expected_n=1000) as ix:
        ix.add(np.arange(1, 1001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    fp = (5 * 0x9E3779B97F4A7C15) % (1 << 64) ^ 1
    loaded = loaded_after(f"from ndindex.cli import main\n"
                          f"assert main(['query', {path!r}, '{fp:#x}']) == 0")
    assert "ndindex.index" in loaded
    assert sorted(loaded & set(HEAVY_FOR_QUERY)) == []


@pytest.mark.parametrize("name", ndindex.__all__)
def test_every_public_name_resolves_to_its_module_object(name):
    value = getattr(ndindex, name)
    if name in ndindex._SOURCES:
        assert value is getattr(importlib.import_module(ndindex._SOURCES[name]), name)
    assert name in dir(ndindex)


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        ndindex.no_such_name  # noqa: B018


def test_star_import_gives_every_public_name():
    names = {}
    exec("from ndindex import *", names)  # noqa: S102
    assert set(ndindex.__all__) <= set(names)


@pytest.mark.parametrize("first", ["import importlib; importlib.import_module('ndindex.dedup')",
                                   "import ndindex.dedup", "import ndindex.cli; ndindex.cli_common.dedup_module.dedup",
                                   "from ndindex import dedup"])
def test_dedup_attribute_stays_the_function_however_the_module_loads(first):
    out = subprocess.run([sys.executable, "-c", f"{first}\nimport ndindex, inspect\n"
                          "print(inspect.isfunction(ndindex.dedup), ndindex.dedup.__module__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "ndindex.dedup"]


def test_cli_help_names_the_defaults_it_leaves_to_dedup_and_upgrade(capsys):
    from ndindex.cli import main
    dedup = importlib.import_module("ndindex.dedup")
    upgrade = importlib.import_module("ndindex.upgrade")
    assert main(["dedup", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {dedup.DEFAULT_MAX_CANDIDATES})" in text
    assert dedup.DEFAULT_MIN_SIZE_BYTES == 1 and "(default 1 byte:" in text
    assert dedup.DEFAULT_MAX_SIZE_BYTES == 64 << 20 and "(default 64M)" in text
    assert main(["upgrade", "--help"]) == 0
    assert f"INDEX{upgrade.BACKUP_SUFFIX})" in " ".join(capsys.readouterr().out.split())
