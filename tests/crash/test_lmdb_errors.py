"""No lmdb.Error escapes: every LMDB failure reaches callers as a typed ndindex error.

py-lmdb's types cannot be patched, so ``lmdb.open`` is: it returns the real
environment wrapped in a proxy whose methods (and those of the
transactions it begins) raise a chosen ``lmdb.Error`` subclass at a chosen
call site.  Every py-lmdb call the library makes goes through an
environment that lmdb.open returned, so each call site is covered: the
environment's open_db, begin, sync, set_mapsize, copy and close, and the
transactions' put, get, delete, commit, abort and id.

For each call site and error, every public method of Index, the module's
functions and CLI commands run with the fault armed; each must succeed or
raise a subclass of NdindexError (CorruptionError naming a database where
the error says the file is damaged), and afterwards the index must hold
exactly what it held before the call or what the call meant to change:
nothing lost.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile

import lmdb
import numpy as np
import pytest

import ndindex
from ndindex import cli, recover, store as st, upgrade
from ndindex.errors import CapacityError, CorruptionError, NdindexError, ReadOnlyError
from ndindex.index import Index

from damage import Model, contents

#: Every call site of py-lmdb in the library: (object, method).
CALL_SITES = [("lmdb", "open"), ("Environment", "open_db"), ("Environment", "begin"),
              ("Environment", "sync"), ("Environment", "set_mapsize"), ("Environment", "copy"),
              ("Environment", "close"), ("Transaction", "put"), ("Transaction", "get"),
              ("Transaction", "delete"), ("Transaction", "commit"), ("Transaction", "abort"),
              ("Transaction", "id")]
ALL_ERRORS = sorted((c for c in vars(lmdb).values()
                     if isinstance(c, type) and issubclass(c, lmdb.Error)), key=lambda c: c.__name__)
#: Errors tried at every call site in the quick run: the base class, one
#: that says the file is damaged, one that says it is full, one that says
#: it cannot be written.
QUICK_ERRORS = [lmdb.Error, lmdb.CorruptedError, lmdb.MapFullError, lmdb.ReadonlyError]
#: Calls that fail after doing their work (a close or abort that reports an
#: error has still let go of what it held; failing before would leave an
#: environment open that the test could never close).
AFTER_THE_FACT = ("close", "abort")


class Fault:
    """Which call site raises which error, and how often it did.

    set_mapsize is called only after begin() reports that another process
    grew the map (MapResizedError): arming it makes the next begin() say so.
    """

    def __init__(self):
        self.site = None
        self.error = None
        self.fired = 0
        self._resized = False

    def arm(self, site, error) -> None:
        self.site, self.error = site, error
        self._resized = site == ("Environment", "set_mapsize")

    def disarm(self) -> None:
        self.site = None
        self._resized = False

    def check(self, site) -> None:
        if self._resized and site == ("Environment", "begin"):
            self._resized = False
            raise lmdb.MapResizedError("mdb_txn_begin: injected MapResizedError")
        if site == self.site:
            self.fired += 1
            raise self.error(f"{site[1]}: injected {self.error.__name__}")


class _Proxy:
    KIND = ""

    def __init__(self, real, fault: Fault):
        self._real = real
        self._fault = fault

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            args = [a._real if isinstance(a, _Proxy) else a for a in args]
            kwargs = {k: v._real if isinstance(v, _Proxy) else v for k, v in kwargs.items()}
            if name in AFTER_THE_FACT:
                result = attr(*args, **kwargs)
                self._fault.check((self.KIND, name))
                return result
            self._fault.check((self.KIND, name))
            return self._wrap(name, attr(*args, **kwargs))
        return call

    def _wrap(self, name, result):
        return result


class TxnProxy(_Proxy):
    KIND = "Transaction"

    def __enter__(self):
        self._real.__enter__()
        return self

    def __exit__(self, *exc):
        return self._real.__exit__(*exc)


class EnvProxy(_Proxy):
    KIND = "Environment"

    def _wrap(self, name, result):
        return TxnProxy(result, self._fault) if name == "begin" else result


@pytest.fixture
def fault(monkeypatch):
    f = Fault()
    real_open = lmdb.open

    def faulty_open(*args, **kwargs):
        f.check(("lmdb", "open"))
        return EnvProxy(real_open(*args, **kwargs), f)

    monkeypatch.setattr(lmdb, "open", faulty_open)
    return f


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A small index with runs, a tombstone, keys and a log; and its model."""
    path = str(tmp_path_factory.mktemp("lmdb-errors") / "base.ndx")
    rng = np.random.default_rng(3)
    fps = np.unique(rng.integers(0, 2**64, 400, dtype=np.uint64))[:300]
    model = Model()
    with Index.create(path, k=3, expected_n=1000, background_compaction=False) as ix:
        for sel, keys in ((fps[:200], [f"k{i}" for i in range(200)]), (fps[200:250], None)):
            ix.add(sel, keys=keys)
            model.add(sel, keys)
        ix.compact()
        ix.remove(fps[:5])
        model.remove(fps[:5])
        ix.compact()
        ix.add(fps[250:], keys=[f"l{i}" for i in range(50)])
        model.add(fps[250:], [f"l{i}" for i in range(50)])
    return path, model, fps


