"""Fingerprints from documents: simhash, shingles, MinHash.

text -> normalise (NFKC, case fold) -> tokens (words, chars, lines) -> stop
words, stemming -> n-gram shingles -> XXH64 or Rabin hashes -> weights ->
simhash (Charikar) or MinHash sketch (Broder).  Knows nothing of storage.
The :class:`Fingerprinter` holds every choice and is what the index stores.
"""

from ndindex.fingerprint.features import (ENGLISH_STOP_WORDS, FeatureSpec, FeatureStream,
                                          extract, extract_stream, tokens)
from ndindex.fingerprint.fingerprinter import FORMAT_VERSION, Fingerprinter
from ndindex.fingerprint.hashing import (DEFAULT_SEED, RABIN_POLY, feature_hash, hash_rows,
                                         rabin_fingerprint)
from ndindex.fingerprint.html import html_to_text
from ndindex.fingerprint.minhash import (DEFAULT_BOTTOM_K, DEFAULT_NUM_PERM, bottom_k,
                                         bottom_k_jaccard, MinHashFamily, bucket_pairs,
                                         jaccard_estimate, jaccard_estimates,
                                         lsh_band_keys, lsh_candidate_pairs, optimal_bands,
                                         super_shingles)
from ndindex.fingerprint.normalize import (BinaryDataError, decode_text, looks_binary,
                                           normalize_text)
from ndindex.fingerprint.simhash import (SimhashAccumulator, hamming, popcount64, simhash,
                                         simhash_with_weights)
from ndindex.fingerprint.volatility import DEFAULT_FLIP_MODEL, FlipModel, normalised_margins
from ndindex.fingerprint.weights import WEIGHTINGS, FeatureCounts, IdfTable, weigh, weigh_counts

__all__ = [
    "Fingerprinter", "FORMAT_VERSION", "FeatureSpec", "FeatureStream", "extract",
    "extract_stream", "tokens", "ENGLISH_STOP_WORDS", "normalize_text", "decode_text",
    "looks_binary", "BinaryDataError", "html_to_text", "feature_hash", "hash_rows",
    "rabin_fingerprint", "DEFAULT_SEED", "RABIN_POLY", "simhash", "simhash_with_weights",
    "SimhashAccumulator", "hamming", "popcount64", "WEIGHTINGS", "IdfTable", "FeatureCounts",
    "weigh", "weigh_counts", "MinHashFamily", "DEFAULT_NUM_PERM", "jaccard_estimate",
    "jaccard_estimates", "super_shingles", "optimal_bands", "lsh_band_keys", "bucket_pairs",
    "lsh_candidate_pairs", "bottom_k", "bottom_k_jaccard", "DEFAULT_BOTTOM_K",
    "FlipModel", "DEFAULT_FLIP_MODEL", "normalised_margins",
]
