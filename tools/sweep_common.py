"""What the two sweep tools share: a model of the index, API options, forked children.

- ``IndexModel``: the brute-force oracle.  It applies add/remove to a plain
  dict the way FORMAT.md 7.6 specifies them ([F13]) and answers query() and
  keys() by comparing every stored fingerprint, so a sweep can tell a right
  answer from a wrong one without trusting the index.
- ``api_options``: keyword arguments for ``Index.create`` / ``ndindex.open``
  given on the command line, plus switches that make later format versions
  deterministic (background compaction off) when the installed library
  accepts them; the sweeps use only the public API otherwise.
- ``Child``: a function run in a forked child, streaming framed messages to
  the parent through a pipe, so the parent sees how far it got, can kill it
  at a chosen moment, and tells a signal from an exception from a hang.
  The parent forks only while it holds no open index (LMDB forbids using
  an environment across fork).
"""

from __future__ import annotations

import ast
import faulthandler
import inspect
import os
import pickle
import select
import signal
import struct
import time
import traceback

import numpy as np

#: Switches that later format versions may accept; off for determinism.
DETERMINISM_OFF = ("background_compaction", "auto_compact", "background")


def parse_options(items: list[str]) -> dict:
    """Parse NAME=VALUE strings (VALUE a Python literal, else a string) into a dict."""
    out = {}
    for item in items or ():
        name, _, value = item.partition("=")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value
    return out


def api_options(func, given: dict) -> dict:
    """The keyword arguments to pass to func: those given that it accepts, and DETERMINISM_OFF."""
    params = inspect.signature(func).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    out = {name: False for name in DETERMINISM_OFF if name in params}
    out.update({k: v for k, v in given.items() if takes_any or k in params})
    return out


def popcount64(x: np.ndarray) -> np.ndarray:
    """Bits set in each uint64."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    return np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)


def key_order(key):
    """The order ndindex returns a fingerprint's keys in: bytes before str, then by value."""
    return (isinstance(key, str), key)


class IndexModel:
    """The live fingerprints and their document keys, as the index should hold them."""

    def __init__(self):
        self.keys = {}

    @property
    def keys(self) -> dict:
        """Every live fingerprint -> its keys (maybe none)."""
        return self._keys

    @keys.setter
    def keys(self, value: dict) -> None:
        self._keys, self._sorted = value, None

    def copy(self) -> "IndexModel":
        other = IndexModel()
        other.keys = {fp: set(ks) for fp, ks in self.keys.items()}
        return other

    def add(self, fps, keys=None) -> None:
        self._sorted = None
        for i, fp in enumerate(int(v) for v in fps):
            self.keys.setdefault(fp, set())
            if keys is not None and keys[i] is not None:
                self.keys[fp].add(keys[i])

    def remove(self, fingerprints=None, keys=None) -> None:
        """Remove fingerprints with all their keys; or keys, and fingerprints left without one."""
        self._sorted = None
        for fp in fingerprints if fingerprints is not None else ():
            self.keys.pop(int(fp), None)
        doomed = set(keys or ())
        if doomed:
            for fp in [fp for fp, ks in self.keys.items() if ks & doomed]:
                self.keys[fp] -= doomed
                if not self.keys[fp]:
                    del self.keys[fp]

    def fingerprints(self) -> np.ndarray:
        """Sorted (the caller's own copy)."""
        return self._sorted_fps().copy()

    def _sorted_fps(self) -> np.ndarray:
        # Kept until the next change: query() asks per query, and sorting
        # anew made a sweep of 2,000-entry logs crawl.
        if self._sorted is None:
            self._sorted = np.array(sorted(self._keys), dtype=np.uint64)
        return self._sorted

    def state(self) -> dict:
        """A comparable snapshot: fingerprint -> sorted key tuple."""
        return {fp: tuple(sorted(ks, key=key_order)) for fp, ks in self.keys.items()}

    def query(self, q: int, k: int) -> list[tuple]:
        """query(q, k, keys=True) as (fingerprint, distance, keys) tuples, nearest first."""
        fps = self._sorted_fps()
        if not len(fps):
            return []
        dist = popcount64(fps ^ np.uint64(q))
        hits = sorted((int(d), int(f)) for f, d in zip(fps[dist <= k], dist[dist <= k]))
        return [(f, d, tuple(sorted(self.keys[f], key=key_order))) for d, f in hits]

    def keys_of(self, fp: int) -> tuple:
        return tuple(sorted(self.keys.get(int(fp), ()), key=key_order))


