"""Table designs for the Hamming Distance Problem (Manku, Jain, Das Sarma 2007, §3.1).

An index keeps t sorted tables of the same fingerprints.  Table i stores
pi_i(F) for a permutation pi_i of the 64 bit positions and is probed on its
top p_i bits: every entry whose top p_i bits equal those of pi_i(Q) is a
candidate, checked with popcount(x XOR pi_i(Q)) <= k.  A design is correct
when any set of at most k differing bits leaves at least one table's prefix
untouched; then every near-duplicate shares a prefix with the query in some
table.

Designs come from the paper's block scheme.  Split the f bit positions into r
blocks; choose r - k of them as the leading bits of a table, one table per
choice (C(r, k) tables).  At most k blocks hold a differing bit, so by
pigeonhole some choice of r - k blocks is clean.  A design may recurse: the
bits left over after the chosen blocks are split again into r' blocks, r' - k
of which follow, and so on.  The prefix of a table is exactly the bits of its
chosen blocks, never more, because only those are guaranteed clean.

Conventions used throughout (they are a contract with the file format):

* Bit positions are numbered 0 (least significant) to 63 (most significant).
* Blocks are cut from the most significant end: block 0 holds the highest
  bits.  A split of m bits into r blocks gives the first m mod r blocks
  floor(m / r) + 1 bits and the rest floor(m / r) bits (64 into 6 blocks is
  11, 11, 11, 11, 10, 10).
* Within a table the chosen blocks keep their relative order at the front,
  and every remaining bit follows in its original order.
* Tables are listed in lexicographic order of the chosen block indices,
  level by level (``itertools.combinations`` order).

``permutation[i]`` names the input bit that lands at output bit 63 - i, so
``permutation[:p]`` are the prefix bits, most significant first.  Permuting
is done with a handful of shift-and-mask "runs" (maximal stretches of
consecutive bits that move together), vectorised over numpy arrays.

A *probabilistic* plan (:func:`psm_plan`; Sood and Loguinov's probabilistic
simhash matching, ``ndindex.psm``) is one table whose prefix need not avoid
the differing bits: a query probes the prefix of pi(Q) XOR each flip set of
at most k prefix bits, the most probable first, and may stop early.  The
plan record says so in its flags byte (FORMAT.md section 6, [P5], [P13]).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np

from ndindex import _core
from ndindex.errors import FormatError

__all__ = [
    "F_BITS", "BLOCK_ENTRIES", "PROBE_OVERHEAD_BLOCKS", "MAX_TABLES", "MAX_PLANNER_K",
    "MAX_PLANNED_PREFIX_BITS", "PLAN_FLAG_PROBABILISTIC", "MAX_PSM_HEADER_BITS",
    "PSM_ENTRIES_PER_HEADER", "TableDesign", "Plan", "block_design", "example_3_1", "x_tables",
    "candidate_designs", "choose_plan", "flip_set_count", "psm_header_bits", "psm_plan",
    "psm_max_probes",
]

F_BITS = 64
"""Fingerprint width in bits; the only width the format stores."""

BLOCK_ENTRIES = 180
"""Fingerprints in one 1024-byte compressed block (about 150-200 in practice)."""

PROBE_OVERHEAD_BLOCKS = 1.0
"""Fixed cost of probing one table (binary search over block keys, call setup),
in units of one block decode."""

MAX_TABLES = 255
"""Largest table count the plan record can hold (a u8)."""

MAX_PLANNER_K = 12
"""Largest k the planner designs for (and the tests cover).  Beyond it the block
scheme needs many tables for short prefixes (k = 8 with 45 tables has p = 12);
a plan record may still name any k < 64."""

MAX_PLANNED_PREFIX_BITS = 48
"""Designs whose shortest prefix exceeds this are not considered: such a prefix
only pays off past 2^48 (2.8e14) fingerprints, far beyond an embedded index."""

PLAN_FLAG_PROBABILISTIC = 0x01
"""Bit 0 of the plan record's flags byte ([P5], [P13]): table 0 is probed by flip
sets (probabilistic simhash matching); the plan need not meet [P10]."""

_KNOWN_PLAN_FLAGS = PLAN_FLAG_PROBABILISTIC

MAX_PSM_HEADER_BITS = 40
"""Most prefix bits psm_plan gives its table: 2^40 headers is far past any embedded index."""

PSM_ENTRIES_PER_HEADER = 64
"""Stored fingerprints psm_plan expects under one prefix value (see psm_header_bits)."""


_PLAN_HEADER_BYTES = 4
_TABLE_ENTRY_BYTES = 1 + F_BITS
_MASK64 = (1 << 64) - 1
_IDENTITY = tuple(range(F_BITS - 1, -1, -1))   # MSB first: input bit 63 lands at 63


@dataclass(frozen=True)
class TableDesign:
    """One table: a permutation of the 64 bit positions and a prefix length.

    ``permutation[i]`` is the input bit position (0 = LSB, 63 = MSB) that lands
    at output bit 63 - i; ``permutation[:prefix_bits]`` are the prefix bits,
    most significant first.  Construction raises ValueError unless the
    permutation holds each of 0..63 once and 0 <= prefix_bits <= 64.
    """

    permutation: tuple[int, ...]
    prefix_bits: int

    def __post_init__(self):
        perm = tuple(int(b) for b in self.permutation)
        if len(perm) != F_BITS or sorted(perm) != list(range(F_BITS)):
            raise ValueError(f"permutation must hold each of 0..63 once, found {perm!r}")
        if not 0 <= self.prefix_bits <= F_BITS:
            raise ValueError(f"prefix_bits must be 0..64, found {self.prefix_bits}")
        object.__setattr__(self, "permutation", perm)

    @functools.cached_property
    def _runs(self) -> tuple[tuple[int, int, int], ...]:
        runs = []
        i = 0
        while i < F_BITS:
            j = i
            # Output bits 63-i, 63-i-1, ... take input bits that also descend by one.
            while j + 1 < F_BITS and self.permutation[j + 1] == self.permutation[j] - 1:
                j += 1
            runs.append((self.permutation[j], F_BITS - 1 - j, j - i + 1))
            i = j + 1
        return tuple(runs)

    @property
    def keeps_order(self) -> bool:
        """Whether apply() is the identity, so the table's order is the fingerprints'."""
        return self.permutation == tuple(range(F_BITS - 1, -1, -1))

    def runs(self) -> tuple[tuple[int, int, int], ...]:
        """Return the maximal runs (src_lo, dst_lo, length) of the permutation.

        Input bits src_lo..src_lo+length-1 land at output bits
        dst_lo..dst_lo+length-1, so apply() is the OR over runs of
        ((x >> src_lo) & mask(length)) << dst_lo.  Runs are listed from the
        most significant output bit down.  Cost: computed once, O(64).
        """
        return self._runs

    def apply(self, fps):
        """Permute fingerprints: output bit 63 - i takes input bit permutation[i].

        Parameters: fps, a numpy uint64 array (any shape), a sequence of ints,
        or one Python int in 0..2^64-1.
        Returns: a new uint64 array of the same shape, or an int for an int.
        Raises: TypeError for a non-uint64 array; ValueError for an int out of range.
        Cost: one shift, mask and OR per run (a few for block designs) per element.
        """
        return _move_runs(fps, self._runs)

    def invert(self, permuted):
        """Undo apply(): return the fingerprints whose permutation is ``permuted``.

        Same inputs, outputs, errors and cost as apply(); invert(apply(x)) == x.
        """
        return _move_runs(permuted, self._inverse_runs)

    @functools.cached_property
    def _inverse_runs(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((dst, src, length) for src, dst, length in self._runs)

    def prefix(self, fps):
        """Return the top prefix_bits of apply(fps), right-aligned, as uint64.

        A table with prefix_bits = 0 gives zeros (every entry matches).  Same
        inputs, errors and cost as apply(); an int gives an int.
        """
        permuted = self.apply(fps)
        shift = F_BITS - self.prefix_bits
        if isinstance(permuted, int):
            return permuted >> shift if shift < F_BITS else 0
        if shift == F_BITS:     # numpy shifts by 64 are undefined, not zero
            return np.zeros_like(permuted)
        return permuted >> np.uint64(shift)


_KERNEL_MIN_SIZE = 4096


def _move_runs(fps, runs):
    """Apply shift-and-mask runs to an int or a uint64 array (see TableDesign.runs)."""
    if isinstance(fps, (int, np.integer)) and not isinstance(fps, bool):
        x = int(fps)
        if not 0 <= x <= _MASK64:
            raise ValueError(f"fingerprint must be in 0..2^64-1, found {x}")
        out = 0
        for src, dst, length in runs:
            out |= ((x >> src) & ((1 << length) - 1)) << dst
        return out
    if isinstance(fps, np.ndarray):
        if fps.dtype != np.uint64:
            raise TypeError(f"fingerprints must be a uint64 array, found dtype {fps.dtype}")
        x = fps
    else:
        x = np.array(fps, dtype=np.uint64)
    if x.size >= _KERNEL_MIN_SIZE:
        # One pass in C instead of four numpy passes per run.
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        _core.permute(x, runs, out)
        return out
    out = np.zeros_like(x)
    for src, dst, length in runs:
        out |= ((x >> np.uint64(src)) & np.uint64((1 << length) - 1)) << np.uint64(dst)
    return out


@dataclass(frozen=True)
class Plan:
    """A table design: k and the tables that together find every k-near-duplicate.

    ``scheme`` is a human-readable note on how the design was made (for
    describe() and the CLI); it is not serialised and not compared.
    ``probabilistic`` marks a PSM plan (see :func:`psm_plan`): one table,
    queried by flip sets of its prefix bits rather than by [P10] coverage.
    Construction raises ValueError unless f == 64, 0 <= k < 64 and
    1 <= len(tables) <= 255 (exactly 1 when probabilistic).
    """

    k: int
    tables: tuple[TableDesign, ...]
    f: int = F_BITS
    scheme: str = field(default="", compare=False)
    probabilistic: bool = False

    def __post_init__(self):
        object.__setattr__(self, "tables", tuple(self.tables))
        if self.f != F_BITS:
            raise ValueError(f"f must be {F_BITS}, found {self.f}")
        if not 0 <= self.k < F_BITS:
            raise ValueError(f"k must be 0..63, found {self.k}")
        if not 1 <= len(self.tables) <= MAX_TABLES:
            raise ValueError(f"a plan needs 1..{MAX_TABLES} tables, found {len(self.tables)}")
        if not all(isinstance(t, TableDesign) for t in self.tables):
            raise TypeError("tables must be TableDesign instances")
        if self.probabilistic and len(self.tables) != 1:
            raise ValueError(f"a probabilistic plan has one table, found {len(self.tables)}")

    def expected_probe_entries(self, n: float) -> float:
        """Return the largest expected number of entries one probe sees, for n stored.

        With random fingerprints a table of prefix p holds n / 2^p entries per
        prefix; the worst table (shortest prefix) bounds a probe.  Cost: O(t).
        """
        return n / 2.0 ** min(t.prefix_bits for t in self.tables)

    def estimated_query_cost(self, n: float) -> float:
        """Return the estimated cost of one query over n fingerprints, in block decodes.

        Per table: PROBE_OVERHEAD_BLOCKS + max(1, n / 2^p / BLOCK_ENTRIES); see
        choose_plan() for the model.  Cost: O(t).
        """
        return sum(PROBE_OVERHEAD_BLOCKS + max(1.0, n / 2.0 ** t.prefix_bits / BLOCK_ENTRIES)
                   for t in self.tables)

    def describe(self) -> str:
        """Return a several-line human-readable account of the plan.

        One header line (k, t, prefix range, scheme), then one line per table
        with its prefix length and where each run of input bits lands.
        """
        ps = [t.prefix_bits for t in self.tables]
        lines = [f"plan: f={self.f} k={self.k} t={len(self.tables)} "
                 f"p={min(ps)}..{max(ps)}" + (" probabilistic" if self.probabilistic else "")
                 + (f" ({self.scheme})" if self.scheme else "")]
        for i, table in enumerate(self.tables):
            moves = ", ".join(f"in[{s + n - 1}:{s}]->out[{d + n - 1}:{d}]"
                              for s, d, n in table.runs())
            lines.append(f"  table {i}: p={table.prefix_bits}  {moves}")
        return "\n".join(lines)

    def to_bytes(self) -> bytes:
        """Serialise to the plan record: u8 f, u8 k, u8 t, u8 flags, then t x (u8 p, 64 x u8).

        flags is PLAN_FLAG_PROBABILISTIC for a probabilistic plan, else 0.
        See format-spec/FORMAT.md section 6.  Cost: O(64 t).
        """
        flags = PLAN_FLAG_PROBABILISTIC if self.probabilistic else 0
        out = bytearray((self.f, self.k, len(self.tables), flags))
        for table in self.tables:
            out.append(table.prefix_bits)
            out += bytes(table.permutation)
        return bytes(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Plan":
        """Parse a plan record written by to_bytes().

        Parameters: data, any bytes-like object.
        Returns: the Plan (with an empty scheme).
        Raises: FormatError naming the field, the value expected and the value
        found, for a wrong length, f != 64, k >= 64, a reserved flags bit set,
        a probabilistic plan with t != 1, t == 0, p > 64 or a permutation that
        is not one.  Readers do not check coverage (that would cost C(64, k)
        work); writers must ensure it.
        """
        data = bytes(data)
        if len(data) < _PLAN_HEADER_BYTES:
            raise FormatError(f"plan record is {len(data)} bytes, expected at least "
                              f"{_PLAN_HEADER_BYTES}")
        f, k, t, flags = data[:_PLAN_HEADER_BYTES]
        if f != F_BITS:
            raise FormatError(f"plan f is {f}, expected {F_BITS}")
        if k >= F_BITS:
            raise FormatError(f"plan k is {k}, expected 0..{F_BITS - 1}")
        if flags & ~_KNOWN_PLAN_FLAGS:
            raise FormatError(f"plan flags byte 3 is {flags:#04x}: reserved bits "
                              f"{flags & ~_KNOWN_PLAN_FLAGS:#04x} are set, expected 0")
        if t == 0:
            raise FormatError("plan table count t is 0, expected 1..255")
        probabilistic = bool(flags & PLAN_FLAG_PROBABILISTIC)
        if probabilistic and t != 1:
            raise FormatError(f"plan is probabilistic (flags bit 0) with t={t}, expected t=1")
        expected = _PLAN_HEADER_BYTES + t * _TABLE_ENTRY_BYTES
        if len(data) != expected:
            raise FormatError(f"plan record is {len(data)} bytes, expected {expected} "
                              f"for t={t}")
        tables = []
        for i in range(t):
            entry = data[_PLAN_HEADER_BYTES + i * _TABLE_ENTRY_BYTES:][:_TABLE_ENTRY_BYTES]
            if entry[0] > F_BITS:
                raise FormatError(f"table {i}: prefix_bits is {entry[0]}, expected 0..64")
            seen = set()
            for j, bit in enumerate(entry[1:]):
                if bit >= F_BITS:
                    raise FormatError(f"table {i}: permutation byte {j} is {bit}, "
                                      f"expected 0..63")
                if bit in seen:
                    raise FormatError(f"table {i}: permutation repeats bit {bit}")
                seen.add(bit)
            tables.append(TableDesign(tuple(entry[1:]), entry[0]))
        return cls(k=k, tables=tuple(tables), f=f, probabilistic=probabilistic)

    def covers(self, flipped_bits: Iterable[int]) -> bool:
        """Return True if some table's prefix bits avoid every flipped position.

        Parameters: flipped_bits, bit positions 0..63 (duplicates allowed).
        Raises: ValueError for a position outside 0..63.  Cost: O(t * 64).
        """
        flipped = set(flipped_bits)
        if any(not 0 <= b < F_BITS for b in flipped):
            raise ValueError(f"bit positions must be 0..63, found {sorted(flipped)}")
        return any(flipped.isdisjoint(t.permutation[:t.prefix_bits]) for t in self.tables)


# --- the block scheme -------------------------------------------------------

def _split(positions: Sequence[int], r: int) -> list[tuple[int, ...]]:
    """Cut positions (MSB first) into r blocks whose sizes differ by at most one, larger first."""
    size, extra = divmod(len(positions), r)
    blocks, start = [], 0
    for i in range(r):
        end = start + size + (1 if i < extra else 0)
        blocks.append(tuple(positions[start:end]))
        start = end
    return blocks


def _leading_bits(positions: tuple[int, ...], k: int,
                  levels: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Yield, per table, the prefix positions chosen level by level (MSB first)."""
    if not levels:
        yield ()
        return
    r = levels[0]
    blocks = _split(positions, r)
    for chosen in itertools.combinations(range(r), r - k):
        lead = tuple(b for i in chosen for b in blocks[i])
        rest = tuple(b for i in range(r) if i not in chosen for b in blocks[i])
        for deeper in _leading_bits(rest, k, levels[1:]):
            yield lead + deeper


