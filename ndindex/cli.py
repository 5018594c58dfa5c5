"""The ``ndindex`` command: a thin layer over the public API.

Each subcommand is a function ``_cmd_<name>(args) -> int`` registered in
``_build_parser``; add new ones there.  Errors are one line on stderr,
``ndindex: error: ...``, with exit status 2 (usage errors included, unlike
argparse's default two-line message), so scripts can rely on a single line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ndindex.errors import NdindexError
from ndindex.plan import Plan, candidate_designs, choose_plan

EXIT_OK = 0
EXIT_ERROR = 2

_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}


class _UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse would print usage and call sys.exit(2)
        raise _UsageError(message)


def _count(text: str) -> int:
    """Parse a fingerprint count: 10000000, 1e7, 10M, 8B (K, M, G/B, T; decimal)."""
    text = text.strip().replace("_", "").replace(",", "")
    scale = _SUFFIXES.get(text[-1:].lower(), 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number) * scale if any(c in number for c in ".eE") \
            else int(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    return int(value)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ndindex", description="Embedded near-duplicate index tools.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    plan = commands.add_parser("plan", help="choose a table design for n fingerprints and k",
                               description="Print the table design the planner chooses and "
                                           "the candidates it weighed.")
    plan.add_argument("-n", type=_count, required=True, metavar="N",
                      help="expected number of fingerprints (e.g. 10000000, 1e7, 10M, 8B)")
    plan.add_argument("-k", type=int, required=True, metavar="K",
                      help="Hamming distance to answer, 0..7")
    plan.add_argument("--max-tables", type=int, metavar="T", help="at most T tables")
    plan.add_argument("--max-probe-entries", type=float, metavar="E",
                      help="fewest tables expecting at most E entries per probe")
    plan.add_argument("--tables", action="store_true",
                      help="also list the chosen design's tables and permutations")
    plan.add_argument("--json", action="store_true", help="print JSON instead of text")
    plan.set_defaults(run=_cmd_plan)
    return parser


def _summary(plan: Plan, n: int, reference_cost: float) -> dict:
    prefixes = [t.prefix_bits for t in plan.tables]
    cost = plan.estimated_query_cost(n)
    return {
        "tables": len(plan.tables),
        "p_min": min(prefixes),
        "p_max": max(prefixes),
        "expected_probe_entries": plan.expected_probe_entries(n),
        "estimated_query_cost": cost,
        "relative_query_cost": cost / reference_cost,
        "scheme": plan.scheme,
    }


def _within_budget(plan: Plan, args) -> bool:
    return ((args.max_tables is None or len(plan.tables) <= args.max_tables)
            and (args.max_probe_entries is None
                 or plan.expected_probe_entries(args.n) <= args.max_probe_entries))


def _cmd_plan(args) -> int:
    chosen = choose_plan(args.n, args.k, max_tables=args.max_tables,
                         max_probe_entries=args.max_probe_entries)
    reference = chosen.estimated_query_cost(args.n)
    candidates = [dict(_summary(p, args.n, reference), chosen=(p == chosen),
                       within_budget=_within_budget(p, args))
                  for p in candidate_designs(args.k)]
    if args.json:
        chosen_info = dict(_summary(chosen, args.n, reference),
                           prefix_bits=[t.prefix_bits for t in chosen.tables],
                           plan_record_hex=chosen.to_bytes().hex())
        if args.tables:
            chosen_info["permutations"] = [list(t.permutation) for t in chosen.tables]
        print(json.dumps({"n": args.n, "k": args.k, "max_tables": args.max_tables,
                          "max_probe_entries": args.max_probe_entries,
                          "chosen": chosen_info, "candidates": candidates}, indent=2))
        return EXIT_OK
    s = _summary(chosen, args.n, reference)
    print(f"chosen: {s['tables']} tables, p={s['p_min']}..{s['p_max']} ({s['scheme']})")
    print(f"  n={args.n:,} k={args.k}: {s['expected_probe_entries']:.4g} entries per probe "
          f"at worst, estimated query cost {s['estimated_query_cost']:.4g} block decodes")
    print()
    print(f"candidates for k={args.k} (cost relative to the chosen design; "
          f"* chosen, - outside the budget):")
    print(f"     {'t':>4}  {'p':>7}  {'entries/probe':>13}  {'rel. cost':>9}  scheme")
    for c in candidates:
        mark = "*" if c["chosen"] else (" " if c["within_budget"] else "-")
        print(f"  {mark}  {c['tables']:>4}  {c['p_min']:>3}..{c['p_max']:<2}  "
              f"{c['expected_probe_entries']:>13.4g}  {c['relative_query_cost']:>9.3g}  "
              f"{c['scheme']}")
    if args.tables:
        print()
        print(chosen.describe())
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ndindex`` command line.

    Parameters: argv, the arguments without the program name (default sys.argv[1:]).
    Returns: the exit status: 0 on success, 2 on any error, reported as one
    line on stderr.
    """
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        return args.run(args)
    except SystemExit as exc:           # --help and --version exit through here
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except (_UsageError, ValueError, TypeError, NdindexError) as exc:
        print(f"ndindex: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