# -- the calls --------------------------------------------------------------------


def index_calls(fps, tmp):
    """Reads [(name, call(ix))] and writes [(name, plan(model) -> (call(ix), change(model)))]."""
    fp = int(fps[10])
    new = iter(range(1, 1 << 20))

    def add_one(model):
        x = next(new)
        return (lambda ix: ix.add([x], keys=[f"new-{x}"])), (lambda m: m.add([x], [f"new-{x}"]))

    def remove_fp(model):
        victim = min(model.keys)
        return (lambda ix: ix.remove([victim])), (lambda m: m.remove([victim]))

    def remove_key(model):
        key = min(k for ks in model.keys.values() for k in ks)
        return (lambda ix: ix.remove(keys=[key])), (lambda m: m.remove(keys=[key]))

    def check_and_add(model):
        x = (next(new) << 40) | 0xABCDE
        return (lambda ix: ix.check_and_add(x, key=f"c-{x}")), (lambda m: m.add([x], [f"c-{x}"]))

    def transaction(model):
        x, y = next(new), next(new)

        def call(ix):
            with ix.transaction():
                ix.add([x])
                ix.add([y], keys=["t"])
        return call, (lambda m: (m.add([x]), m.add([y], ["t"])))

    def unchanged(call):
        return lambda model: (call, None)

    reads = [("query", lambda ix: ix.query(fp, 3)), ("query_many", lambda ix: ix.query_many(fps, 2)),
             ("keys", lambda ix: ix.keys(fp)), ("contains", lambda ix: fp in ix),
             ("len", len), ("stats", lambda ix: ix.stats()), ("verify", lambda ix: ix.verify()),
             ("fingerprints", lambda ix: ix.fingerprints()), ("items", lambda ix: list(ix.items())),
             ("iter_chunks", lambda ix: list(ix.iter_chunks())),
             ("fingerprinter", lambda ix: ix.fingerprinter)]
    writes = [("add", add_one), ("remove", remove_fp), ("remove_keys", remove_key),
              ("check_and_add", check_and_add), ("transaction", transaction),
              ("sync", unchanged(lambda ix: ix.sync())),
              ("compact", unchanged(lambda ix: ix.compact())),
              ("compact_full", unchanged(lambda ix: ix.compact(full=True))),
              ("vacuum_into", unchanged(lambda ix: ix.vacuum_into(
                  os.path.join(tmp, f"copy-{next(new)}.ndx"))))]
    return reads, writes


def typed(exc: BaseException, error) -> str | None:
    """Why exc is not an acceptable answer to an injected error (None if it is)."""
    if not isinstance(exc, NdindexError):
        return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    if error in (lmdb.CorruptedError, lmdb.PageNotFoundError) and isinstance(exc, CorruptionError) \
            and exc.database is None:
        return f"CorruptionError without a database: {exc}"
    return None


