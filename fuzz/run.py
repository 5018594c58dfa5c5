"""Run the fuzz targets for a bounded time; exit nonzero on any finding.

Usage::

    python fuzz/run.py --seconds 60                  # every target, 60 s each
    python fuzz/run.py --seconds 300 --targets decode_block
    python fuzz/run.py --seconds 20 -- -max_len=4096 # extra libFuzzer flags

Each target runs as its own atheris (libFuzzer) process, all at once by
default (``--parallel``), seeded from ``fuzz/corpus/<target>/`` and
``fuzz/regressions/<target>/``.  New coverage goes to a scratch directory
(``--work-dir``), so the committed corpus only changes when someone means it
to.  A crashing, failing or hanging input is written by libFuzzer to
``fuzz/regressions/<target>/`` (crash-*, timeout-*, oom-*); commit it and
``tests/unit/test_fuzz_regressions.py`` replays it from then on.

Exit status: 0 when every target ran clean, 1 when any found something or
could not run.  Wall time is bounded by ``--seconds`` plus start-up; a
process still alive ``--grace`` seconds later is killed and counts as a
failure.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("decode_block", "decode_code", "round_trip_blocks", "record_chunk", "decode_raw_block")
#: libFuzzer's per-input limit: one input is a few blocks, decoded in ms.
INPUT_TIMEOUT_SECONDS = 10
RSS_LIMIT_MB = 2048
#: Longest input libFuzzer makes: three blocks plus the prefix and slack.
MAX_INPUT_BYTES = 4 * 1024


def fuzz_command(target: str, seconds: int, work: str, extra: list[str]) -> list[str]:
    """Return the libFuzzer command line of one target."""
    regressions = os.path.join(FUZZ_DIR, "regressions", target)
    os.makedirs(regressions, exist_ok=True)
    corpus = os.path.join(FUZZ_DIR, "corpus", target)
    return [sys.executable, os.path.join(FUZZ_DIR, f"{target}.py"),
            work, corpus, regressions,  # new inputs go to the first directory only
            f"-max_total_time={seconds}", f"-timeout={INPUT_TIMEOUT_SECONDS}",
            f"-rss_limit_mb={RSS_LIMIT_MB}", f"-max_len={MAX_INPUT_BYTES}",
            f"-artifact_prefix={regressions}{os.sep}", "-print_final_stats=1", *extra]


def stats(log: str) -> dict[str, str]:
    """Return libFuzzer's final stat:: lines as a dict."""
    return dict(re.findall(r"^stat::(\w+):\s*(\d+)", log, flags=re.M))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time per target")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset")
    parser.add_argument("--parallel", type=int, default=len(TARGETS), help="targets run at once")
    parser.add_argument("--work-dir", help="keep new corpus inputs here (default: a temp dir)")
    parser.add_argument("--grace", type=int, default=60, help="seconds past --seconds before a kill")
    parser.add_argument("extra", nargs="*", help="libFuzzer flags, after --")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; expected some of {TARGETS}")

    env = dict(os.environ)
    # The targets import ndindex; make a source checkout work without install.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(FUZZ_DIR), env.get("PYTHONPATH")]))
    tmp = tempfile.TemporaryDirectory(prefix="ndindex-fuzz-")
    base = args.work_dir or tmp.name
    pending, running, failed = list(targets), {}, []
    while pending or running:
        while pending and len(running) < max(1, args.parallel):
            target = pending.pop(0)
            work = os.path.join(base, target)
            os.makedirs(work, exist_ok=True)
            log = open(os.path.join(base, f"{target}.log"), "w+")
            cmd = fuzz_command(target, args.seconds, work, args.extra)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[target] = (proc, log, time.monotonic())
        time.sleep(0.2)
        for target, (proc, log, started) in list(running.items()):
            if proc.poll() is None:
                if time.monotonic() - started < args.seconds + args.grace:
                    continue
                proc.kill()
                proc.wait()
            del running[target]
            log.seek(0)
            text = log.read()
            log.close()
            st = stats(text)
            runs, rate = st.get("number_of_executed_units", "?"), st.get("average_exec_per_sec", "?")
            ok = proc.returncode == 0
            print(f"{target}: {'ok' if ok else f'FAILED (exit {proc.returncode})'}, "
                  f"{runs} runs, {rate} exec/s, {time.monotonic() - started:.0f} s", flush=True)
            if not ok:
                failed.append(target)
                print("\n".join(text.splitlines()[-40:]), file=sys.stderr)
                print(f"--- inputs: {os.path.join(FUZZ_DIR, 'regressions', target)}", file=sys.stderr)
    tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
