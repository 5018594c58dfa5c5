"""Whole-file corruption sweep: damage one byte of an index, run the public API on it, classify.

Run:  python tools/sweep_corruption.py [--trials 5000] [--jobs 2] [--seed 1]
          [--index small|large|documents] [--strata "meta,leaf:(free)"]

It builds an index of 20,000 fingerprints with document keys through the
public API (adds with keys, many keys for some fingerprints, a compaction,
removes by fingerprint and by key, then adds that stay in the append log),
keeping a brute-force model of what it holds (tools/sweep_common.py) and
checking the built index against it.  --index large builds 200,000
fingerprints with keys instead (build_large): a main Huffman run and raw
runs at levels 2 and 1 per table, a merge in progress, two tombstone runs,
key runs with deletions, a log of several records and the journal of a
durability-"normal" writer that died (copied beside every trial file, so
every open replays it); its chunks tree has a branch page, and every chunk
kind, the log and the manifest have overflow runs.  --index documents
builds an index with a fingerprinter holding 3,000 short texts (a third
near-duplicates) stored with add_documents and data (build_documents):
runs at several levels, removals and replacements by key, a log; its
trials also run similar() for 35 texts and documents(), compared with
the in-memory pipeline (ndindex.documents) over the live texts.  It classifies every page of the file
with the LMDB checker's page map (meta, branch/leaf/overflow pages of each
tree, free, tail) and spreads the trials evenly over those strata (--strata:
over the ones named; the meta and free-list pages are a few of a large
index's thousands, and a damaged field there aborted LMDB twice).  Each
trial writes a copy of the file with one byte damaged (xor 0xFF, or one bit
flipped, alternately) at a random offset among the bytes of a random page
of its stratum that LMDB uses, then, in a forked child, runs open(),
verify(), query(fp, 3, keys=True) for a fixed set of fingerprints, keys(),
stats(), fingerprints(), an export and a vacuum_into copy (whatever they
return is not compared: only how they end), add() and compact(), queries
again, and compact(full=True) (which vacuums).  The parent classifies the trial
by the worst thing that happened:

  crash      the child died of a signal
  hang       the child did not finish within --timeout seconds
  untyped    a call raised something other than an ndindex.errors.NdindexError
  wrong      verify() passed, and an answer differs from the model's
  rollback   verify() passed, and every answer is the state before the last commit
  typed      a call raised an NdindexError (the damage was reported)
  harmless   every call succeeded with the right answers

and prints the counts by class and by stratum, with the first examples of
each bad class (rerun one with --trial N), and for each class how many of
its damaged files the LMDB structure checker (_core.lmdb_check) flags.  One undamaged control trial
runs first and must be harmless.  Options the installed library accepts
may be passed to create() and open() with --option NAME=VALUE; switches
that would make a run nondeterministic (background compaction) are turned
off when the library has them.  --expect-clean exits 1 unless no trial
crashed, hung, raised an untyped error, answered wrongly or rolled back.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_common import (IndexModel, api_options, as_answer, parse_options,  # noqa: E402
                          remove_index_files, run_child, scratch_dir, state_of)

N_FINGERPRINTS = 20_000
#: --index large: enough fingerprints with keys for branch pages in the
#: chunks tree and overflow runs of every chunk kind.
N_LARGE = 200_000
K = 3
CLASSES = ("crash", "hang", "untyped", "wrong", "rollback", "typed", "harmless")
BAD = ("crash", "hang", "untyped", "wrong", "rollback")
STEPS = ("open", "verify", "query", "keys", "similar", "documents", "add", "compact",
         "query_after")
#: Steps whose answers are compared with the oracle's (similar/documents: document indexes).
ANSWERS = ("query", "keys", "similar", "documents")
#: Bytes of a meta page that LMDB reads (page header and MDB_meta).
META_USED_BYTES = 152


# -- the base index and its oracle ------------------------------------------------


def build_base(path: str, seed: int, options: dict) -> dict:
    """Build the index through the public API; return the oracle's expectations."""
    import ndindex

    rng = np.random.default_rng(seed)
    fps = np.unique(rng.integers(0, 2**64, N_FINGERPRINTS + 400, dtype=np.uint64))[:N_FINGERPRINTS]
    rng.shuffle(fps)
    model = IndexModel()
    create = api_options(ndindex.Index.create, options)
    with ndindex.Index.create(path, k=K, expected_n=N_FINGERPRINTS, **create) as ix:
        def add(sel, keys=None):
            ix.add(sel, keys=keys)
            model.add(sel, keys)

        def remove(fingerprints=None, keys=None):
            ix.remove(fingerprints=fingerprints, keys=keys)
            model.remove(fingerprints, keys)

        table, log, last = fps[:16_000], fps[16_000:19_800], fps[19_800:]
        add(table[:12_000], [f"doc-{i}" for i in range(12_000)])
        add(table[12_000:])  # without keys
        for i in range(40):  # a few keys each: duplicate sub-pages
            add(np.full(6, table[i]), [f"also-{i}-{j}" for j in range(6)])
        add(np.full(250, table[100]), [f"many-{j}" for j in range(250)])  # a sub-database
        ix.compact()
        remove(fingerprints=table[200:400])
        remove(keys=[f"doc-{i}" for i in range(400, 500)])
        add(log[:3000], [f"log-{i}" for i in range(3000)])
        add(log[3000:])
        remove(fingerprints=log[:50])
        previous = model.copy()
        add(last, [f"last-{i}" for i in range(len(last))])  # the last commit
        got = state_of(ix, fps)
    if got != model.state():
        raise SystemExit("sweep_corruption: the built index disagrees with the model; "
                         "the oracle or the library is wrong")
    queries = _choose_queries(rng, table, log, last)
    key_fps = [int(table[0]), int(table[100]), int(table[5000]), int(table[13_000]),
               int(table[250]), int(log[10]), int(log[100]), int(last[0])]
    extra = rng.integers(0, 2**64, 100, dtype=np.uint64)
    after = model.copy()
    after.add(extra, [f"extra-{i}" for i in range(len(extra))])
    return dict(queries=queries, key_fps=key_fps, extra=extra.tolist(),
                expect=_answers(model, queries, key_fps),
                previous=_answers(previous, queries, key_fps),
                after=[after.query(q, K) for q in queries[:40] + extra[:20].tolist()],
                fingerprints=N_FINGERPRINTS)