def state_of(ix, fps) -> dict:
    """What the index holds of these fingerprints: fingerprint -> its keys, for those present.

    Uses query(fp, 0, keys=True) only, so it needs nothing beyond the
    public API the sweeps may rely on (no enumeration of the index).
    """
    out = {}
    for fp in sorted({int(v) for v in fps}):
        for m in ix.query(fp, 0, keys=True):
            out[int(m.fingerprint)] = tuple(m.keys)
    return out


def accepted(func, **kwargs) -> dict:
    """The keyword arguments func accepts, of those given."""
    params = inspect.signature(func).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def as_answer(matches) -> list[tuple]:
    """Index.query results in the model's form."""
    return [(int(m.fingerprint), int(m.distance), tuple(m.keys)) for m in matches]


# -- forked children ----------------------------------------------------------------

_HEAD = struct.Struct("<cI")


class Child:
    """Run body(send) in a forked child; send(kind, obj) streams framed messages to the parent.

    body's return value arrives as a final message of kind "result"; an
    exception escaping body arrives as kind "escaped" with its traceback.
    The child leaves with os._exit, so nothing the parent buffered is
    flushed twice; with quiet, its stdout and stderr go to /dev/null.
    """

    def __init__(self, body, quiet: bool = True):
        r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child
            os.close(r)
            if quiet:  # LMDB's assertion messages would flood the sweep's output
                faulthandler.disable()  # it writes to its own copy of stderr
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
            code = 0
            try:
                def send(kind: str, obj=None) -> None:
                    payload = pickle.dumps((kind, obj))
                    _write_all(w, _HEAD.pack(b"M", len(payload)) + payload)

                send("result", body(send))
            except BaseException:  # report everything, even SystemExit, then leave
                try:
                    send("escaped", traceback.format_exc())
                except BaseException:
                    code = 3
            os._exit(code)
        os.close(w)
        self._fd = r
        self._buf = b""
        self.status = None  # os.waitstatus after wait()

    def messages(self, deadline: float):
        """Yield (kind, obj) as they arrive, until the pipe closes or the deadline passes.

        Sets self.timed_out when the deadline ends it.
        """
        self.timed_out = False
        while True:
            while len(self._buf) >= _HEAD.size:
                _, n = _HEAD.unpack_from(self._buf)
                if len(self._buf) < _HEAD.size + n:
                    break
                payload = self._buf[_HEAD.size:_HEAD.size + n]
                self._buf = self._buf[_HEAD.size + n:]
                yield pickle.loads(payload)
            left = deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                return
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                return
            self._buf += chunk

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        """Reap the child; return its wait status."""
        if self.status is None:
            _, self.status = os.waitpid(self.pid, 0)
            os.close(self._fd)
        return self.status

    def signal(self) -> int | None:
        """The signal that ended the child, or None if it exited."""
        status = self.wait()
        return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def run_child(body, timeout: float) -> dict:
    """Run body in a forked child to the end: its messages, result, signal, or hang."""
    child = Child(body)
    msgs = list(child.messages(time.monotonic() + timeout))
    hung = child.timed_out
    if hung:
        child.kill()
    sig = child.signal()
    result = next((obj for kind, obj in msgs if kind == "result"), None)
    escaped = next((obj for kind, obj in msgs if kind == "escaped"), None)
    return dict(messages=msgs, result=result, escaped=escaped, hung=hung,
                signal=None if hung else sig, exit_code=None if sig is not None or hung
                else os.WEXITSTATUS(child.status))


def remove_index_files(path: str) -> None:
    """Delete an index file, its LMDB lock file and its journals, if present."""
    import glob
    for p in [path, path + "-lock"] + glob.glob(glob.escape(path) + ".journal-*"):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def scratch_dir() -> str | None:
    """A RAM-backed directory for trial files when the system has one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
