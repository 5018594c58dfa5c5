"""Features: normalised text -> tokens -> n-gram shingles -> 64-bit hashes.

A :class:`FeatureSpec` names every choice (unit, n-gram size, stop words,
stemming, hash, seed); :func:`extract` applies it.  Tokenising, stop-word
removal, shingling and hashing run in the C kernel (``_core.extract``) on the
UTF-8 of the normalised text, so no Python code runs per feature.  Long texts
are cut into pieces of at most PIECE_CHARS characters at a token boundary,
and the kernel carries the last n-1 tokens from piece to piece, so memory
stays bounded and the features equal those of the whole text.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator

import numpy as np

from ndindex import _core
from ndindex.arrays import sorted_unique
from ndindex.fingerprint.hashing import DEFAULT_SEED, _check_seed
from ndindex.fingerprint.normalize import normalize_text, normalize_utf8

UNITS = ("words", "chars", "lines")
HASHES = ("xxh64", "rabin")
_UNIT_CODE = {"words": 0, "chars": 1, "lines": 2}
_HASH_CODE = {"xxh64": 0, "rabin": 1}

#: Pieces of a long text are about this many characters (memory bound: the
#: kernel needs ~17 bytes per input byte of a piece).
PIECE_CHARS = 1 << 20

#: A piece with no boundary character in this many characters is cut anyway
#: (one token may then be split in two; see [FP17]).
MAX_PIECE_CHARS = 16 << 20

#: A small built-in English stop list: articles, pronouns, auxiliaries,
#: prepositions and conjunctions (127 words, after the NLTK list).
ENGLISH_STOP_WORDS = tuple("""
a about above after again against all am an and any are as at be because been before
being below between both but by can did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is
it its itself just me more most my myself no nor not now of off on once only or other our
ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we
were what when where which while who whom why will with you your yours yourself
yourselves
""".split())

_STOP_LISTS = {"english": ENGLISH_STOP_WORDS}


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """How a text becomes features.

    Attributes:
        unit: ``"words"`` (runs of word characters: str.isalnum() or "_"),
            ``"chars"`` (code points, white space collapsed to one space) or
            ``"lines"`` (lines with white space collapsed; empty lines dropped).
        ngram: tokens per feature (shingle size), >= 1.  Words are joined by
            one space, lines by a line feed, characters by nothing.
        stop_words: ``None``, ``"english"`` (ENGLISH_STOP_WORDS) or a tuple of
            user words; tokens equal to a normalised stop word are dropped
            before shingling (words and lines only).
        stem: ``None`` or a Snowball language (``"english"``), through
            PyStemmer (``pip install 'ndindex[stem]'``); words only.
        hash: ``"xxh64"`` (seeded) or ``"rabin"`` (chars only).
        seed: XXH64 seed, in [0, 2**64).
    """

    unit: str = "words"
    ngram: int = 1
    stop_words: str | tuple[str, ...] | None = None
    stem: str | None = None
    hash: str = "xxh64"
    seed: int = DEFAULT_SEED

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")
        if not isinstance(self.ngram, int) or isinstance(self.ngram, bool):
            raise TypeError(f"ngram must be int, got {type(self.ngram).__name__}")
        if not 1 <= self.ngram <= 64:
            raise ValueError(f"ngram must be in 1..64, got {self.ngram}")
        if self.hash not in HASHES:
            raise ValueError(f"hash must be one of {HASHES}, got {self.hash!r}")
        if self.hash == "rabin" and self.unit != "chars":
            raise ValueError(f"hash='rabin' needs unit='chars', got unit={self.unit!r}")
        _check_seed(self.seed)
        stop = self.stop_words
        if isinstance(stop, (list, frozenset, set)):
            object.__setattr__(self, "stop_words", tuple(sorted(stop)))
        elif isinstance(stop, str) and stop not in _STOP_LISTS:
            raise ValueError(f"stop_words must be None, {sorted(_STOP_LISTS)} or a list of "
                             f"words, got {stop!r}")
        elif not (stop is None or isinstance(stop, (str, tuple))):
            raise TypeError(f"stop_words must be None, str or a list, got {type(stop).__name__}")
        if stop is not None and self.unit == "chars":
            raise ValueError("stop_words apply to unit 'words' or 'lines', not 'chars'")
        if self.stem is not None:
            if self.unit != "words":
                raise ValueError(f"stem needs unit='words', got unit={self.unit!r}")
            _stemmer(self.stem)  # fail now, not at the first document

    def stop_list(self) -> tuple[str, ...]:
        """Return the normalised stop words (empty when there are none)."""
        if self.stop_words is None:
            return ()
        words = _STOP_LISTS.get(self.stop_words, self.stop_words) \
            if isinstance(self.stop_words, str) else self.stop_words
        return tuple(normalize_text(w) for w in words)

    def stop_hashes(self) -> np.ndarray:
        """Return the sorted XXH64 hashes of the stop words the kernel drops."""
        return _stop_hashes(self.stop_list(), self.seed)


def _stop_hashes(words: tuple[str, ...], seed: int) -> np.ndarray:
    key = (words, seed)
    cached = _STOP_CACHE.get(key)
    if cached is None:
        hashes = [_core.xxh64(w.encode("utf-8"), seed) for w in words]
        cached = sorted_unique(np.array(hashes, dtype=np.uint64))
        if len(_STOP_CACHE) > 32:
            _STOP_CACHE.clear()
        _STOP_CACHE[key] = cached
    return cached


_STOP_CACHE: dict = {}
_STEMMERS: dict = {}


def _stemmer(language: str):
    stemmer = _STEMMERS.get(language)
    if stemmer is None:
        try:
            import Stemmer
        except ImportError:
            raise ImportError("stemming needs the stem extra: pip install 'ndindex[stem]'") \
                from None
        try:
            stemmer = Stemmer.Stemmer(language)
        except KeyError:
            raise ValueError(f"stem language {language!r} is not one of "
                             f"{sorted(Stemmer.algorithms())}") from None
        _STEMMERS[language] = stemmer
    return stemmer


_WORD_RE = re.compile(r"\w+")


def _stem_text(normalized: str, spec: FeatureSpec) -> str:
    """Stop words dropped, then the rest stemmed, joined by spaces (words unit)."""
    stop = frozenset(spec.stop_list())
    words = [w for w in _WORD_RE.findall(normalized) if w not in stop]
    return " ".join(_stemmer(spec.stem).stemWords(words))


def _boundary(text: str, unit: str, limit: int, start: int = 0) -> int:
    """Index in text[start:limit] to cut before: the start of its last
    boundary run; start or less when there is none past start."""
    if unit == "lines":
        cut = max(text.rfind("\n", start, limit), text.rfind("\r", start, limit))
    else:
        cut = -1
        for i in range(limit - 1, max(start - 1, limit - 4096), -1):
            if text[i].isspace():
                cut = i
                break
        if cut > start:
            while cut > start and text[cut - 1].isspace():
                cut -= 1
    return cut


class FeatureStream:
    """Incremental feature extraction over the pieces of one text.

    ``feed(text_piece)`` returns the features completed so far; ``close()``
    returns the rest.  The concatenation equals ``extract(whole_text)``
    ([FP17]) as long as every MAX_PIECE_CHARS window holds a boundary.
    """

    def __init__(self, spec: FeatureSpec):
        self.spec = spec
        self._pending = ""
        self._carry = b""
        self._emitted = False
        self._stop = spec.stop_hashes() if spec.stem is None else np.empty(0, np.uint64)
        self.n_tokens = 0

    def feed(self, piece: str) -> np.ndarray:
        """Add the next piece of the text; return the features it completed."""
        return _concat(list(self.feed_pieces(piece)))

    def feed_pieces(self, piece: str) -> Iterator[np.ndarray]:
        """feed(), yielding the features of each PIECE_CHARS piece it cuts
        (memory: one piece's, not the whole text's).  Run it to its end
        before the next feed or close: the rest is kept for them then."""
        text = self._pending + piece
        # The text is cut at offsets: slicing off the rest after each piece
        # copied it, which made one long text quadratic (16 of 22 s for 200 MB).
        start, unit = 0, self.spec.unit
        while len(text) - start > PIECE_CHARS:
            cut = _boundary(text, unit, start + PIECE_CHARS, start)
            if cut <= start:
                cut = _boundary(text, unit, min(len(text), start + MAX_PIECE_CHARS), start)
            if cut <= start:
                cut = min(len(text), start + MAX_PIECE_CHARS)
                if cut == len(text):
                    break
            feats = self._run(text[start:cut], final=False)
            start = cut
            yield feats
        self._pending = text[start:]

    def close(self) -> np.ndarray:
        """End the text; return its remaining features."""
        text, self._pending = self._pending, ""
        return self._run(text, final=True)

    def _run(self, raw: str, final: bool) -> np.ndarray:
        spec = self.spec
        if spec.stem is not None:
            data = _stem_text(normalize_text(raw), spec).encode("utf-8", "surrogatepass")
        else:
            data = normalize_utf8(raw)
        feats, self._carry, n_tokens = _core.extract(
            data, self._carry,
            _UNIT_CODE[spec.unit], spec.ngram, _HASH_CODE[spec.hash], spec.seed,
            self._stop, final, self._emitted)
        self.n_tokens += n_tokens
        feats = np.frombuffer(feats, dtype=np.uint64)
        self._emitted = self._emitted or len(feats) > 0
        return feats


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.empty(0, dtype=np.uint64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def extract(text: str, spec: FeatureSpec = FeatureSpec()) -> np.ndarray:
    """Return the feature hashes of a text, one per shingle, in text order.

    The text is normalised (NFKC, case folding), tokenised by ``spec.unit``,
    stop words dropped, stemmed if asked, and each run of ``spec.ngram``
    tokens hashed ([FP10]-[FP16]).  A text with fewer than ``ngram`` tokens
    but at least one yields one feature of all its tokens; a text with no
    tokens yields none.

    Raises:
        TypeError: ``text`` is not a str.

    Cost: linear in the text; memory O(PIECE_CHARS) beyond the result.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if len(text) <= PIECE_CHARS:
        return FeatureStream(spec)._run(text, final=True)
    return _concat(list(extract_pieces(text, spec)))


