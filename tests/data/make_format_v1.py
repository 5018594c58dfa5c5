"""Make tests/data/format-v1.ndx with ndindex at commit 9521845 (file format 1).

Run it with that version installed, not with this checkout's::

    git archive 9521845 | tar -x -C /tmp/ndindex-v1
    python3 -m venv /tmp/venv-v1 && /tmp/venv-v1/bin/pip install /tmp/ndindex-v1
    cd /tmp && /tmp/venv-v1/bin/python /path/to/tests/data/make_format_v1.py OUT.ndx

What it holds is described in tests/data/README.md; tests/unit/test_upgrade.py
rebuilds the same fingerprints and keys to check an upgrade against.
"""

import os
import sys
import tempfile

import numpy as np

import ndindex


def main(out: str) -> None:
    fps = np.random.default_rng(0).integers(0, 2**64, 1000, dtype=np.uint64)
    with tempfile.TemporaryDirectory() as tmp:
        with ndindex.Index.create(os.path.join(tmp, "build.ndx"), k=3, expected_n=1000) as ix:
            assert ix.add(fps[:800], keys=[f"doc{i}" for i in range(800)]) == 800
            ix.compact()
            ix.add(fps[800:], keys=[f"b{i}".encode() for i in range(200)])
            ix.remove(fingerprints=[int(fps[0]), int(fps[900])])
            ix.remove(keys=["doc5"])
            assert len(ix) == 997
            ix.vacuum_into(out)


if __name__ == "__main__":
    main(sys.argv[1])