def block_design(k: int, levels: Sequence[int]) -> Plan:
    """Build the block-scheme design that splits into levels[0] blocks, then levels[1], ...

    At each level the bits not yet chosen are split into r blocks (sizes
    differing by at most one, larger blocks at the more significant end) and
    r - k of them are chosen, in every C(r, k) way; the table count is the
    product of C(r, k) over levels.  The prefix is the chosen blocks' bits in
    their original relative order; the other bits follow in original order.

    Parameters: k >= 0; levels, block counts each > k and no larger than the
    bits left at that level.  (k = 0, levels = (1,) is the identity with
    p = 64; empty levels give one identity table with p = 0, a full scan.)
    Returns: the Plan.  Raises: ValueError for an impossible split or more
    than 255 tables.  Cost: O(64 t).
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, found {k}")
    fewest_left = F_BITS   # bits left after the largest possible choice so far
    for r in levels:
        if not k < r <= fewest_left:
            raise ValueError(f"cannot split {fewest_left} bits into {r} blocks for k={k}: "
                             f"need {k} < r <= {fewest_left}")
        fewest_left -= _chosen_bits(fewest_left, r, k)[1]
    count = math.prod(math.comb(r, k) for r in levels)
    if count > MAX_TABLES:
        raise ValueError(f"design {tuple(levels)} for k={k} needs {count} tables, "
                         f"more than {MAX_TABLES}")
    tables = []
    for lead in _leading_bits(_IDENTITY, k, levels):
        lead_set = set(lead)
        perm = lead + tuple(b for b in _IDENTITY if b not in lead_set)
        tables.append(TableDesign(perm, len(lead)))
    return Plan(k=k, tables=tuple(tables), scheme=_scheme_name(k, levels))


def _chosen_bits(bits: int, r: int, k: int) -> tuple[int, int]:
    """Return the fewest and most bits that r - k of r balanced blocks of `bits` hold."""
    size, extra = divmod(bits, r)
    return (r - k) * size + max(0, extra - k), (r - k) * size + min(extra, r - k)


def _scheme_name(k: int, levels: Sequence[int]) -> str:
    """Name a design by its block sizes per level, e.g. "4x16 choose 1, then 4x12 choose 1"."""
    if not levels:
        return "no blocks: one table, p = 0, a scan"
    parts, lo, hi = [], F_BITS, F_BITS   # range of bits left at this level over tables
    for r in levels:
        if lo == hi:
            sizes = [len(b) for b in _split(range(lo), r)]
            shown = f"{r}x{sizes[0]}" if len(set(sizes)) == 1 else "+".join(map(str, sizes))
        else:
            shown = f"{r} blocks of {lo // r}..{-(-hi // r)}"
        parts.append(f"{shown} choose {r - k}")
        lo, hi = lo - _chosen_bits(lo, r, k)[1], hi - _chosen_bits(hi, r, k)[0]
    return ", then ".join(parts)


_EXAMPLE_3_1_LEVELS = {20: (6,), 16: (4, 4), 10: (5,), 4: (4,)}


def example_3_1(num_tables: int) -> Plan:
    """Return one of the paper's Example 3.1 designs for f = 64, k = 3.

    20 tables: 6 blocks (11,11,11,11,10,10), choose 3, p = 31..33.
    16 tables: 4 x 16 choose 1, then the other 48 bits as 4 x 12 choose 1, p = 28.
    10 tables: 5 blocks (13,13,13,13,12), choose 2, p = 25..26.
    4 tables: 4 x 16 choose 1, p = 16.
    Raises: ValueError for any other num_tables.
    """
    if num_tables not in _EXAMPLE_3_1_LEVELS:
        raise ValueError(f"Example 3.1 has designs of 20, 16, 10 or 4 tables, "
                         f"not {num_tables}")
    return block_design(3, _EXAMPLE_3_1_LEVELS[num_tables])


# --- §3.1.2: how many tables ------------------------------------------------

def x_tables(f: int, k: int, d: int, tau: int) -> int:
    """Return X(f, k, d): the fewest tables a recursive block design needs (§3.1.2).

    The paper's recurrence is X(f, k, d) = 1 if d < tau, else the minimum
    over r > k of C(r, k) * X(f k / r, k, d - (r - k) f / r): with 2^d
    fingerprints stored, one level of r blocks lengthens every prefix by
    (r - k) f / r bits and leaves f k / r bits for the next level; once fewer
    than 2^tau entries per probe are expected, no more tables are needed.

    Integer splits, no rounding: f bits split into r blocks of floor(f / r)
    and floor(f / r) + 1 bits (sizes differ by at most one, as 13,13,13,13,12).
    Choices of r - k blocks then gain different numbers of bits, so instead
    of C(r, k) copies of one branch we sum X over the C(r, k) choices, grouped
    by how many of the larger blocks each takes (each group's branch has
    f - g bits left and d - g to go, g the bits it gained).  When r divides
    f this is exactly the paper's C(r, k) * X(...).

    Parameters: f >= 1 bits still to split; k >= 0; d, tau integers.
    Returns: the table count.
    Raises: ValueError for bad arguments, or when no design reaches d < tau
    (a design can gain at most f - k bits of prefix).
    Cost: memoised over (f, k, d, tau); a first call visits a few dozen
    states of O(f) choices of r each (about 1 ms at f = 64, d = 60).
    """
    if f < 1 or k < 0:
        raise ValueError(f"x_tables needs f >= 1 and k >= 0, found f={f}, k={k}")
    tables = _x(int(f), int(k), int(d), int(tau))
    if tables == math.inf:
        raise ValueError(f"no design of {f} bits reaches d < tau for k={k}, d={d}, "
                         f"tau={tau}: at most {max(f - k, 0)} prefix bits can be gained")
    return int(tables)


@functools.lru_cache(maxsize=None)
def _x(f: int, k: int, d: int, tau: int) -> float:
    """X(f, k, d) for tau, math.inf when unreachable (see x_tables)."""
    if d < tau:
        return 1
    best = math.inf
    for r in range(k + 1, f + 1):
        if math.comb(r, k) >= best:   # every branch needs at least one table
            break
        size, extra = divmod(f, r)    # `extra` blocks of size + 1, r - extra of size
        total = 0
        for big in range(max(0, (r - k) - (r - extra)), min(extra, r - k) + 1):
            gained = big * (size + 1) + (r - k - big) * size
            ways = math.comb(extra, big) * math.comb(r - extra, r - k - big)
            total += ways * _x(f - gained, k, d - gained, tau)
        best = min(best, total)
    return best


# --- the planner ------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _candidates(k: int) -> tuple[Plan, ...]:
    """All one- and two-level designs for k within the limits (see candidate_designs)."""
    if k == 0:
        return (block_design(0, (1,)),)   # one block, all of it chosen: p = 64
    found = []
    # C(r, k) and the bits chosen grow with r, so the first r over either
    # limit ends each loop; the prefix bound is checked before building.
    for r1 in range(k + 1, F_BITS + 1):
        fewest1, most1 = _chosen_bits(F_BITS, r1, k)
        if math.comb(r1, k) > MAX_TABLES or fewest1 > MAX_PLANNED_PREFIX_BITS:
            break
        found.append((1, block_design(k, (r1,))))
        for r2 in range(k + 1, F_BITS - most1 + 1):
            shortest = fewest1 + _chosen_bits(F_BITS - most1, r2, k)[0]
            if (math.comb(r1, k) * math.comb(r2, k) > MAX_TABLES
                    or shortest > MAX_PLANNED_PREFIX_BITS):
                break
            plan = block_design(k, (r1, r2))
            if _min_prefix(plan) <= MAX_PLANNED_PREFIX_BITS:
                found.append((2, plan))
    # Designs with the same prefix lengths cost the same; keep the simplest.
    unique = {}
    for _, plan in sorted(found, key=lambda e: e[0]):
        unique.setdefault(tuple(sorted(t.prefix_bits for t in plan.tables)), plan)
    return tuple(sorted(unique.values(), key=lambda p: (len(p.tables), -_min_prefix(p))))


def candidate_designs(k: int) -> list[Plan]:
    """Return every design the planner considers for k, fewest tables first.

    For k = 0 that is the identity with p = 64.  For 1 <= k <= MAX_PLANNER_K (12): every one-
    and two-level block design (see block_design) with at most 255 tables
    whose shortest prefix is at most MAX_PLANNED_PREFIX_BITS (48) bits.  Each
    one covers every set of at most k flipped bits by the pigeonhole argument.
    Raises: ValueError for k outside 0..MAX_PLANNER_K.  Cost: built once per k (under 0.1 s).
    """
    return list(_candidates(check_k(k)))


def check_k(k) -> int:
    """A k the planner can build tables for: an int in 0..MAX_PLANNER_K (its
    designs are made and tested for those)."""
    if not isinstance(k, (int, np.integer)) or isinstance(k, (bool, np.bool_)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 0 <= k <= MAX_PLANNER_K:
        raise ValueError(f"k must be in 0..{MAX_PLANNER_K}, got {k}")
    return int(k)


def _min_prefix(plan: Plan) -> int:
    return min(t.prefix_bits for t in plan.tables)


#: The most fingerprints an index can hold: every 64-bit value once.
MAX_EXPECTED_N = (1 << 64) - 1


def _check_expected_n(expected_n) -> None:
    if not 1 <= expected_n <= MAX_EXPECTED_N:
        raise ValueError(f"expected_n must be in 1..2^64-1 (an index holds each 64-bit value "
                         f"once), found {expected_n}")


def choose_plan(expected_n: int, k: int, *, max_tables: int | None = None,
                max_probe_entries: float | None = None) -> Plan:
    """Choose a table design for about expected_n fingerprints and distance k.

    Cost model.  A probe of a table with prefix p costs a binary search over
    the table's block keys plus decoding every block its n / 2^p matching
    entries span, and at least one whole block: a 1024-byte block holds about
    150-200 fingerprints, taken as BLOCK_ENTRIES = 180.  So a table costs
    PROBE_OVERHEAD_BLOCKS (1.0, the search and call) + max(1, n / 2^p / 180)
    block decodes, and a query costs the sum over tables.  Space grows in
    proportion to t.  Because of the one-block floor, tables stop paying once
    a probe fits in a block: at n = 10M, k = 3 the 4-table design (p = 16)
    expects 10M / 2^16 = 153 entries, one block, cost 4 x 2 = 8; the 10-table
    design would cost 20.  At n = 8e9 the 4-table design expects 122,070
    entries (678 blocks per table, cost about 2,717) and the 10-table design
    (p = 25..26: 238 or 119 entries) costs about 21, the least.

    Selection, among candidate_designs(k):
    * max_tables given: the cheapest query with t <= max_tables;
    * max_probe_entries given: the fewest tables whose expected_probe_entries
      is within the budget (ties to the cheaper query); with both, both bind;
    * neither: the cheapest query.
    Remaining ties go to fewer tables, then to the longer shortest prefix.

    Parameters: expected_n >= 1; k in 0..MAX_PLANNER_K (12); max_tables >= 1;
    max_probe_entries > 0.
    Returns: the Plan.
    Raises: TypeError for a k that is not an int; ValueError for k outside 0..MAX_PLANNER_K, expected_n < 1,
    a non-positive budget, or a budget no candidate meets.
    Cost: about a millisecond the first time for given arguments, then a
    cache lookup (check_and_add_many plans each batch's self-join: a
    millisecond a call of 1,000 was a tenth of the call).
    """
    k = check_k(k)
    _check_expected_n(expected_n)
    if max_tables is not None and max_tables < 1:
        raise ValueError(f"max_tables must be >= 1, found {max_tables}")
    if max_probe_entries is not None and not max_probe_entries > 0:
        raise ValueError(f"max_probe_entries must be > 0, found {max_probe_entries}")
    return _chosen(expected_n, k, max_tables, max_probe_entries)


@functools.lru_cache(maxsize=1024)
def _chosen(expected_n, k: int, max_tables, max_probe_entries) -> Plan:
    """choose_plan's answer for checked arguments (Plans are immutable)."""
    plans = [p for p in _candidates(k)
             if (max_tables is None or len(p.tables) <= max_tables)
             and (max_probe_entries is None
                  or p.expected_probe_entries(expected_n) <= max_probe_entries)]
    if not plans:
        allowed = [p for p in _candidates(k) if max_tables is None or len(p.tables) <= max_tables]
        if not allowed:
            raise ValueError(f"max_tables={max_tables} is too few for k={k}: the smallest "
                             f"design has {len(_candidates(k)[0].tables)} tables")
        best = min(p.expected_probe_entries(expected_n) for p in allowed)
        raise ValueError(f"no design for k={k} within max_tables={max_tables} expects at most "
                         f"{max_probe_entries} entries per probe at n={expected_n}; the best "
                         f"expects {best:.3g}")

    def cost(p: Plan) -> tuple:
        return (p.estimated_query_cost(expected_n), len(p.tables), -_min_prefix(p))

    if max_probe_entries is not None:
        return min(plans, key=lambda p: (len(p.tables),) + cost(p))
    return min(plans, key=cost)