JOURNAL_CHILD = """
import os, signal, sys
import numpy as np
from ndindex import journal
import ndindex
journal.CHECKPOINT_SECONDS = 1e6  # no checkpoint: the operations stay in the journal only
ix = ndindex.open(sys.argv[1], durability="normal", background_compaction=False)
rng = np.random.default_rng([int(sys.argv[2]), 77])
fps = np.unique(rng.integers(0, 2**64, 300, dtype=np.uint64))
ix.add(fps, keys=[f"journal-{i}" for i in range(len(fps))])
ix.remove(fingerprints=fps[:20])
print("journaled", flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # a writer that died: its journal is pending
"""


def build_large(path: str, seed: int, options: dict) -> dict:
    """Build the large index; return the oracle's expectations (as build_base).

    Through the public API, except two steps taken one at a time with the
    compactor's own step() so that the file keeps them half done: a
    merge in progress (inputs and output with cursors, STEP_CHUNKS 1) and
    a flush whose merge has not run.  The result holds, per table, a main
    Huffman run, raw runs at levels 2 and 1 and a merge in progress; a
    tombstone run; key runs with deletions; a log of several records; and
    a journal of a durability-"normal" writer that died, which every open
    replays.
    """
    import subprocess

    import ndindex
    from ndindex import compaction

    rng = np.random.default_rng(seed)
    fps = np.unique(rng.integers(0, 2**64, N_LARGE + 2000, dtype=np.uint64))[:N_LARGE]
    rng.shuffle(fps)
    model = IndexModel()
    create = dict(api_options(ndindex.Index.create, options), log_limit=5000,
                  background_compaction=False)
    main, two, one, merging, log, last = (fps[:110_000], fps[110_000:155_000],
                                          fps[155_000:175_000], fps[175_000:190_000],
                                          fps[190_000:199_800], fps[199_800:])
    with ndindex.Index.create(path, k=K, expected_n=N_LARGE, **create) as ix:
        def add(sel, keys=None):
            for a in range(0, len(sel), 20_000):
                part = None if keys is None else keys[a:a + 20_000]
                ix.add(sel[a:a + 20_000], keys=part)
                model.add(sel[a:a + 20_000], part)

        def remove(fingerprints=None, keys=None):
            ix.remove(fingerprints=fingerprints, keys=keys)
            model.remove(fingerprints, keys)

        add(main, [f"doc-{i}" if i % 3 else None for i in range(len(main))])
        for i in range(30):  # several keys for some fingerprints
            add(np.full(8, main[i * 7]), [f"also-{i}-{j}" for j in range(8)])
        ix.compact(full=True)
        add(two, [f"two-{i}" for i in range(len(two))])
        ix.compact()  # more than level 1 holds: a level-2 run
        add(one, [f"one-{i}" if i % 2 else None for i in range(len(one))])
        ix.compact()
        add(merging, [f"m-{i}" for i in range(len(merging))])
        saved = compaction.STEP_CHUNKS
        compaction.STEP_CHUNKS = 1
        try:
            ix._compactor.step(force_flush=True)  # the flush
            ix._compactor.step()                   # one step of the merge it makes due
        finally:
            compaction.STEP_CHUNKS = saved
        remove(fingerprints=main[1000:4000])
        remove(keys=[f"doc-{i}" for i in range(5000, 6500) if i % 3])
        remove(fingerprints=two[:500])
        ix._compactor.step(force_flush=True)  # a flush: tombstones and key deletions
        remove(fingerprints=main[4000:4600])
        ix._compactor.step(force_flush=True)  # another: a second tombstone run (format 5)
        add(log[:6000], [f"log-{i}" for i in range(6000)])
        add(log[6000:])
        remove(fingerprints=log[:100])
        remove(fingerprints=one[:200])
        previous = model.copy()
        add(last, [f"last-{i}" for i in range(len(last))])  # the last commit
        man = ix._snapshot().manifest
        if not any(r.merge_into for r in man.runs):
            raise SystemExit("sweep_corruption: the large index has no merge in progress")
        if len(ix._snapshot().tombstone_runs) < 2 and ix._levels_tombstones:
            raise SystemExit("sweep_corruption: the large index has fewer than two tombstone runs")
    out = subprocess.run([sys.executable, "-c", JOURNAL_CHILD, path, str(seed)],
                         capture_output=True, text=True, timeout=600)
    if "journaled" not in out.stdout:
        raise SystemExit(f"sweep_corruption: the journal writer failed: {out.stderr[-500:]}")
    jrng = np.random.default_rng([seed, 77])
    jfps = np.unique(jrng.integers(0, 2**64, 300, dtype=np.uint64))
    for m in (model, previous):
        m.add(jfps, [f"journal-{i}" for i in range(len(jfps))])
        m.remove(fingerprints=jfps[:20])
    table = np.concatenate([main, two, one, merging])
    queries = _choose_queries(rng, table, log, last) + \
        [int(x) ^ (1 << int(rng.integers(64))) for x in jfps[:10]] + jfps[15:25].tolist()
    key_fps = [int(main[0]), int(main[7]), int(main[1]), int(two[3]), int(one[1]),
               int(merging[5]), int(log[10]), int(last[0]), int(jfps[30]), int(main[1500])]
    extra = rng.integers(0, 2**64, 100, dtype=np.uint64)
    after = model.copy()
    after.add(extra, [f"extra-{i}" for i in range(len(extra))])
    return dict(queries=queries, key_fps=key_fps, extra=extra.tolist(),
                expect=_answers(model, queries, key_fps),
                previous=_answers(previous, queries, key_fps),
                after=[after.query(q, K) for q in queries[:40] + extra[:20].tolist()],
                fingerprints=N_LARGE)


