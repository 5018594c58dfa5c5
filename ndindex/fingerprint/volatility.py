"""Bit volatility: the chance that a simhash bit flips in a near-duplicate.

Sood and Loguinov (CIKM 2011): bit j of a document u flips in a
near-duplicate when an edit moves V_j across zero, so

    p_j(u) = P(Y > |V_j(u)|),

where Y is the change of weight an edit causes, counted towards zero:
Y = -sign(V_j(u)) * (V_j(v) - V_j(u)) for a near-duplicate v.  The model
here ([FP80]):

* margins are normalised by the document's own scale: z_j = |V_j| / rms(V),
  rms(V) = sqrt(mean_j V_j^2).  For random feature hashes E[V_j^2] is the
  sum of squared feature weights, so rms(V) measures the document's weight
  mass from V alone, and an edit of a given fraction of the text moves V by
  a similar number of rms units in a short paragraph and a long file;
* Y / rms(V) is taken as Normal(mu, sigma), so
  p_j = P(Y > z_j) = erfc((z_j - mu) / (sigma * sqrt 2)) / 2.

Two numbers, fitted by moments from known near-duplicate pairs
(:meth:`FlipModel.fit`).  The evaluation (docs/psm.md) compared it with the
empirical survival function of Y (16 knots), a binned flip rate per margin
and a logistic fit of flips on z: on held-out pairs all four order flip
sets alike (95% of the pairs at distance 3 found within 957-1102 of the
41,664 sets, the normal model first), so the two-number model is kept.
The same normal model on raw margins |V_j| (no normalisation) orders the
sets of one size as well but predicts flips much worse (13.4 nats per pair
against 10.3), since a paragraph's and a file's weights differ in scale by
10x or more; that matters where sizes 0..k are merged.

The model only orders probes; it never changes a fingerprint or what counts
as a match, so a reader may use any model (or none) on any index.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["FlipModel", "DEFAULT_FLIP_MODEL", "normalised_margins"]

_SQRT2 = math.sqrt(2.0)


def normalised_margins(weights) -> np.ndarray:
    """Return z = |V| / rms(V) per row of weights ((64,) or (n, 64)).

    A row of zeros (no features) gives z = 0 for every bit.
    """
    v = np.asarray(weights, dtype=np.float64)
    if v.ndim not in (1, 2) or v.shape[-1] != 64:
        raise ValueError(f"weights must have shape (64,) or (n, 64), got {v.shape}")
    rms = np.sqrt(np.mean(v * v, axis=-1, keepdims=True))
    return np.abs(v) / np.where(rms > 0, rms, 1.0)


@dataclasses.dataclass(frozen=True)
class FlipModel:
    """p_j = P(Y > |V_j| / rms(V)) with Y ~ Normal(mu, sigma).

    Attributes:
        mu: mean of the normalised weight change towards zero.
        sigma: its standard deviation (> 0).

    Construction raises ValueError for a non-finite mu or a sigma that is
    not a positive finite number.
    """

    mu: float
    sigma: float

    def __post_init__(self):
        if not isinstance(self.mu, (int, float)) or not math.isfinite(self.mu):
            raise ValueError(f"mu must be a finite number, got {self.mu!r}")
        if not isinstance(self.sigma, (int, float)) or not (math.isfinite(self.sigma)
                                                             and self.sigma > 0):
            raise ValueError(f"sigma must be a positive finite number, got {self.sigma!r}")
        object.__setattr__(self, "mu", float(self.mu))
        object.__setattr__(self, "sigma", float(self.sigma))

    def probabilities(self, weights) -> np.ndarray:
        """Return the flip probability of each bit from the weight vector V.

        Parameters:
            weights: V of one document (64 values, V[j] for bit j) or of n
                documents ((n, 64)), as ``Fingerprinter.simhash_with_weights``
                returns it.

        Returns:
            float64 array of the same shape, each value in [0, 1].

        Raises:
            ValueError: a shape other than (64,) or (n, 64).
        """
        z = normalised_margins(weights)
        scale = 1.0 / (self.sigma * _SQRT2)
        erfc = np.frompyfunc(math.erfc, 1, 1)
        return (0.5 * erfc((z - self.mu) * scale)).astype(np.float64)

    @classmethod
    def fit(cls, weights_a, weights_b) -> FlipModel:
        """Fit mu and sigma from near-duplicate pairs (a[i], b[i]).

        Parameters:
            weights_a, weights_b: (n, 64) weight vectors of the two documents
                of each pair.  Each pair is used in both directions, since
                either document may be the query.

        Returns:
            The model whose mu and sigma are the mean and standard deviation
            of Y / rms(V) over every bit of every directed pair.

        Raises:
            ValueError: shapes differ or are not (n, 64) with n >= 1.
        """
        a = np.asarray(weights_a, dtype=np.float64)
        b = np.asarray(weights_b, dtype=np.float64)
        if a.shape != b.shape or a.ndim != 2 or a.shape[1] != 64 or len(a) == 0:
            raise ValueError(f"need two (n, 64) arrays of equal shape, got {a.shape}, {b.shape}")
        y = np.concatenate([_toward_zero(a, b), _toward_zero(b, a)])
        return cls(mu=float(y.mean()), sigma=float(y.std()))

    def to_dict(self) -> dict:
        """Return the JSON-able form ([FP81])."""
        return {"kind": "normal", "margin": "rms", "mu": self.mu, "sigma": self.sigma}

    @classmethod
    def from_dict(cls, d) -> FlipModel:
        """Rebuild from :meth:`to_dict` output.

        Raises:
            ValueError: other keys, another kind or margin, invalid numbers.
        """
        keys = {"kind", "margin", "mu", "sigma"}
        if not isinstance(d, dict) or set(d) != keys:
            raise ValueError(f"flip model must have keys {sorted(keys)}, got "
                             f"{sorted(d) if isinstance(d, dict) else type(d).__name__}")
        if d["kind"] != "normal" or d["margin"] != "rms":
            raise ValueError(f"flip model kind 'normal' with margin 'rms' expected, got "
                             f"{d['kind']!r} with {d['margin']!r}")
        if isinstance(d["mu"], bool) or isinstance(d["sigma"], bool):
            raise ValueError("mu and sigma must be numbers")
        return cls(mu=d["mu"], sigma=d["sigma"])


def _toward_zero(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Y / rms(V_a) for the edit a -> b, per bit: positive moves V_a towards zero."""
    rms = np.sqrt(np.mean(a * a, axis=1, keepdims=True))
    sign = np.where(a > 0, 1.0, -1.0)  # V = 0 is bit 0, so it flips when V grows
    return (-sign * (b - a) / np.where(rms > 0, rms, 1.0)).ravel()


#: Fitted on the fit half of the evaluation's near-duplicate pairs (exact
#: Jaccard of word 3-shingles >= 0.8; `python tools/eval/eval_psm.py`), for
#: the default features (words, tf).  The other half is what docs/psm.md
#: reports on.
DEFAULT_FLIP_MODEL = FlipModel(mu=0.0249, sigma=0.2612)