# --- probabilistic simhash matching --------------------------------------------------

@functools.lru_cache(maxsize=256)
def flip_set_count(prefix_bits: int, k: int) -> int:
    """Return the number of flip sets of at most k of prefix_bits bits: the probes of
    an exhaustive (exact) probabilistic query."""
    return sum(math.comb(prefix_bits, h) for h in range(min(k, prefix_bits) + 1))


def psm_header_bits(expected_n: int) -> int:
    """Return the prefix length of psm_plan's table for about expected_n fingerprints.

    round(log2(expected_n / PSM_ENTRIES_PER_HEADER)), clamped to
    1..MAX_PSM_HEADER_BITS: about PSM_ENTRIES_PER_HEADER stored fingerprints
    under each prefix value.  Raises ValueError for expected_n < 1.
    """
    _check_expected_n(expected_n)
    bits = round(math.log2(max(expected_n / PSM_ENTRIES_PER_HEADER, 2)))
    return max(1, min(MAX_PSM_HEADER_BITS, bits))


def psm_max_probes(k: int) -> int:
    """Return how many flip sets a probabilistic query within k probes by default.

    2^round(6 + 2 (k - 3) / 7): 64 at k = 3, 128 at k = 6, 256 at k = 10.
    Measured on real text at psm_header_bits' prefixes
    (tools/bench/results/psm_index.txt): at k = 3, 64 probes find 99.4% or
    more of the pairs within 3 bits; at k = 10, 256 probes give the document
    pipeline the 66 tables' precision and recall; k = 6 lies between.  Raises
    ValueError for k outside 0..63.
    """
    k = operator.index(k)
    if not 0 <= k < F_BITS:
        raise ValueError(f"k must be 0..63, found {k}")
    return 2 ** round(6 + 2 * (k - 3) / 7)


def psm_plan(expected_n: int, k: int, *, header_bits: int | None = None) -> Plan:
    """Return the probabilistic plan: one table, identity permutation, p header bits.

    Queries probe the prefix of Q XOR each flip set of at most k of the p
    prefix bits in VOSH order of Q's flip probabilities (``ndindex.psm``),
    up to a budget; probing every set finds every fingerprint within k.

    Parameters: expected_n >= 1; k in 0..MAX_PLANNER_K; header_bits, p
    (default psm_header_bits(expected_n)), 1..MAX_PSM_HEADER_BITS.
    Returns: the Plan, probabilistic=True.
    Raises: ValueError for a bad expected_n, k or header_bits.
    """
    k = check_k(k)
    p = psm_header_bits(expected_n) if header_bits is None else operator.index(header_bits)
    if not 1 <= p <= MAX_PSM_HEADER_BITS:
        raise ValueError(f"header_bits must be 1..{MAX_PSM_HEADER_BITS}, found {p}")
    return Plan(k=k, tables=(TableDesign(_IDENTITY, p),), probabilistic=True,
                scheme=f"flip sets of the top {p} bits, most probable first")