#: --index documents: texts stored with add_documents.
N_DOCUMENTS = 3000
DOC_VOCAB = [f"w{i}" for i in range(4000)]


def _doc_texts(rng, n: int, earlier: list) -> list[str]:
    """Short random texts, a third of them edited copies of earlier ones (near-duplicates)."""
    out = []
    for _ in range(n):
        pool = earlier + out
        if len(pool) > 5 and rng.random() < 0.35:
            words = pool[int(rng.integers(len(pool)))].split()
            words[int(rng.integers(len(words)))] = DOC_VOCAB[int(rng.integers(len(DOC_VOCAB)))]
        else:
            words = [DOC_VOCAB[int(x) % len(DOC_VOCAB)]
                     for x in rng.zipf(1.3, int(rng.integers(8, 40)))]
        out.append(" ".join(words))
    return out


class DocumentModel:
    """The live documents: key -> (text, data); fingerprints and keys go to an IndexModel."""

    def __init__(self, fingerprinter):
        self.fingerprinter = fingerprinter
        self.docs: dict = {}
        self.index = IndexModel()

    def copy(self) -> "DocumentModel":
        other = DocumentModel(self.fingerprinter)
        other.docs, other.index = dict(self.docs), self.index.copy()
        return other

    def simhashes(self, texts: list) -> np.ndarray:
        from ndindex.docstore import key_design_for
        from ndindex.documents import fingerprint_documents
        return fingerprint_documents(texts, self.fingerprinter, key_design_for(self.fingerprinter),
                                     workers=1, simhash=True).simhashes

    def add(self, texts: list, keys: list, data: list) -> None:
        fps = self.simhashes(texts)
        self.index.remove(keys=[k for k in keys if k in self.docs])  # replaced
        self.index.add(fps, keys)
        for k, t, d, fp in zip(keys, texts, data, fps.tolist()):
            self.docs[k] = (t, d, fp)

    def remove(self, keys: list) -> None:
        self.index.remove(keys=keys)
        for k in keys:
            self.docs.pop(k, None)

    def documents(self) -> list:
        """documents() as the index yields them, sorted by key."""
        return sorted((k, fp, d) for k, (_, d, fp) in self.docs.items())

    def similar(self, texts: list) -> list:
        """similar(text) of each text, by the in-memory pipeline: sorted (key, similarity)."""
        from ndindex.docstore import key_design_for
        from ndindex.documents import near_duplicate_pairs
        keys = sorted(self.docs)
        stored = [self.docs[k][0] for k in keys]
        fpr = self.fingerprinter
        got = near_duplicate_pairs(stored + texts, fpr.threshold, workers=1, fingerprinter=fpr,
                                   design=key_design_for(fpr)).pairs
        out = [dict() for _ in texts]
        n = len(stored)
        for a, b, j in zip(got["a"].tolist(), got["b"].tolist(), got["jaccard"].tolist()):
            a, b = min(a, b), max(a, b)
            if a < n <= b:
                out[b - n][keys[a]] = j
        return [_similar_answer(d.items()) for d in out]


