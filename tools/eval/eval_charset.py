#!/usr/bin/env python3
"""Which charset detector should the dedup job use for text that is not UTF-8?

    pip install charset-normalizer chardet faust-cchardet chardetng-py
    python tools/eval/eval_charset.py [--docs 400] [--seed 1]

The dedup job decodes a file in three steps (ndindex.textfile.decode): a
byte-order mark names the codec; else strict UTF-8; else a detector names
one (or none: the file is "undecodable"); NULs that are not UTF-16 shaped
and control bytes make a file binary first.  Only the third step differs
between detectors, so this measures that whole decision with each detector
in the third step, on files of this machine:

* labelled: UTF-8 documents of /usr/share/doc (gzip read through) that hold
  non-ASCII characters, re-encoded as Latin-1, cp1252, UTF-16-LE without a
  BOM and UTF-16 with one (a document a codec cannot encode is left out of
  that codec).  Correct means the decoded text equals the original.
* real: the files of /usr/share/doc that are not valid UTF-8 and hold no NUL.
  There is no label; "plausible" counts decodings with no U+FFFD and no C1
  control (U+0080..U+009F, what a wrong single-byte guess produces).
* binary: shared libraries and random bytes with every NUL replaced, so the
  job's NUL rule cannot decide; "called text" counts what the detector
  would let through as text (lower is better; the job's control-byte rule
  still runs first).

Speed is the detector alone on the labelled non-UTF-8 inputs, MB/s on one
core, and its ratio to the fastest peer in the same run.  Detectors see at
most DETECT_BYTES of a file, as the job gives them.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import os
import platform
import random
import subprocess
import sys
import time

from ndindex import textfile

DETECT_BYTES = textfile.DETECT_BYTES
DOC_BYTES = 64 << 10


def detectors() -> dict:
    """name -> function(bytes) -> codec name or None, for every peer installed."""
    found = {}
    try:
        import charset_normalizer

        def normalizer(data):
            best = charset_normalizer.from_bytes(data).best()
            return None if best is None else best.encoding
        found[f"charset-normalizer {charset_normalizer.__version__}"] = normalizer
    except ImportError:
        pass
    try:
        import chardet
        found[f"chardet {chardet.__version__}"] = lambda data: chardet.detect(data)["encoding"]
    except ImportError:
        pass
    try:
        import cchardet
        found[f"faust-cchardet {cchardet.__version__}"] = \
            lambda data: cchardet.detect(data)["encoding"]
    except ImportError:
        pass
    try:
        import chardetng_py
        from importlib.metadata import version
        found[f"chardetng-py {version('chardetng-py')}"] = \
            lambda data: chardetng_py.detect(data, allow_utf8=False)
    except ImportError:
        pass
    return found


def decode(data: bytes, detect) -> str | None:
    """The job's decision (ndindex.textfile.decode) with ``detect`` as its third step."""
    real = textfile._detect
    textfile._detect = lambda head: detect(head[:DETECT_BYTES])
    try:
        return textfile.decode(data)
    except textfile.NotText:
        return None
    finally:
        textfile._detect = real


def read_doc(path: str) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read()
    return gzip.decompress(data) if path.endswith(".gz") else data


def doc_files() -> list:
    out = []
    for root, _, files in os.walk("/usr/share/doc"):
        out.extend(os.path.join(root, n) for n in files
                   if not os.path.islink(os.path.join(root, n)))
    return sorted(out)


def corpora(n_docs: int, seed: int):
    """Return (labelled [(codec, text, bytes)], real [bytes], binary [bytes])."""
    texts, real = [], []
    for path in doc_files():
        try:
            data = read_doc(path)
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        if b"\0" in data:
            continue
        try:
            text = data[:DOC_BYTES].decode("utf-8", "ignore")
            data.decode("utf-8")
        except UnicodeDecodeError:
            real.append(data)
            continue
        if not text.isascii():
            texts.append(text)
    random.Random(seed).shuffle(texts)
    labelled = []
    for text in texts[:n_docs]:
        for name in ("latin-1", "cp1252", "utf-16-le", "utf-16"):   # utf-16 writes a BOM
            try:
                data = text.encode(name)
            except UnicodeEncodeError:
                continue
            labelled.append((name, text, data))
    rng = random.Random(seed)
    binary = []
    for path in sorted(glob.glob("/usr/lib/x86_64-linux-gnu/*.so*"))[:200]:
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as fh:
                binary.append(fh.read(DETECT_BYTES).replace(b"\0", b"\1"))
    for _ in range(50):
        binary.append(bytes(rng.randrange(1, 256) for _ in range(16384)))
    return labelled, real, binary


def plausible(text: str | None) -> bool:
    return text is not None and "\ufffd" not in text and \
        not any("\x80" <= c <= "\x9f" for c in text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=400, help="labelled documents per codec")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    peers = detectors()
    if not peers:
        sys.exit("no detector installed: pip install charset-normalizer chardet "
                 "faust-cchardet chardetng-py")
    t0 = time.time()
    labelled, real, binary = corpora(args.docs, args.seed)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# eval_charset  {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  "
          f"{platform.machine()} {os.cpu_count()} cores  python {platform.python_version()}  "
          f"load {os.getloadavg()[0]:.2f}")
    by_codec = {}
    for name, _, _ in labelled:
        by_codec[name] = by_codec.get(name, 0) + 1
    print(f"labelled: {len(labelled)} inputs from {args.docs} non-ASCII UTF-8 documents of "
          f"/usr/share/doc ({', '.join(f'{n} {c}' for c, n in by_codec.items())}); "
          f"real non-UTF-8 files: {len(real)}; binary samples: {len(binary)}; built in "
          f"{time.time() - t0:.0f} s")
    rates = {}
    rows = []
    for peer, detect in peers.items():
        right = {c: 0 for c in by_codec}
        for name, text, data in labelled:
            right[name] += decode(data, detect) == text
        timed = [data[:DETECT_BYTES] for name, _, data in labelled if name != "utf-16"]
        start = time.process_time()
        for data in timed:
            detect(data)
        seconds = time.process_time() - start
        rates[peer] = sum(map(len, timed)) / 1e6 / max(seconds, 1e-9)
        ok_real = sum(plausible(decode(data, detect)) for data in real)
        as_text = sum(detect(data) is not None for data in binary)
        rows.append((peer, right, ok_real, as_text))
    fastest = max(rates.values())
    header = " ".join(f"{c:>10}" for c in by_codec)
    print(f"\n{'detector':28} {header}  {'all':>6}  {'real':>7}  {'binary':>6}  "
          f"{'MB/s':>7}  {'vs fastest':>10}")
    for peer, right, ok_real, as_text in rows:
        cells = " ".join(f"{right[c] / by_codec[c]:10.3f}" for c in by_codec)
        total = sum(right.values()) / len(labelled)
        print(f"{peer:28} {cells}  {total:6.3f}  {ok_real:3d}/{len(real):<3d}  "
              f"{as_text:3d}/{len(binary):<3d} {rates[peer]:7.2f}  "
              f"{rates[peer] / fastest:9.2f}x")
    print("\ncolumns: share of labelled inputs decoded to the original text per codec; real: "
          "plausible decodings of the real non-UTF-8 files; binary: samples the detector "
          "calls text; MB/s: detector alone on the non-UTF-8 labelled inputs, one core")
    print(f"command: python tools/eval/eval_charset.py --docs {args.docs} --seed {args.seed}")


if __name__ == "__main__":
    main()
