"""The offline corpus of real text shared by the fingerprint eval and bench.

Debian ships every package's license and authorship statement as
/usr/share/doc/<package>/copyright, plus the full license texts in
/usr/share/common-licenses.  They are real English written by people (legal
prose, notices, authors' lists), and they are full of natural near-duplicates:
the same license text with another copyright holder, year or wrapping; GPL-2
beside LGPL-2; BSD variants.  Manual pages (sections 1, 5 and 8, roff requests
stripped) add technical English and their own near-duplicates (shared option
descriptions, the same page in several packages).  Long documents are whole
files; short ones are their paragraphs (blank-line separated) of 50-200 words.
"""

from __future__ import annotations

import glob
import gzip
import os
import random
import re

SOURCES = ("/usr/share/doc/*/copyright", "/usr/share/common-licenses/*",
           "/usr/share/man/man[158]/*.gz")
_ROFF_REQUEST = re.compile(r"^[.'].*$", re.M)
_ROFF_ESCAPE = re.compile(r"\\(f[A-Z0-9]|f\(..|s[-+]?\d|\(..|[-&e|^ ])")
_WORD = re.compile(r"\w+")


def _read(path: str) -> str | None:
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:
            data = fh.read()
    except OSError:
        return None
    if b"\0" in data[:8000]:
        return None
    text = data.decode("utf-8", errors="replace")
    if "/man/" in path:  # manual pages: keep the prose, drop roff requests and escapes
        text = _ROFF_ESCAPE.sub(" ", _ROFF_REQUEST.sub("", text))
    return text


def files() -> list[tuple[str, str]]:
    """Return (path, text) of every corpus file, sorted by path, symlinks resolved once."""
    seen, out = set(), []
    for pattern in SOURCES:
        for path in sorted(glob.glob(pattern)):
            real = os.path.realpath(path)
            if real in seen or not os.path.isfile(real):
                continue
            seen.add(real)
            text = _read(real)
            if text:
                out.append((path, text))
    return out


def _key(text: str) -> str:
    return " ".join(_WORD.findall(text.casefold()))


def documents(max_short: int = 8000, max_long: int = 3000, seed: int = 7
              ) -> tuple[list[str], list[str], dict]:
    """Return (short, long, info): paragraphs of 50-200 words and whole files of
    more than 200 words, exact duplicates (same word sequence) removed.

    Every copyright file and license is kept; manual pages fill up to
    max_short / max_long (a seeded sample, as they outnumber the rest).
    """
    groups = {"doc": ([], []), "man": ([], [])}
    seen = set()
    all_files = files()
    for path, text in all_files:
        short, long_ = groups["man" if "/man/" in path else "doc"]
        key = _key(text)
        if len(key.split()) > 200 and key not in seen:
            seen.add(key)
            long_.append(text)
        for para in re.split(r"\n\s*\n", text):
            pkey = _key(para)
            if 50 <= len(pkey.split()) <= 200 and pkey not in seen:
                seen.add(pkey)
                short.append(para)
    rng = random.Random(seed)
    info = {"files": len(all_files), "sources": list(SOURCES)}
    out = []
    for i, cap in ((0, max_short), (1, max_long)):
        docs, man = groups["doc"][i], groups["man"][i]
        room = max(0, cap - len(docs))
        picked = rng.sample(man, min(room, len(man)))
        info[("short", "long")[i]] = {"copyright+licenses": len(docs), "man": len(picked),
                                     "man_available": len(man)}
        out.append(docs + picked)
    return out[0], out[1], info


def english_text() -> str:
    """Return all corpus files concatenated (the benchmark's plain English)."""
    return "\n\n".join(text for _, text in files())


def plain_english() -> list[str]:
    """Return the copyright files and license texts (no manual pages): plain
    English prose, one str per file, the benchmark's documents."""
    return [text for path, text in files() if "/man/" not in path]


PACKAGES_LISTS = "/var/lib/apt/lists/*_Packages*"
DPKG_STATUS = "/var/lib/dpkg/status"


def _control_descriptions(text: str) -> list[str]:
    """Return the Description fields of a Debian control file (short line
    plus extended lines, " ." paragraph marks dropped)."""
    out = []
    for stanza in text.split("\n\n"):
        lines = stanza.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("Description:"):
                body = [line[len("Description:"):].strip()]
                for cont in lines[i + 1:]:
                    if not cont.startswith(" "):
                        break
                    body.append("" if cont.strip() == "." else cont.strip())
                out.append("\n".join(body).strip())
                break
    return out


def _read_packages_list(path: str) -> str:
    """Return an apt Packages list as text (plain, .gz, .xz or .lz4 through lz4cat)."""
    import lzma
    import shutil
    import subprocess
    if path.endswith(".lz4"):
        if not shutil.which("lz4cat"):
            return ""
        return subprocess.run(["lz4cat", path], capture_output=True, check=False).stdout \
            .decode("utf-8", "replace")
    opener = gzip.open if path.endswith(".gz") else lzma.open if path.endswith(".xz") else open
    with opener(path, "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def package_descriptions() -> list[str]:
    """Return Debian package descriptions found on this machine, one text each:
    the installed packages' full descriptions (/var/lib/dpkg/status) and the
    one-line descriptions of every package in apt's lists (sentences of 2-20
    words, full of natural near-duplicates: "debug symbols for X")."""
    texts = []
    if os.path.exists(DPKG_STATUS):
        with open(DPKG_STATUS, encoding="utf-8", errors="replace") as fh:
            texts += _control_descriptions(fh.read())
    for path in sorted(glob.glob(PACKAGES_LISTS)):
        texts += [d.split("\n")[0] for d in _control_descriptions(_read_packages_list(path))]
    return texts


def man_name_lines() -> list[str]:
    """Return the NAME line of every manual page (sections 1, 5, 8): "ls - list
    directory contents"; short sentences."""
    out = []
    for path in sorted(glob.glob("/usr/share/man/man[158]/*.gz")):
        text = _read(path)
        if not text:
            continue
        m = re.search(r"^\.SH\s+\"?NAME\"?\s*\n(.*?)(?=^\.SH|\Z)", _raw(path), re.M | re.S)
        if m:
            line = " ".join(_ROFF_ESCAPE.sub(" ", _ROFF_REQUEST.sub("", m.group(1))).split())
            if line:
                out.append(line)
    return out


def _raw(path: str) -> str:
    with gzip.open(path, "rb") as fh:
        return fh.read().decode("utf-8", errors="replace")


def changelog_texts() -> tuple[list[str], list[str]]:
    """Return (items, entries) of the Debian changelogs, READMEs and NEWS files
    under /usr/share/doc: items are the "* ..." bullets of changelog entries
    (sentences, with natural near-duplicates: "New upstream release",
    "Bump Standards-Version to 4.6.2"); entries are whole release entries and
    README / NEWS files (long texts)."""
    items, entries = [], []
    paths = sorted(set(glob.glob("/usr/share/doc/*/changelog*")
                       + glob.glob("/usr/share/doc/*/NEWS*") + glob.glob("/usr/share/doc/*/README*")))
    for path in paths:
        real = os.path.realpath(path)
        if not os.path.isfile(real):
            continue
        text = _read(real)
        if not text:
            continue
        if "/changelog" not in path:
            entries.append(text)
            continue
        for entry in re.split(r"\n(?=\S+ \([^)]*\) )", text):
            entries.append(entry)
            for item in re.split(r"\n\s*[*+-] ", "\n" + entry)[1:]:
                items.append(" ".join(item.split("\n -- ")[0].split()))
    return items, entries