def run_battery(path, model: Model, fps, fault: Fault, site, error, tmp,
                commands: bool = True) -> list[str]:
    """Run every call with the fault armed; return what leaked or was lost.

    commands: also recover(), create() and CLI commands.
    """
    problems = []
    reads, writes = index_calls(fps, tmp)

    def attempt(name, call):
        fault.arm(site, error)
        try:
            return call(), None
        except BaseException as exc:  # noqa: BLE001 - judged below
            why = typed(exc, error)
            if why:
                problems.append(f"{name}: {why}")
            return None, exc
        finally:
            fault.disarm()

    def reopen():
        return Index.open(path, background_compaction=False)

    ix, err = attempt("open", reopen)
    if ix is not None:
        ix.close()
    _, err = attempt("open readonly", lambda: ndindex.open(path, readonly=True).close())
    ix = reopen()
    try:
        for name, call in reads:
            attempt(name, lambda call=call: call(ix))
        for name, plan in writes:
            call, change = plan(model)
            before = model.state()
            if change is not None:
                change(model)
            _, err = attempt(name, lambda call=call: call(ix))
            if err is None:
                continue
            with contextlib.suppress(NdindexError):
                ix.close()
            # The call may have committed before the fault (a failed sync
            # after the commit): the state before or after it is whole;
            # anything else lost or invented data.
            got = contents(path)
            if got not in (before, model.state()):
                problems.append(f"{name}: after {type(err).__name__} the index holds other "
                                "data than before or after the call")
            model.keys = {fp: set(ks) for fp, ks in got.items()}
            ix = reopen()
        _, err = attempt("close", ix.close)
    finally:
        with contextlib.suppress(NdindexError):
            ix.close()
    if not commands:
        return problems
    out = os.path.join(tmp, "recovered.ndx")
    attempt("recover", lambda: recover.recover(path, out))
    with contextlib.suppress(OSError):
        os.unlink(out)
    attempt("create", lambda: Index.create(os.path.join(tmp, "fresh.ndx")).close())
    for argv in (["verify", path], ["stats", path], ["query", path, hex(int(fps[20]))],
                 ["compact", path]):
        fault.arm(site, error)
        try:
            status = cli.main(argv)
            if status not in (0, 1, 2):
                problems.append(f"cli {argv[0]}: exit status {status}")
        except BaseException as exc:  # noqa: BLE001
            problems.append(f"cli {argv[0]}: {type(exc).__name__}: {exc}")
        finally:
            fault.disarm()
    return problems


def battery(base, tmp_path, fault, site, error, commands=True):
    src, model0, fps = base
    path = str(tmp_path / "index.ndx")
    shutil.copyfile(src, path)
    model = Model()
    model.keys = {fp: set(ks) for fp, ks in model0.keys.items()}
    return run_battery(path, model, fps, fault, site, error, str(tmp_path), commands)


@pytest.mark.parametrize("site", CALL_SITES, ids=lambda s: f"{s[0]}.{s[1]}")
@pytest.mark.parametrize("error", QUICK_ERRORS, ids=lambda e: e.__name__)
def test_no_lmdb_error_escapes(base, tmp_path, fault, site, error):
    problems = battery(base, tmp_path, fault, site, error)
    assert not problems, "\n".join(problems)
    assert fault.fired, "the library never made this call"


def test_corruption_met_in_a_write_names_database_and_key(base, tmp_path, fault):
    src, _, _ = base
    path = str(tmp_path / "index.ndx")
    shutil.copyfile(src, path)
    with Index.open(path, background_compaction=False) as ix:
        fault.arm(("Transaction", "put"), lmdb.CorruptedError)
        with pytest.raises(CorruptionError) as exc:
            ix.add([12345])
        fault.disarm()
        assert exc.value.database == "log" and exc.value.key is not None
        assert 12345 not in ix


@pytest.mark.slow
@pytest.mark.parametrize("error", [e for e in ALL_ERRORS if e not in QUICK_ERRORS],
                         ids=lambda e: e.__name__)
def test_no_lmdb_error_of_any_kind_escapes(base, tmp_path, fault, error):
    problems = []
    # In RAM when the system has it: the battery syncs after every write.
    ram = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=ram or tmp_path) as tmp:
        for site in CALL_SITES:
            where = pathlib.Path(tmp) / site[1]
            where.mkdir()
            problems += [f"{site[0]}.{site[1]}: {p}"
                         for p in battery(base, where, fault, site, error, commands=False)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("error", ALL_ERRORS, ids=lambda e: e.__name__)
def test_translate_error_types_every_lmdb_error(error):
    exc = st.translate_error(error("mdb_txn_commit: injected"), "x.ndx")
    assert isinstance(exc, NdindexError)
    if error in (lmdb.MapFullError, lmdb.DiskError):
        assert isinstance(exc, CapacityError)
    if error is lmdb.ReadonlyError:
        assert isinstance(exc, ReadOnlyError)
    if error in (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError):
        assert isinstance(exc, CorruptionError) and exc.database == "lmdb"


@pytest.mark.parametrize("site", CALL_SITES, ids=lambda s: f"{s[0]}.{s[1]}")
def test_upgrade_raises_only_ndindex_errors(tmp_path, fault, site):
    v1 = os.path.join(os.path.dirname(__file__), "..", "data", "format-v1.ndx")
    for error in QUICK_ERRORS:
        path = tmp_path / f"{error.__name__}.ndx"
        shutil.copyfile(v1, path)
        out = tmp_path / f"{error.__name__}-v2.ndx"
        fault.arm(site, error)
        try:
            upgrade.upgrade(path, out)
        except NdindexError:
            assert not out.exists() or Index.open(out, readonly=True).close() is None
        finally:
            fault.disarm()
        assert pathlib.Path(path).read_bytes() == pathlib.Path(v1).read_bytes()  # the original is untouched
