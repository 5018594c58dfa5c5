"""The Fingerprinter: every fingerprinting choice in one serialisable object.

The index keeps ``Fingerprinter.to_bytes()`` in its header and rebuilds the
object with ``Fingerprinter.from_bytes()``, so that queries fingerprint text
exactly as the documents were fingerprinted when added.  The serialised form
and the exact hashes are normative: format-spec/fingerprinter.md.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import unicodedata
from collections.abc import Iterable

import numpy as np

from ndindex.errors import FormatError
from ndindex.fingerprint.features import (PIECE_CHARS, FeatureSpec, FeatureStream, extract,
                                          extract_pieces)
from ndindex.fingerprint.html import html_to_text
from ndindex.fingerprint.minhash import (DEFAULT_BOTTOM_K, DEFAULT_NUM_PERM, MinHashFamily,
                                         bottom_k_jaccard, bottom_k_more, jaccard_estimate)
from ndindex.fingerprint.normalize import decode_text, many_texts
from ndindex.fingerprint.simhash import SimhashAccumulator
from ndindex.fingerprint.volatility import DEFAULT_FLIP_MODEL, FlipModel
from ndindex.fingerprint.weights import (WEIGHTINGS, FeatureCounts, IdfTable, weigh,
                                         weigh_counts)

MAGIC = b"NDFP"
#: Newest version; readers reject a larger one ([FP52]).  Version 2 adds the
#: flip model; a record without one is still written as version 1, which
#: older readers understand.
FORMAT_VERSION = 2
_HEADER = struct.Struct("<4sHI")

#: Default simhash features: words of the normalised text, stop words kept,
#: weighted by term frequency.  On the evaluation (docs/fingerprints.md) they
#: give the highest recall at every k of the variants tried (word 2- and
#: 3-shingles, stop lists, log tf, tf-idf, character 5-grams): near-duplicates
#: under shingle Jaccard have even closer word-frequency vectors.
DEFAULT_FEATURES = FeatureSpec(unit="words", ngram=1)
DEFAULT_WEIGHTING = "tf"
#: Default MinHash / bottom-k features: word 3-shingles (the Jaccard the
#: near-duplicate threshold is defined on).
DEFAULT_MINHASH_FEATURES = FeatureSpec(unit="words", ngram=3)
DEFAULT_MINHASH_SEED = 1
#: The default near-duplicate pipeline: simhash candidates within
#: DEFAULT_QUERY_K bits, kept when the bottom-k Jaccard is >= DEFAULT_THRESHOLD.
DEFAULT_QUERY_K = 10
DEFAULT_THRESHOLD = 0.8

_SPEC_KEYS = ("unit", "ngram", "stop_words", "stem", "hash", "seed")
#: JSON keys of a version 1 record; version 2 adds "flip_model".
_V1_KEYS = frozenset({"features", "weighting", "minhash_features", "num_perm", "minhash_seed",
                      "html", "binary", "unicode_version", "bottom_k", "query_k", "threshold"})


def _spec_to_dict(spec: FeatureSpec) -> dict:
    d = {k: getattr(spec, k) for k in _SPEC_KEYS}
    if isinstance(d["stop_words"], tuple):
        d["stop_words"] = list(d["stop_words"])
    return d


def _spec_from_dict(d) -> FeatureSpec:
    if not isinstance(d, dict) or set(d) != set(_SPEC_KEYS):
        raise FormatError(f"feature spec must have keys {sorted(_SPEC_KEYS)}, got "
                          f"{sorted(d) if isinstance(d, dict) else type(d).__name__}")
    stop = d["stop_words"]
    try:
        return FeatureSpec(unit=d["unit"], ngram=d["ngram"],
                           stop_words=tuple(stop) if isinstance(stop, list) else stop,
                           stem=d["stem"], hash=d["hash"], seed=d["seed"])
    except (TypeError, ValueError) as exc:
        raise FormatError(f"invalid feature spec: {exc}") from exc


@dataclasses.dataclass(frozen=True, eq=False)
class Fingerprinter:
    """Turns documents into simhash fingerprints and MinHash sketches.

    Attributes:
        features: the simhash features (FeatureSpec).
        weighting: ``"tf"``, ``"binary"``, ``"logtf"`` or ``"tfidf"``.
        idf: the IdfTable for ``"tfidf"`` (see :meth:`learn_idf`).
        minhash_features: the MinHash features (a set: weights ignored).
        num_perm: MinHash sketch length p.
        minhash_seed: seed of the MinHash family (SplitMix64).
        html: strip HTML (tags, scripts, styles, comments) before anything.
        binary: bytes that look binary: ``"raise"`` BinaryDataError, or
            ``"text"`` fingerprint them anyway.
        bottom_k: values kept by :meth:`sketch` (the verification sketch).
        query_k: Hamming radius of the near-duplicate pipeline's candidates.
        threshold: Jaccard similarity a candidate must reach to be kept.
        flip_model: the FlipModel that turns V into flip probabilities for
            probabilistic matching (see :meth:`flip_probabilities`), or None
            (a version-1 record: DEFAULT_FLIP_MODEL is used).

    The near-duplicate pipeline ([FP70]): a document is stored as
    ``fingerprint(doc) = (simhash, sketch)``; a query's candidates are the
    stored simhashes within ``query_k`` bits, and a candidate is a
    near-duplicate when ``similarity(query_sketch, its_sketch) >= threshold``.

    Text input may be str or bytes (UTF-8; invalid sequences become U+FFFD).
    A text without features has simhash 0 (V all zero) and the empty sketch
    (all 0xFFFFFFFF) ([FP33], [FP43]).
    """

    features: FeatureSpec = DEFAULT_FEATURES
    weighting: str = DEFAULT_WEIGHTING
    idf: IdfTable | None = None
    minhash_features: FeatureSpec = DEFAULT_MINHASH_FEATURES
    num_perm: int = DEFAULT_NUM_PERM
    minhash_seed: int = DEFAULT_MINHASH_SEED
    html: bool = False
    binary: str = "raise"
    bottom_k: int = DEFAULT_BOTTOM_K
    query_k: int = DEFAULT_QUERY_K
    threshold: float = DEFAULT_THRESHOLD
    flip_model: FlipModel | None = DEFAULT_FLIP_MODEL

    def __post_init__(self):
        if not isinstance(self.bottom_k, int) or not 1 <= self.bottom_k <= 65536:
            raise ValueError(f"bottom_k must be an int in 1..65536, got {self.bottom_k!r}")
        if not isinstance(self.query_k, int) or not 0 <= self.query_k <= 64:
            raise ValueError(f"query_k must be an int in 0..64, got {self.query_k!r}")
        if not isinstance(self.threshold, (int, float)) or not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold!r}")
        if not isinstance(self.features, FeatureSpec):
            raise TypeError(f"features must be a FeatureSpec, got {type(self.features).__name__}")
        if not isinstance(self.minhash_features, FeatureSpec):
            raise TypeError("minhash_features must be a FeatureSpec, got "
                            f"{type(self.minhash_features).__name__}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.weighting == "tfidf" and self.idf is None:
            raise ValueError("weighting 'tfidf' needs idf=IdfTable (see learn_idf)")
        if self.idf is not None and not isinstance(self.idf, IdfTable):
            raise TypeError(f"idf must be an IdfTable, got {type(self.idf).__name__}")
        if self.binary not in ("raise", "text"):
            raise ValueError(f"binary must be 'raise' or 'text', got {self.binary!r}")
        if not isinstance(self.html, bool):
            raise TypeError(f"html must be bool, got {type(self.html).__name__}")
        if self.flip_model is not None and not isinstance(self.flip_model, FlipModel):
            raise TypeError(f"flip_model must be a FlipModel or None, got "
                            f"{type(self.flip_model).__name__}")
        object.__setattr__(self, "_family", MinHashFamily(self.num_perm, self.minhash_seed))

    # ------------------------------------------------------------ text

    def text(self, document: str | bytes) -> str:
        """Return the document as the str the features are taken from.

        Raises:
            BinaryDataError: bytes that look binary under ``binary="raise"``.
            TypeError: neither str nor bytes-like.
        """
        text = decode_text(document, binary=self.binary)
        return html_to_text(text) if self.html else text

    def feature_hashes(self, document: str | bytes) -> np.ndarray:
        """Return the simhash features of a document (uint64, text order)."""
        return extract(self.text(document), self.features)

    # ------------------------------------------------------------ simhash

    def simhash(self, document: str | bytes) -> int:
        """Return the 64-bit simhash of a document as an int ([FP30]-[FP33])."""
        return self.simhash_with_weights(document)[0]

    def simhash_with_weights(self, document: str | bytes) -> tuple[int, np.ndarray]:
        """Return (simhash, V): V (float64, 64) holds each bit's signed weight
        sum; |V_j| is bit j's margin (small = volatile)."""
        return self._simhash_of_text(self.text(document))

    def simhash_many(self, documents: Iterable[str | bytes]) -> np.ndarray:
        """Return the simhashes of many documents as a uint64 array."""
        return np.fromiter((self.simhash(d) for d in many_texts(documents)), dtype=np.uint64)

    def simhash_stream(self, pieces: Iterable[str | bytes], *, _decoded: bool = False
                       ) -> tuple[int, np.ndarray]:
        """Return (simhash, V) of one text given as pieces (str, or UTF-8 bytes).

        Memory: O(piece) for weighting ``tf``; O(distinct features) for the
        others, which need whole-document counts.  Bytes pieces are decoded
        incrementally; the binary check looks at the first piece.  With
        ``html=True`` each piece is converted separately (give whole elements).
        """
        stream = FeatureStream(self.features)
        acc = SimhashAccumulator()
        counts = FeatureCounts()
        for feats in _feature_pieces(self, stream, pieces, _decoded):
            if self.weighting == "tf":
                acc.add(feats)  # tf: every occurrence adds weight 1, no counting needed
            else:
                counts.add(feats)
        if self.weighting != "tf":
            acc.add(*weigh_counts(counts.features, counts.counts, self.weighting, self.idf))
        return acc.result()

    def flip_probabilities(self, document) -> np.ndarray:
        """Return each simhash bit's chance to flip in a near-duplicate ([FP80]).

        Parameters:
            document: a text (str or bytes), fingerprinted here, or its
                weight vector V (64 values, as :meth:`simhash_with_weights`
                returns it), or an (n, 64) array of them.

        Returns:
            float64 probabilities p_j for bit j, shaped like V: what
            ``ndindex.vosh`` and ``ndindex.psm`` order their probes by.
            The model is :attr:`flip_model`, or DEFAULT_FLIP_MODEL when the
            record has none.

        Raises:
            ValueError: an array that is not (64,) or (n, 64).
        """
        if isinstance(document, (str, bytes, bytearray, memoryview)):
            document = self.simhash_with_weights(document)[1]
        return (self.flip_model or DEFAULT_FLIP_MODEL).probabilities(document)

    # ------------------------------------------------------------ MinHash

    def minhash(self, document: str | bytes) -> np.ndarray:
        """Return the MinHash sketch (uint32, num_perm values) ([FP40]-[FP43])."""
        return self._family.sketch(extract(self.text(document), self.minhash_features))

    def minhash_many(self, documents: Iterable[str | bytes]) -> np.ndarray:
        """Return an (n, num_perm) uint32 array of sketches."""
        rows = [self.minhash(d) for d in many_texts(documents)]
        return np.stack(rows) if rows else np.empty((0, self.num_perm), np.uint32)

    def minhash_stream(self, pieces: Iterable[str | bytes]) -> np.ndarray:
        """Return the sketch of one text given as pieces; memory O(piece)."""
        sketch = self._family.empty()
        stream = FeatureStream(self.minhash_features)
        for feats in _feature_pieces(self, stream, pieces, False):
            self._family.update(sketch, feats)
        return sketch

    @staticmethod
    def jaccard(a: np.ndarray, b: np.ndarray) -> float:
        """Return the Jaccard estimate of two MinHash sketches (agreement rate)."""
        return jaccard_estimate(a, b)

    # ------------------------------------------------------------ pipeline

    def sketch(self, document: str | bytes) -> np.ndarray:
        """Return the bottom-k sketch (sorted uint32, at most bottom_k values)
        of the MinHash features: the whole shingle set when it is small."""
        return self._sketch_of_text(self.text(document))

    def fingerprint(self, document: str | bytes) -> tuple[int, np.ndarray]:
        """Return (simhash, sketch): what the index stores per document."""
        text = self.text(document)
        return self._simhash_of_text(text)[0], self._sketch_of_text(text)

    def _sketch_of_text(self, text: str) -> np.ndarray:
        # a long text a piece at a time: its features are not held at once
        sketch = np.empty(0, np.uint32)
        for features in extract_pieces(text, self.minhash_features):
            sketch = bottom_k_more(sketch, features, self.bottom_k)
        return sketch

    def simhash_of_text(self, text: str) -> int:
        """Return the simhash of a text already decoded by :meth:`text`."""
        return self._simhash_of_text(text)[0]

    def _simhash_of_text(self, text: str) -> tuple[int, np.ndarray]:
        if len(text) > PIECE_CHARS:
            return self.simhash_stream([text], _decoded=True)
        # one piece: skip the streaming machinery (it matters for short texts)
        acc = SimhashAccumulator()
        acc.add(*weigh(extract(text, self.features), self.weighting, self.idf))
        return acc.result()

    def similarity(self, sketch_a: np.ndarray, sketch_b: np.ndarray) -> float:
        """Return the Jaccard similarity of two bottom-k sketches (exact when
        both hold fewer than bottom_k values)."""
        return bottom_k_jaccard(sketch_a, sketch_b, self.bottom_k)

    def is_near_duplicate(self, a: tuple[int, np.ndarray], b: tuple[int, np.ndarray]) -> bool:
        """Return whether two fingerprint() results are near-duplicates:
        simhashes within query_k bits and similarity >= threshold."""
        return ((int(a[0]) ^ int(b[0])).bit_count() <= self.query_k
                and self.similarity(a[1], b[1]) >= self.threshold)

    # ------------------------------------------------------------ idf

    def learn_idf(self, documents: Iterable[str | bytes]) -> Fingerprinter:
        """Return a copy with weighting ``tfidf`` and an idf table learned from
        the simhash features of ``documents``."""
        table = IdfTable.learn(self.feature_hashes(d) for d in many_texts(documents))
        return dataclasses.replace(self, weighting="tfidf", idf=table)

    # ------------------------------------------------------------ bytes

    def to_dict(self) -> dict:
        """Return the JSON-able configuration (the idf table excluded); the key
        ``flip_model`` is present only when there is one."""
        d = {
            "features": _spec_to_dict(self.features),
            "weighting": self.weighting,
            "minhash_features": _spec_to_dict(self.minhash_features),
            "num_perm": self.num_perm,
            "minhash_seed": self.minhash_seed,
            "html": self.html,
            "binary": self.binary,
            "unicode_version": unicodedata.unidata_version,
            "bottom_k": self.bottom_k,
            "query_k": self.query_k,
            "threshold": self.threshold,
        }
        if self.flip_model is not None:
            d["flip_model"] = self.flip_model.to_dict()
        return d

    def to_bytes(self) -> bytes:
        """Serialise ([FP50]): magic "NDFP", u16 version, u32 JSON length, JSON,
        u32 idf length, idf table bytes (all little-endian).  The version is
        2 with a flip model, else 1 ([FP54])."""
        body = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        idf = self.idf.to_bytes() if self.idf is not None else b""
        version = 1 if self.flip_model is None else 2
        return (_HEADER.pack(MAGIC, version, len(body)) + body
                + struct.pack("<I", len(idf)) + idf)

    @classmethod
    def from_bytes(cls, data: bytes) -> Fingerprinter:
        """Parse :meth:`to_bytes` output.

        Raises:
            FormatError: wrong magic, a version above FORMAT_VERSION, bad
                lengths, unknown or missing keys, invalid values.
            TypeError: ``data`` is not bytes-like.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < _HEADER.size:
            raise FormatError(f"fingerprinter record of {len(data)} bytes < {_HEADER.size}")
        magic, version, n = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise FormatError(f"not a fingerprinter record: magic {magic!r} != {MAGIC!r}")
        if version > FORMAT_VERSION or version == 0:
            raise FormatError(f"fingerprinter version {version} > supported {FORMAT_VERSION}"
                              if version else "fingerprinter version 0 is invalid")
        end = _HEADER.size + n
        if len(data) < end + 4:
            raise FormatError(f"fingerprinter record truncated: need {end + 4} bytes, "
                              f"got {len(data)}")
        try:
            config = json.loads(data[_HEADER.size:end].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"fingerprinter JSON is invalid: {exc}") from exc
        (n_idf,) = struct.unpack_from("<I", data, end)
        if len(data) != end + 4 + n_idf:
            raise FormatError(f"fingerprinter record is {len(data)} bytes, "
                              f"expected {end + 4 + n_idf}")
        expected = _V1_KEYS | ({"flip_model"} if version >= 2 else set())
        if not isinstance(config, dict) or set(config) != expected:
            raise FormatError(f"fingerprinter version {version} keys must be "
                              f"{sorted(expected)}, got "
                              f"{sorted(config) if isinstance(config, dict) else config!r}")
        idf = IdfTable.from_bytes(data[end + 4:]) if n_idf else None
        return cls.from_dict(config, idf=idf)

    @classmethod
    def from_dict(cls, config: dict, idf: IdfTable | None = None) -> Fingerprinter:
        """Rebuild from :meth:`to_dict` output (``unicode_version`` is informative).

        Without the key ``flip_model`` (a version-1 configuration) the result
        has flip_model None.

        Raises:
            FormatError: missing or unknown keys, invalid values.
        """
        if not isinstance(config, dict) or not (_V1_KEYS <= set(config)
                                                <= _V1_KEYS | {"flip_model"}):
            raise FormatError(f"fingerprinter keys must be {sorted(_V1_KEYS)} and optionally "
                              "'flip_model', got "
                              f"{sorted(config) if isinstance(config, dict) else config!r}")
        try:
            flip_model = (FlipModel.from_dict(config["flip_model"]) if "flip_model" in config
                          else None)
            return cls(features=_spec_from_dict(config["features"]),
                       weighting=config["weighting"], idf=idf,
                       minhash_features=_spec_from_dict(config["minhash_features"]),
                       num_perm=config["num_perm"], minhash_seed=config["minhash_seed"],
                       html=config["html"], binary=config["binary"],
                       bottom_k=config["bottom_k"], query_k=config["query_k"],
                       threshold=config["threshold"], flip_model=flip_model)
        except (TypeError, ValueError) as exc:
            raise FormatError(f"invalid fingerprinter configuration: {exc}") from exc

    def __eq__(self, other):
        if not isinstance(other, Fingerprinter):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    def __hash__(self):
        return hash(self.to_bytes())


def _feature_pieces(fp: Fingerprinter, stream: FeatureStream, pieces, prepared: bool):
    """Yield feature arrays of a text given as str or bytes pieces (prepared:
    already through :meth:`Fingerprinter.text`)."""
    import codecs
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    first = True
    for piece in pieces:
        if isinstance(piece, (bytes, bytearray, memoryview)):
            if first:
                decode_text(bytes(piece[:8000]), binary=fp.binary)  # binary check only
            piece = decoder.decode(bytes(piece))
        elif not isinstance(piece, str):
            raise TypeError(f"pieces must be str or bytes, got {type(piece).__name__}")
        first = False
        if fp.html and not prepared:
            piece = html_to_text(piece)
        for feats in stream.feed_pieces(piece):   # a long piece, a PIECE_CHARS at a time
            if len(feats):
                yield feats
    tail = decoder.decode(b"", final=True)      # a character cut short at the end
    for feats in [*stream.feed_pieces(tail), stream.close()]:
        if len(feats):
            yield feats