def extract_pieces(text: str, spec: FeatureSpec = FeatureSpec()) -> Iterator[np.ndarray]:
    """Yield extract(text, spec) in pieces (their concatenation is it; the last
    may be empty), so that a long text's features need not be held at once."""
    stream = FeatureStream(spec)
    yield from stream.feed_pieces(text)
    yield stream.close()


def extract_stream(pieces: Iterable[str], spec: FeatureSpec = FeatureSpec()) -> Iterator[np.ndarray]:
    """Yield the feature arrays of a text given as an iterable of str pieces."""
    stream = FeatureStream(spec)
    for piece in pieces:
        yield from (feats for feats in stream.feed_pieces(piece) if len(feats))
    feats = stream.close()
    if len(feats):
        yield feats


def tokens(text: str, spec: FeatureSpec = FeatureSpec()) -> list[str]:
    """Return the kept tokens of a text as str (for inspection and tests; slow)."""
    normalized = normalize_text(text)
    if spec.unit == "words":
        if spec.stem is not None:
            return _stem_text(normalized, spec).split(" ") if normalized.strip() else []
        stop = frozenset(spec.stop_list())
        return [t for t in _WORD_RE.findall(normalized) if t not in stop]
    if spec.unit == "lines":
        stop = frozenset(spec.stop_list())
        lines = (" ".join(line.split()) for line in re.split(r"[\r\n]", normalized))
        return [t for t in lines if t and t not in stop]
    return list(" ".join(normalized.split()))