def _similar_answer(pairs) -> list:
    return sorted((k, round(float(j), 6)) for k, j in pairs)


def build_documents(path: str, seed: int, options: dict) -> dict:
    """Build a document index; return the oracle's expectations (as build_base, plus documents).

    Texts go in with add_documents (with data for some): a main run (full
    compaction), runs at lower levels, removals and replacements by key
    flushed into runs, then a log of several records, the last commit an
    add of 100 documents.  The oracle's similar() answers come from the
    in-memory pipeline (ndindex.documents) over the live texts, its
    documents() from the model; query()/keys() as build_base.
    """
    import ndindex
    from ndindex.fingerprint import Fingerprinter

    rng = np.random.default_rng(seed)
    model = DocumentModel(Fingerprinter())
    create = dict(api_options(ndindex.Index.create, options), log_limit=10**9,
                  background_compaction=False)
    texts = _doc_texts(rng, N_DOCUMENTS, [])
    keys = [f"d{i:05d}" for i in range(N_DOCUMENTS)]
    data = [f"data {i}".encode() if i % 3 else b"" for i in range(N_DOCUMENTS)]
    parts = dict(main=(0, 1500), two=(1500, 2300), one=(2300, 2600), log=(2600, 2900),
                 last=(2900, 3000))
    with ndindex.Index.create(path, k=K, expected_n=N_DOCUMENTS,
                              fingerprinter=model.fingerprinter, **create) as ix:
        def add(a, b, new_texts=None):
            for lo in range(a, b, 500):
                hi = min(b, lo + 500)
                t = new_texts[lo - a:hi - a] if new_texts else texts[lo:hi]
                ix.add_documents(t, keys[lo:hi], data=data[lo:hi], workers=1)
                model.add(t, keys[lo:hi], data[lo:hi])

        def remove(ks):
            ix.remove(keys=ks)
            model.remove(ks)

        add(*parts["main"])
        ix.compact(full=True)
        add(*parts["two"])
        ix.compact()
        add(*parts["one"])
        ix.compact()
        remove(keys[100:1600:15])
        add(200, 250, _doc_texts(rng, 50, texts))  # replacements under the same keys
        ix._compactor.step(force_flush=True)
        add(*parts["log"])
        remove(keys[2300:2330])
        previous = model.copy()
        add(*parts["last"])
        live = model.index.fingerprints()
        got = state_of(ix, live)
        if got != model.index.state() or sorted(ix.documents()) != model.documents():
            raise SystemExit("sweep_corruption: the built document index disagrees with the "
                             "model; the oracle or the library is wrong")
    fps = model.index.fingerprints()
    rng.shuffle(fps)
    queries = _choose_queries(rng, fps[:2000], fps[2000:2500], fps[2500:])
    key_fps = [int(x) for x in fps[:8]]
    live_keys = sorted(model.docs)
    sample = [live_keys[int(i)] for i in rng.choice(len(live_keys), 30, replace=False)]
    sample += [k for k in keys[2900:3000:10] if k in model.docs]
    similar_texts = [model.docs[k][0] for k in sample] + _doc_texts(rng, 5, texts)
    extra = rng.integers(0, 2**64, 100, dtype=np.uint64)
    after = model.index.copy()
    after.add(extra, [f"extra-{i}" for i in range(len(extra))])
    expect = _answers(model.index, queries, key_fps)
    expect.update(similar=model.similar(similar_texts), documents=model.documents())
    before = _answers(previous.index, queries, key_fps)
    before.update(similar=previous.similar(similar_texts), documents=previous.documents())
    return dict(queries=queries, key_fps=key_fps, extra=extra.tolist(), expect=expect,
                previous=before, similar_texts=similar_texts,
                after=[after.query(q, K) for q in queries[:40] + extra[:20].tolist()],
                fingerprints=len(fps), documents=len(model.docs))


