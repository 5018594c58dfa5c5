"""Fingerprints from documents (simhash, MinHash)."""