def _choose_queries(rng, table, log, last) -> list[int]:
    """Stored fingerprints with 0-3 bits flipped from every part of the file, and strangers."""
    picks = np.concatenate([table[:3], table[100:101], table[200:220], table[400:520:4],
                            rng.choice(table, 40), rng.choice(log, 30), log[:10], last[:40],
                            rng.integers(0, 2**64, 10, dtype=np.uint64)])
    out = []
    for fp in picks.tolist():
        for _ in range(int(rng.integers(0, K + 1))):
            fp ^= 1 << int(rng.integers(64))
        out.append(fp)
    return out


def _answers(model: IndexModel, queries, key_fps) -> dict:
    return dict(query=[model.query(q, K) for q in queries], keys=[model.keys_of(fp) for fp in key_fps])


# -- where to damage -------------------------------------------------------------------


def page_strata(data: bytes) -> dict[str, list[int]]:
    """Pages of the file by stratum: meta, kind:tree for tree pages, free, tail."""
    from ndindex import _core

    pm = _core.lmdb_page_map(data)
    strata = collections.defaultdict(list)
    for page, (kind, owner) in enumerate(zip(pm["kinds"], pm["owners"])):
        name = pm["kind_names"][kind]
        if name in ("branch", "leaf", "overflow", "overflow-more"):
            name = f"{'overflow' if name.startswith('overflow') else name}:{pm['trees'][owner]}"
        strata[name].append(page)
    return dict(strata)


def used_span(data: bytes, page: int, stratum: str, psize: int) -> list[tuple[int, int]]:
    """The byte ranges of a page that LMDB reads (the whole page when unknown)."""
    base = page * psize
    if stratum == "meta":
        return [(base, base + META_USED_BYTES)]
    if stratum.startswith(("branch:", "leaf:")):
        lower = int.from_bytes(data[base + 12:base + 14], "little")
        upper = int.from_bytes(data[base + 14:base + 16], "little")
        return [(base, base + lower), (base + upper, base + psize)]
    return [(base, base + psize)]


def trial_damage(data: bytes, strata: dict, psize: int, seed: int, trial: int):
    """(stratum, page, offset, xor mask) of a trial; a pure function of seed and trial."""
    rng = np.random.default_rng([seed, trial])
    names = sorted(strata)
    stratum = names[trial % len(names)]
    page = strata[stratum][int(rng.integers(len(strata[stratum])))]
    spans = used_span(data, page, stratum, psize)
    sizes = [b - a for a, b in spans]
    pick = int(rng.integers(sum(sizes)))
    for (a, b), n in zip(spans, sizes):
        if pick < n:
            offset = a + pick
            break
        pick -= n
    # Xor and a bit flip alternately, on each stratum's pages too: with an
    # even number of strata, trial % 2 gave each stratum one mode only (the
    # documents index's meta pages never had a single bit flipped).
    # Unchanged with an odd number, so that earlier trial numbers still name
    # the same damage.
    turn = trial if len(names) % 2 else trial + trial // len(names)
    mask = 0xFF if turn % 2 == 0 else 1 << int(rng.integers(8))
    return stratum, page, offset, mask


# -- one trial ---------------------------------------------------------------------------


def _export(ix, dest: str) -> dict:
    from ndindex.dump import export_index
    try:
        with open(dest, "wb") as fh:
            return export_index(ix, fh)
    finally:
        os.unlink(dest)


def _vacuum_into(ix, dest: str) -> int:
    try:
        return ix.vacuum_into(dest)
    finally:
        for name in (dest, dest + "-lock"):
            if os.path.exists(name):
                os.unlink(name)


def run_steps(path: str, oracle: dict, options: dict, send) -> dict:
    """In the child: each public call in turn; what each returned or raised."""
    import ndindex
    from ndindex.errors import NdindexError

    out = {}
    ix = None

    def step(name, call):
        send("step", name)
        try:
            out[name] = ("ok", call())
            return True
        except Exception as exc:  # classify everything; the parent decides what it means
            out[name] = ("typed" if isinstance(exc, NdindexError) else "untyped",
                         f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"[:300])
            return False

    def open_index():
        nonlocal ix
        ix = ndindex.open(path, **api_options(ndindex.Index.open, options))

    if step("open", open_index):
        step("verify", lambda: ix.verify() and None)
        step("query", lambda: [as_answer(ix.query(q, K, keys=True)) for q in oracle["queries"]])
        step("keys", lambda: [tuple(ix.keys(fp)) for fp in oracle["key_fps"]])
        if "similar_texts" in oracle:
            step("similar", lambda: [_similar_answer((m.key, m.similarity) for m in ix.similar(t))
                                     for t in oracle["similar_texts"]])
            step("documents", lambda: sorted(ix.documents()))
        # Calls that read the whole file their own way: what they return is
        # not compared (a damaged copy or count is for verify to find).
        step("stats", lambda: ix.stats() and None)
        step("fingerprints", lambda: len(ix.fingerprints()) and None)
        step("export", lambda: _export(ix, path + ".dump") and None)
        step("vacuum_into", lambda: _vacuum_into(ix, path + ".copy") and None)
        extra = oracle["extra"]
        step("add", lambda: ix.add(np.array(extra, dtype=np.uint64),
                                   keys=[f"extra-{i}" for i in range(len(extra))]) and None)
        step("compact", lambda: ix.compact() and None)
        step("query_after", lambda: [as_answer(ix.query(q, K, keys=True))
                                     for q in oracle["queries"][:40] + extra[:20]])
        step("compact_full", lambda: ix.compact(full=True) and None)
        try:
            ix.close()
        except Exception:
            pass
    return out


def classify(outcome: dict, oracle: dict) -> tuple[str, str]:
    """The class of a trial, and a few words of why."""
    if outcome["signal"] is not None:
        last = [obj for kind, obj in outcome["messages"] if kind == "step"][-1:]
        return "crash", f"{signal.Signals(outcome['signal']).name} in {last[0] if last else 'start'}"
    if outcome["hung"]:
        last = [obj for kind, obj in outcome["messages"] if kind == "step"][-1:]
        return "hang", f"in {last[0] if last else 'start'}"
    if outcome["escaped"] or outcome["result"] is None:
        return "untyped", (outcome["escaped"] or f"exit code {outcome['exit_code']}")[-300:]
    steps = outcome["result"]
    untyped = [(name, why) for name, (status, why) in steps.items() if status == "untyped"]
    if untyped:
        return "untyped", f"{untyped[0][0]}: {untyped[0][1]}"
    if steps.get("verify", ("",))[0] == "ok":
        got = {name: steps[name][1] for name in ANSWERS
               if name in oracle["expect"] and steps.get(name, ("",))[0] == "ok"}
        wrong = [name for name, value in got.items() if value != oracle["expect"][name]]
        if wrong:
            if all(value == oracle["previous"][name] for name, value in got.items()):
                return "rollback", "answers are those before the last commit"
            return "wrong", f"{wrong[0]} differs from the model"
        after = steps.get("query_after", ("",))
        wrote = all(steps.get(name, ("",))[0] == "ok" for name in ("add", "compact"))
        if wrote and after[0] == "ok" and after[1] != oracle["after"]:
            return "wrong", "query after add and compact differs from the model"
    typed = [(name, why) for name, (status, why) in steps.items() if status == "typed"]
    if typed:
        return "typed", f"{typed[0][0]}: {typed[0][1]}"
    return "harmless", ""


# -- workers -----------------------------------------------------------------------------

_WORKER: dict = {}


def _worker_init(base_path: str, oracle: dict, options: dict, seed: int, timeout: float,
                 workdir: str) -> None:
    with open(base_path, "rb") as fh:
        data = fh.read()
    from ndindex import _core

    psize = _core.lmdb_meta(data, 0)["psize"]
    # Journals of dead writers beside the base go beside every trial's copy.
    journals = {}
    for jpath in glob.glob(glob.escape(base_path) + ".journal-*"):
        with open(jpath, "rb") as fh:
            journals[jpath[len(base_path):]] = fh.read()
    _WORKER.update(data=data, oracle=oracle, options=options, seed=seed, timeout=timeout,
                   psize=psize, strata=page_strata(data), journals=journals,
                   path=os.path.join(workdir, f"trial-{os.getpid()}.ndx"))
    import ndindex  # noqa: F401  (imported once here, not in every forked child)


def run_trial(trial: int) -> dict:
    """Damage, run the calls in a forked child, classify.  trial -1 is the undamaged control."""
    w = _WORKER
    data = bytearray(w["data"])
    if trial >= 0:
        stratum, page, offset, mask = trial_damage(w["data"], w["strata"], w["psize"], w["seed"], trial)
        data[offset] ^= mask
    else:
        stratum, page, offset, mask = "control", -1, -1, 0
    path = w["path"]
    checker = _checker_verdict(data)
    remove_index_files(path)
    with open(path, "wb") as fh:
        fh.write(data)
    for suffix, journal in w["journals"].items():
        with open(path + suffix, "wb") as fh:
            fh.write(journal)
    outcome = run_child(lambda send: run_steps(path, w["oracle"], w["options"], send), w["timeout"])
    remove_index_files(path)
    cls, why = classify(outcome, w["oracle"])
    return dict(trial=trial, stratum=stratum, page=page, offset=offset, mask=mask,
                mode="xor" if mask == 0xFF else "bit", cls=cls, why=why, checker=checker,
                steps={k: v[0] if v[0] == "ok" else f"{v[0]}: {v[1]}"
                       for k, v in (outcome["result"] or {}).items()})


def _checker_verdict(data: bytearray) -> str:
    """Whether the LMDB structure checker flags the damaged file ("flags"), or not ("passes").

    The sweep runs it beside the public calls, in the worker (it cannot
    crash), so a run shows which bad trials the checker would stop when
    verify() and open() run it first.
    """
    from ndindex import CorruptionError, _core

    try:
        _core.lmdb_check(data, both=False)
        return "passes"
    except CorruptionError:
        return "flags"


# -- the run ------------------------------------------------------------------------------


def aimed_trials(names: list, trials: int, aim: list | None) -> list:
    """The first `trials` trial numbers whose stratum (trial_damage: the
    sorted strata in turn) is one of aim, or range(trials) with no aim.
    Trial numbers stay those of the unaimed sweep: --trial N reruns one."""
    if not aim:
        return list(range(trials))
    unknown = sorted(set(aim) - set(names))
    if unknown:
        raise SystemExit(f"sweep_corruption: no stratum {', '.join(unknown)} in this index; "
                         f"it has {', '.join(names)}")
    hits = [i for i, name in enumerate(names) if name in aim]
    return [cycle * len(names) + i for cycle in range(-(-trials // len(hits))) for i in hits][:trials]


def sweep(trials: int, jobs: int, seed: int, timeout: float, options: dict, workdir: str | None,
          only: int | None = None, progress=None, index: str = "small",
          strata: list | None = None) -> dict:
    """Run the sweep; return the per-trial results and counts.

    index: "small" (build_base), "large" (build_large) or "documents" (build_documents).
    strata: only trials that damage pages of these strata (aimed_trials).
    """
    tmp = tempfile.mkdtemp(prefix="ndx-sweep-", dir=workdir or scratch_dir())
    try:
        base = os.path.join(tmp, "base.ndx")
        t0 = time.monotonic()
        builder = dict(small=build_base, large=build_large, documents=build_documents)[index]
        oracle = builder(base, seed, options)
        remove_index_files(base + "-lock")
        init = (base, oracle, options, seed, timeout, tmp)
        with open(base, "rb") as fh:
            counts = {name: len(pages) for name, pages in page_strata(fh.read()).items()}
        # Forks happen only in the (single-threaded) workers, never here.
        todo = [-1] + ([only] if only is not None else
                       aimed_trials(sorted(counts), trials, strata))
        ctx = multiprocessing.get_context("spawn")
        results = []
        with ctx.Pool(max(1, jobs), initializer=_worker_init, initargs=init) as pool:
            for res in pool.imap_unordered(run_trial, todo, chunksize=4):
                results.append(res)
                if progress and len(results) % 250 == 0:
                    progress(len(results), len(todo))
        control = next(r for r in results if r["trial"] == -1)
        if control["cls"] != "harmless":
            raise SystemExit(f"sweep_corruption: the undamaged control trial is {control['cls']} "
                             f"({control['why']}); the harness is broken")
        results = [r for r in results if r["trial"] != -1]
        results.sort(key=lambda r: r["trial"])
        return dict(results=results, strata_pages=counts, seconds=time.monotonic() - t0,
                    file_bytes=os.path.getsize(base), fingerprints=oracle["fingerprints"],
                    documents=oracle.get("documents", 0),
                    journals=len(glob.glob(glob.escape(base) + ".journal-*")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summarize(run: dict) -> dict:
    by_class = collections.Counter(r["cls"] for r in run["results"])
    by_stratum = collections.defaultdict(collections.Counter)
    by_mode = collections.defaultdict(collections.Counter)
    for r in run["results"]:
        by_stratum[r["stratum"]][r["cls"]] += 1
        by_mode[r["mode"]][r["cls"]] += 1
    examples = collections.defaultdict(list)
    for r in run["results"]:
        if r["cls"] in BAD and len(examples[r["cls"]]) < 5:
            examples[r["cls"]].append(r)
    why = collections.defaultdict(collections.Counter)
    for r in run["results"]:
        if r["cls"] in BAD or r["cls"] == "typed":
            why[r["cls"]][r["why"].split(":")[0] if r["cls"] == "typed" else _short(r["why"])] += 1
    flagged = collections.defaultdict(collections.Counter)
    for r in run["results"]:
        flagged[r["cls"]][r["checker"]] += 1
    return dict(trials=len(run["results"]), by_class=dict(by_class),
                checker_flags={c: dict(flagged[c]) for c in CLASSES if c in flagged},
                by_stratum={k: dict(v) for k, v in sorted(by_stratum.items())},
                by_mode={k: dict(v) for k, v in by_mode.items()},
                examples=dict(examples), why={k: dict(v.most_common(8)) for k, v in why.items()},
                strata_pages=run["strata_pages"], seconds=round(run["seconds"], 1),
                file_bytes=run["file_bytes"], fingerprints=run.get("fingerprints", N_FINGERPRINTS),
                documents=run.get("documents", 0),
                journals=run.get("journals", 0))


def _short(why: str) -> str:
    return why.splitlines()[-1][:120] if why else ""


def print_report(s: dict, out=sys.stdout) -> None:
    print(f"{s['trials']} trials in {s['seconds']} s on a {s['file_bytes']:,}-byte index "
          f"of {s['fingerprints']:,} fingerprints"
          + (f" and {s['documents']:,} documents" if s.get("documents") else "")
          + (f" with {s['journals']} pending journal" if s["journals"] else ""), file=out)
    print("by class: " + ", ".join(f"{c} {s['by_class'].get(c, 0)}" for c in CLASSES), file=out)
    width = max(len(k) for k in s["by_stratum"]) + 2
    print(f"\n{'stratum (pages)':<{width + 7}}" + "".join(f"{c:>10}" for c in CLASSES), file=out)
    for stratum, counts in s["by_stratum"].items():
        label = f"{stratum} ({s['strata_pages'].get(stratum, 0)})"
        print(f"{label:<{width + 7}}" + "".join(f"{counts.get(c, 0):>10}" for c in CLASSES), file=out)
    for mode, counts in s["by_mode"].items():
        print(f"{'mode ' + mode:<{width + 7}}" + "".join(f"{counts.get(c, 0):>10}" for c in CLASSES),
              file=out)
    print("\nthe LMDB checker (_core.lmdb_check) on the damaged file, by class:", file=out)
    for cls, verdicts in s["checker_flags"].items():
        print(f"  {cls:<10} flags {verdicts.get('flags', 0):>5}  passes {verdicts.get('passes', 0):>5}",
              file=out)
    for cls, reasons in s["why"].items():
        print(f"\n{cls}:", file=out)
        for reason, n in reasons.items():
            print(f"  {n:>5}  {reason}", file=out)
    for cls, rows in s["examples"].items():
        print(f"\nfirst {cls} trials (rerun with --trial N):", file=out)
        for r in rows:
            print(f"  trial {r['trial']}: {r['stratum']} page {r['page']} offset {r['offset']} "
                  f"{r['mode']} {r['mask']:#04x}: {_short(r['why'])}", file=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5000)
    ap.add_argument("--index", choices=["small", "large", "documents"], default="small",
                    help=f"small: {N_FINGERPRINTS:,} fingerprints; large: {N_LARGE:,} with runs at "
                         "several levels, a merge in progress, tombstones, a log and a pending "
                         f"journal, and branch pages in the chunks tree; documents: {N_DOCUMENTS:,} "
                         "texts stored with add_documents, in runs at several levels and a log")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a trial is a hang")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="keyword for Index.create and ndindex.open, if they accept it")
    ap.add_argument("--workdir", help="where trial files go (default: /dev/shm or the temp dir)")
    ap.add_argument("--trial", type=int, help="run only this trial and print its details")
    ap.add_argument("--strata", help="only trials damaging pages of these strata, comma-separated "
                                     "(names as the report prints them: meta,leaf:(free),...); "
                                     "trial numbers stay the unaimed sweep's")
    ap.add_argument("--json", help="also write the summary and every trial's result here")
    ap.add_argument("--expect-clean", action="store_true",
                    help="exit 1 if any trial is crash, hang, untyped, wrong or rollback")
    args = ap.parse_args(argv)
    run = sweep(args.trials, args.jobs, args.seed, args.timeout, parse_options(args.option),
                args.workdir, only=args.trial, index=args.index,
                strata=args.strata.split(",") if args.strata else None,
                progress=lambda n, total: print(f"  {n}/{total}", file=sys.stderr, flush=True))
    summary = summarize(run)
    if args.trial is not None:
        print(json.dumps(run["results"][0], indent=2))
    print_report(summary)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(summary, results=run["results"]), fh, default=str)
    if args.expect_clean and any(summary["by_class"].get(c) for c in BAD):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
