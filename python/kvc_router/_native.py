"""ctypes binding to libkvcrouter.so.

The library is loaded lazily, once per process, under a lock, from
``$KVC_ROUTER_LIB`` when set or else from this package's directory. The loading
PID is recorded: a child created by ``fork()`` after the load must not call into
the parent's Go runtime (Go cannot survive fork), so every call from another
PID raises :class:`~kvc_router.errors.ForkError` instead of hanging.

``ctypes.CDLL`` releases the GIL around every foreign call; the library is
thread-safe, so concurrent Python threads really run concurrently inside it.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import struct
import sys
import threading
from array import array
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from ctypes import POINTER, byref, c_char_p, c_int32, c_int64, c_uint64, c_void_p
from typing import Any, Optional, Sequence, Tuple

from .errors import (
    KVR_HELD,
    KVR_INVALID_ARGUMENT,
    KVR_INVALID_STATE,
    KVR_NOT_FOUND,
    KVR_OK,
    ForkError,
    InvalidArgumentError,
    InvalidStateError,
    NativeConfigError,
    NativeError,
    error_for,
)

LIB_ENV = "KVC_ROUTER_LIB"
LIB_NAME = "libkvcrouter.so"
# KVR_ABI_VERSION (the major) and KVR_ABI_MINOR of cabi/kvcrouter.h
# (tests/test_errors.py checks them). A library of the same major and a minor
# at least ABI_MINOR is accepted.
ABI_VERSION = 1
ABI_MINOR = 5

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

METRICS_FLAVORS = {"vllm": 0, "sglang": 1}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_pid: Optional[int] = None


def library_path() -> str:
    """Where the library is loaded from (without loading it)."""
    env = os.environ.get(LIB_ENV)
    if env:
        if not os.path.isfile(env):
            raise NativeError(f"{LIB_ENV}={env!r} does not name a file")
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIB_NAME)
    if os.path.isfile(here):
        return here
    raise NativeError(
        f"{LIB_NAME} not found in {os.path.dirname(here)}; install the kvc-router wheel, "
        f"build it with `pip install .`, or set {LIB_ENV} to its path"
    )


def _fork_error() -> ForkError:
    return ForkError(
        f"libkvcrouter was loaded by process {_pid} before fork(); process {os.getpid()} "
        "cannot use it (Go does not survive fork). Create the balancer in the child "
        "process, or start children with the 'spawn' method."
    )


class AcquireOpts(ctypes.Structure):
    """kvr_acquire_opts (ABI 1.2); ``size`` must be ``ctypes.sizeof(AcquireOpts)``."""

    _fields_ = [
        ("size", c_uint64),
        ("request_id", c_char_p),
        ("request_id_len", c_int64),
        ("tokens", c_void_p),
        ("n_tokens", c_int64),
        ("pin", c_int64),
        ("lora", c_char_p),
        ("lora_len", c_int64),
        ("known_generation", c_int64),
        ("ticket", c_uint64),
        ("submit", c_int64),
    ]


_ERR = POINTER(c_void_p)
#: Every export's ctypes (argtypes, restype); tests/test_abi_header.py holds
#: them to cabi/kvcrouter.h.
SIGNATURES: dict = {
    "kvr_abi_version": ([], c_int32),
    "kvr_abi_minor": ([], c_int32),
    "kvr_version": ([_ERR, _ERR], c_int32),
    "kvr_config_schema": ([_ERR, _ERR], c_int32),
    "kvr_acquire_with": (
        [c_uint64, POINTER(AcquireOpts), POINTER(c_int32), POINTER(c_int64), _ERR, _ERR, _ERR],
        c_int32,
    ),
    "kvr_release_admit": ([c_uint64, c_char_p, c_int64, POINTER(c_int32), _ERR, _ERR], c_int32),
    "kvr_release_done": (
        [c_uint64, c_char_p, c_int64, c_char_p, c_int64, c_int64, POINTER(c_int32), _ERR, _ERR],
        c_int32,
    ),
    "kvr_pump": ([c_uint64, _ERR, _ERR], c_int32),
    "kvr_cancel": ([c_uint64, c_uint64, POINTER(c_int32), _ERR], c_int32),
}


def _declare(lib: ctypes.CDLL) -> None:
    err = _ERR
    sig = {
        **SIGNATURES,
        "kvr_free": ([c_void_p], None),
        "kvr_router_new": ([c_char_p, c_int64, POINTER(c_uint64), err], c_int32),
        "kvr_validate_config": ([c_char_p, c_int64, err, err], c_int32),
        "kvr_router_close": ([c_uint64, err], c_int32),
        "kvr_acquire": (
            [
                c_uint64,
                c_char_p,
                c_int64,
                c_void_p,
                c_int64,
                c_int64,
                c_char_p,
                c_int64,
                c_int64,
                POINTER(c_int32),
                POINTER(c_int64),
                err,
                err,
                err,
            ],
            c_int32,
        ),
        "kvr_release": ([c_uint64, c_char_p, c_int64, POINTER(c_int32), err], c_int32),
        "kvr_add_servers": ([c_uint64, c_char_p, c_int64, POINTER(c_int64), err], c_int32),
        "kvr_remove_servers": ([c_uint64, c_char_p, c_int64, POINTER(c_int64), err], c_int32),
        "kvr_servers": ([c_uint64, err, POINTER(c_int64), err], c_int32),
        "kvr_inflight": ([c_uint64, c_char_p, c_int64, POINTER(c_int64), err], c_int32),
        "kvr_total_inflight": ([c_uint64, POINTER(c_int64), err], c_int32),
        "kvr_update_metrics": ([c_uint64, c_char_p, c_int64, c_char_p, c_int64, c_int32, err], c_int32),
        "kvr_update_events": ([c_uint64, c_char_p, c_int64, c_char_p, c_int64, err], c_int32),
        "kvr_set_kv_endpoints": ([c_uint64, c_char_p, c_int64, c_char_p, c_int64, err], c_int32),
        "kvr_status": ([c_uint64, err, err], c_int32),
        "kvr_clear_sticky": ([c_uint64, err, err], c_int32),
        "kvr_reset_cache": ([c_uint64, err], c_int32),
        "kvr_set_log_fd": ([c_int32, err], c_int32),
    }
    SIGNATURES.update(sig)
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    # Only the test build of the library (make testlib) exports it.
    if hasattr(lib, "kvr_debug_panic"):
        lib.kvr_debug_panic.argtypes = [c_uint64, c_int32, err]
        lib.kvr_debug_panic.restype = c_int32


def load() -> ctypes.CDLL:
    """Returns the loaded library, loading it on first use (thread-safe)."""
    lib = _lib
    if lib is not None:
        if _pid != os.getpid():
            raise _fork_error()
        return lib
    return _load_locked()


def _load_locked() -> ctypes.CDLL:
    global _lib, _lib_path, _pid
    with _lock:
        if _lib is not None:
            if _pid != os.getpid():
                raise _fork_error()
            return _lib
        path = library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise NativeError(f"cannot load {path}: {e}") from e
        major = lib.kvr_abi_version() if hasattr(lib, "kvr_abi_version") else None
        minor = lib.kvr_abi_minor() if hasattr(lib, "kvr_abi_minor") else 0
        if major != ABI_VERSION or minor < ABI_MINOR:
            raise NativeError(
                f"{path} has ABI version {major}.{minor}; this package needs {ABI_VERSION}.{ABI_MINOR} or a later "
                f"{ABI_VERSION}.x (from a checkout: make python/kvc_router/{LIB_NAME})"
            )
        try:
            _declare(lib)
        except AttributeError as e:
            raise NativeError(f"{path} is not a compatible libkvcrouter: {e}") from e
        _lib, _lib_path, _pid = lib, path, os.getpid()
        # The collectors' log into Python's logging (KVC_ROUTER_LOG=stderr: not).
        from . import _logs

        _logs.route(lib)
        return lib


def loaded_path() -> Optional[str]:
    return _lib_path


def take_string(lib: ctypes.CDLL, p: c_void_p) -> Optional[str]:
    """Copies and frees a library-allocated string."""
    if not p.value:
        return None
    try:
        return ctypes.string_at(p.value).decode("utf-8", "replace")
    finally:
        lib.kvr_free(p.value)


def _check(lib: ctypes.CDLL, code: int, err: c_void_p) -> None:
    if code == KVR_OK:
        return
    msg = take_string(lib, err) or ""
    raise error_for(code, msg)


#: router.MaxServerIDBytes: the longest server id (UTF-8 bytes).
MAX_ID_BYTES = 64 << 10


def _utf8(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(
            f"{what} is not valid Unicode (not encodable as UTF-8): lone surrogate "
            f"{value[e.start]!r} at index {e.start}",
            KVR_INVALID_ARGUMENT,
        ) from None


def check_server_id(sid: Any) -> bytes:
    """UTF-8 bytes of a server id, after the library's rules (router.CheckServerID):
    a non-empty str, valid Unicode (no lone surrogates), no NUL, at most
    64 KiB as UTF-8. Raises TypeError or InvalidArgumentError (a ValueError)
    naming what is wrong."""
    if not isinstance(sid, str):
        raise TypeError(f"server ids must be str, got {type(sid).__name__} {sid!r:.80}")
    if not sid:
        raise InvalidArgumentError("server ids must be non-empty strings", KVR_INVALID_ARGUMENT)
    b = _utf8(sid, f"server id {sid!r:.80}")
    if len(b) > MAX_ID_BYTES:
        raise InvalidArgumentError(
            f"server id {sid!r:.40}... is {len(b)} bytes as UTF-8, more than the limit of {MAX_ID_BYTES}",
            KVR_INVALID_ARGUMENT,
        )
    if "\x00" in sid:
        raise InvalidArgumentError(
            f"server id {sid!r:.80} contains a NUL character at index {sid.index(chr(0))}", KVR_INVALID_ARGUMENT
        )
    return b


def lookup_id(sid: Any) -> Optional[bytes]:
    """Bytes to look a server up by (release, in-flight count): a str that
    cannot be encoded keeps its lone surrogates (``surrogatepass``), so the
    library sees an id no server can have and counts the no-op; None for
    non-str values."""
    if not isinstance(sid, str):
        return None
    return sid.encode("utf-8", "surrogatepass")


def pack_tokens(prompt_ids: Any, limit: Optional[int] = None) -> Tuple[Any, Any, int]:
    """Packs token ids as int32 without copying when the input already is.

    Returns ``(keepalive, address, count)``; ``address`` is an int or a bytes
    object (ctypes passes its buffer); keep ``keepalive`` referenced until the
    foreign call returns. Accepts list/tuple of ints, ``array('i')`` (and
    other integer arrays), 1-D numpy integer arrays, objects with
    ``.tolist()`` (e.g. torch tensors) and other iterables of ints.

    Rejected with ``TypeError``: ``str``, byte buffers (``bytes``,
    ``bytearray``, ``memoryview``), mappings, unordered collections (``set``,
    ``frozenset``, dict views) and ``bool`` token ids. For lists and tuples
    only the first and last elements are checked for ``bool`` (checking all
    would cost more than packing; ``bool`` is an ``int`` subclass, so a
    ``True`` inside packs as 1). ``limit`` (max_prompt_tokens) is checked
    before anything is packed: a longer prompt raises
    :class:`~kvc_router.errors.InvalidArgumentError`.
    """
    if prompt_ids is None:
        return None, None, 0
    if isinstance(prompt_ids, array):
        _check_length(len(prompt_ids), limit)
        if prompt_ids.typecode == "i" and prompt_ids.itemsize == 4:
            arr = prompt_ids
        elif prompt_ids.typecode in "bBhHiIlLqQ":
            arr = _int32_array(prompt_ids.tolist())
        else:
            raise TypeError(f"prompt_ids: array of typecode {prompt_ids.typecode!r} is not an integer array")
    elif isinstance(prompt_ids, (list, tuple)):
        n = len(prompt_ids)
        if n == 0:
            return None, None, 0
        _check_length(n, limit)
        if type(prompt_ids[0]) is bool or type(prompt_ids[-1]) is bool:
            raise TypeError("prompt_ids must contain only int token ids, found bool")
        try:  # struct is about twice as fast as array('i', ...) for lists
            packed = _pack_struct(n, prompt_ids)
        except struct.error:
            _int32_array(prompt_ids)  # raises the precise ValueError / TypeError
            raise
        return packed, packed, n
    elif _is_numpy(prompt_ids):
        return _pack_numpy(prompt_ids, limit)
    elif isinstance(prompt_ids, (str, bytes, bytearray, memoryview)):
        raise TypeError(
            f"prompt_ids must be a sequence of int token ids, got {type(prompt_ids).__name__} "
            "(pass a list, tuple, array('i') or a 1-D integer numpy array)"
        )
    elif isinstance(prompt_ids, (Mapping, AbstractSet)):
        raise TypeError(f"prompt_ids must be an ordered sequence of int token ids, got {type(prompt_ids).__name__}")
    elif hasattr(prompt_ids, "tolist"):
        return pack_tokens(_flat_list(prompt_ids.tolist()), limit)
    else:
        try:
            values = list(prompt_ids)
        except TypeError:
            raise TypeError(
                f"prompt_ids must be a sequence of int token ids, got {type(prompt_ids).__name__}"
            ) from None
        _check_length(len(values), limit)
        arr = _int32_array(values)
    n = len(arr)
    if n == 0:
        return None, None, 0
    return arr, arr.buffer_info()[0], n


def _check_length(n: int, limit: Optional[int]) -> None:
    if limit is not None and n > limit:
        raise InvalidArgumentError(
            f"prompt has {n} tokens, more than max_prompt_tokens ({limit})", KVR_INVALID_ARGUMENT
        )


def _pack_struct(n: int, values: Sequence[Any]) -> bytes:
    return _int32_struct(n).pack(*values)


@functools.lru_cache(maxsize=1024)
def _int32_struct(n: int) -> struct.Struct:
    # A compiled Struct per prompt length: struct.pack(fmt, ...) re-derives
    # the format each call, about 10 us of the ~60 us an 8k-token list costs.
    return struct.Struct(f"={n}i")


def _flat_list(v: Any) -> Any:
    if isinstance(v, list) and v and isinstance(v[0], list):
        if len(v) == 1:
            return v[0]
        raise ValueError("prompt_ids must be one-dimensional")
    return v


def _int32_array(values: Sequence[Any]) -> array:
    bad = next((v for v in values if type(v) is bool), None)
    if bad is not None:
        raise TypeError(f"prompt_ids must contain only int token ids, found bool {bad!r}")
    try:
        return array("i", values)
    except OverflowError:
        big = next((v for v in values if isinstance(v, int) and not INT32_MIN <= v <= INT32_MAX), None)
        raise ValueError(f"prompt_ids: token id {big} is outside the int32 range [{INT32_MIN}, {INT32_MAX}]") from None
    except TypeError:
        bad = next((v for v in values if not isinstance(v, int)), None)
        raise TypeError(f"prompt_ids must contain only int token ids, found {type(bad).__name__} {bad!r}") from None


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy" and hasattr(x, "__array_interface__") and "numpy" in sys.modules


def _pack_numpy(a: Any, limit: Optional[int] = None) -> Tuple[Any, Optional[int], int]:
    np = sys.modules["numpy"]
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise ValueError(f"prompt_ids must be one-dimensional, got shape {a.shape}")
    _check_length(int(a.size), limit)
    if a.dtype.kind not in "iu":
        raise TypeError(f"prompt_ids must be an integer array, got dtype {a.dtype}")
    if a.size == 0:
        return None, None, 0
    if a.dtype != np.int32:
        lo, hi = int(a.min()), int(a.max())
        if lo < INT32_MIN or hi > INT32_MAX:
            bad = lo if lo < INT32_MIN else hi
            raise ValueError(f"prompt_ids: token id {bad} is outside the int32 range [{INT32_MIN}, {INT32_MAX}]")
        a = a.astype(np.int32)
    a = np.ascontiguousarray(a)
    return a, a.ctypes.data, int(a.size)


def validate_config(config: dict) -> dict:
    """The library's check of a kvr_router_new document; returns the effective
    configuration (every default filled in). A rejected configuration raises
    :class:`~kvc_router.errors.NativeConfigError` whose message starts with
    the native key path (``router.strategies[0].params.alpha: ...``)."""
    lib = load()
    try:
        data = json.dumps(config, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:
        raise NativeConfigError(f"the configuration cannot be encoded as JSON: {e}") from None
    out, err = c_void_p(), c_void_p()
    code = lib.kvr_validate_config(data, len(data), byref(out), byref(err))
    doc = json.loads(take_string(lib, out) or "{}")
    if code != KVR_OK:
        exc = error_for(code, take_string(lib, err) or "")
        if isinstance(exc, NativeConfigError):
            # The library's key path and reason, structured (ABI 1.1).
            exc.key, exc.reason = doc.get("key"), doc.get("reason")
        raise exc
    return doc


def _json_call(name: str) -> dict:
    lib = load()
    out, err = c_void_p(), c_void_p()
    _check(lib, getattr(lib, name)(byref(out), byref(err)), err)
    return json.loads(take_string(lib, out) or "{}")


def library_version() -> dict:
    """The loaded library's build: ``{"version", "abi_version", "abi_minor",
    "go_version"}``."""
    return _json_call("kvr_version")


@functools.lru_cache(maxsize=1)
def config_schema() -> dict:
    """What a configuration may name (kvr_config_schema): router modes,
    strategies with their default parameters, the ``_target_`` allow-list,
    collector names, log levels."""
    return _json_call("kvr_config_schema")


class Router:
    """One native router handle. Thread-safe; not usable across fork()."""

    def __init__(self, config: dict) -> None:
        self._lib = load()
        self._pid = os.getpid()
        data = json.dumps(config).encode("utf-8")
        h = c_uint64(0)
        err = c_void_p()
        _check(self._lib, self._lib.kvr_router_new(data, len(data), byref(h), byref(err)), err)
        self.handle = h.value
        self.closed = False

    # -- plumbing ---------------------------------------------------------

    def _h(self) -> int:
        if self._pid != os.getpid():
            raise _fork_error()
        if self.closed:
            raise InvalidStateError("the router is closed", KVR_INVALID_STATE)
        return self.handle

    def close(self) -> None:
        if self.closed:
            return
        h = self._h()
        self.closed = True
        err = c_void_p()
        _check(self._lib, self._lib.kvr_router_close(h, byref(err)), err)

    def close_in_owner(self) -> None:
        """Closes unless this is a forked child (used by finalizers)."""
        if not self.closed and self._pid == os.getpid():
            try:
                self.close()
            except NativeError:
                pass

    def _json_out(self, fn: Any, *args: Any) -> Any:
        out, err = c_void_p(), c_void_p()
        _check(self._lib, fn(self._h(), *args, byref(out), byref(err)), err)
        text = take_string(self._lib, out)
        return None if text is None else json.loads(text)

    # -- hot path ----------------------------------------------------------

    def acquire(
        self, request_id: bytes, addr: Optional[int], n: int, pin: int, known_gen: int, lora: bytes = b""
    ) -> Tuple[int, int, Optional[str]]:
        """Routes a request; returns (pool index, pool generation, server id).

        The server id is only returned (non-None) when the generation differs
        from ``known_gen``; otherwise the caller's mirror of the pool names it.
        """
        sid = c_void_p()
        idx, gen = self._acquire(request_id, addr, n, pin, lora, known_gen, byref(sid), None)
        return idx, gen, (take_string(self._lib, sid) if sid.value else None)

    def acquire_detail(self, request_id: bytes, addr: Optional[int], n: int, pin: int = -1, lora: bytes = b"") -> dict:
        """Routes a request; returns the decision (server, reason, score, hits...)."""
        out = c_void_p()
        idx, gen = self._acquire(request_id, addr, n, pin, lora, -1, None, byref(out))
        d = json.loads(take_string(self._lib, out) or "{}")
        d["index"], d["generation"] = idx, gen
        return d

    def _acquire(
        self, request_id: bytes, addr: Optional[int], n: int, pin: int, lora: bytes, known_gen: int, sid: Any, out: Any
    ) -> Tuple[int, int]:
        idx, gen, err = c_int32(-1), c_int64(0), c_void_p()
        code = self._lib.kvr_acquire(
            self._h(),
            request_id,
            len(request_id),
            addr,
            n,
            pin,
            lora,
            len(lora),
            known_gen,
            byref(idx),
            byref(gen),
            sid,
            out,
            byref(err),
        )
        if code:
            _check(self._lib, code, err)
        return idx.value, gen.value

    # -- admission (ABI 1.2) -------------------------------------------------

    def submit(
        self,
        request_id: bytes,
        addr: Optional[int],
        n: int,
        pin: int,
        known_gen: int,
        ticket: int,
        lora: bytes = b"",
        detail: bool = False,
    ) -> Optional[Tuple[Any, ...]]:
        """:meth:`acquire` through router-side admission: ``None`` when the
        request is held under ``ticket`` (a later :meth:`release_admit` or
        :meth:`pump` lists it once admitted). A full queue raises
        :class:`~kvc_router.errors.AdmissionQueueFullError`."""
        buf = c_char_p(addr) if isinstance(addr, bytes) else None  # borrows the bytes' buffer, no copy
        opts = AcquireOpts(
            size=ctypes.sizeof(AcquireOpts), request_id=request_id, request_id_len=len(request_id),
            tokens=addr if buf is None else ctypes.cast(buf, c_void_p),
            n_tokens=n, pin=pin, lora=lora, lora_len=len(lora), known_generation=known_gen, ticket=ticket, submit=1,
        )  # fmt: skip
        idx, gen, sid, err, dec = c_int32(-1), c_int64(0), c_void_p(), c_void_p(), c_void_p()
        code = self._lib.kvr_acquire_with(
            self._h(), byref(opts), byref(idx), byref(gen), byref(sid), byref(dec) if detail else None, byref(err)
        )
        del buf
        if code == KVR_HELD:
            return None
        if code:
            _check(self._lib, code, err)
        got = idx.value, gen.value, (take_string(self._lib, sid) if sid.value else None)
        if not detail:
            return got
        d = json.loads(take_string(self._lib, dec) or "{}") if dec.value else {}
        d["index"], d["generation"] = got[0], got[1]
        return (*got, d)

    def release_admit(self, server_id: bytes) -> Tuple[bool, list]:
        """:meth:`release` that admits held requests into the freed room:
        ``(released, [{"ticket", "index", "generation", "server"}])``."""
        released, out, err = c_int32(0), c_void_p(), c_void_p()
        code = self._lib.kvr_release_admit(
            self._h(), server_id, len(server_id), byref(released), byref(out), byref(err)
        )
        if code:
            _check(self._lib, code, err)
        return bool(released.value), (json.loads(take_string(self._lib, out) or "[]") if out.value else [])

    def release_done(self, server_id: bytes, request_id: bytes, output_tokens: int) -> Tuple[bool, list]:
        """:meth:`release_admit` naming the finished request and the tokens it
        generated (0 = unknown), which the length learner learns from."""
        released, out, err = c_int32(0), c_void_p(), c_void_p()
        code = self._lib.kvr_release_done(
            self._h(),
            server_id,
            len(server_id),
            request_id,
            len(request_id),
            output_tokens,
            byref(released),
            byref(out),
            byref(err),
        )
        if code:
            _check(self._lib, code, err)
        return bool(released.value), (json.loads(take_string(self._lib, out) or "[]") if out.value else [])

    def pump(self) -> list:
        """Held requests admitted into room that appeared without a release."""
        out, err = c_void_p(), c_void_p()
        _check(self._lib, self._lib.kvr_pump(self._h(), byref(out), byref(err)), err)
        return json.loads(take_string(self._lib, out) or "[]") if out.value else []

    def cancel(self, ticket: int) -> bool:
        """Drops a held request; False when it is not held (admitted already)."""
        cancelled, err = c_int32(0), c_void_p()
        _check(self._lib, self._lib.kvr_cancel(self._h(), ticket, byref(cancelled), byref(err)), err)
        return bool(cancelled.value)

    def release(self, server_id: bytes) -> bool:
        released, err = c_int32(0), c_void_p()
        code = self._lib.kvr_release(self._h(), server_id, len(server_id), byref(released), byref(err))
        if code:
            _check(self._lib, code, err)
        return bool(released.value)

    # -- control plane -----------------------------------------------------

    def add_servers(self, ids: Sequence[str]) -> int:
        # Raw UTF-8 (ids passed check_server_id): no \u escapes to reinterpret.
        data = json.dumps(list(ids), ensure_ascii=False).encode("utf-8")
        gen, err = c_int64(0), c_void_p()
        _check(self._lib, self._lib.kvr_add_servers(self._h(), data, len(data), byref(gen), byref(err)), err)
        return gen.value

    def remove_servers(self, ids: Sequence[str]) -> int:
        data = json.dumps(list(ids), ensure_ascii=False).encode("utf-8")
        gen, err = c_int64(0), c_void_p()
        _check(self._lib, self._lib.kvr_remove_servers(self._h(), data, len(data), byref(gen), byref(err)), err)
        return gen.value

    def servers(self) -> Tuple[list, int]:
        out, gen, err = c_void_p(), c_int64(0), c_void_p()
        _check(self._lib, self._lib.kvr_servers(self._h(), byref(out), byref(gen), byref(err)), err)
        return json.loads(take_string(self._lib, out) or "[]"), gen.value

    def inflight(self, server_id: bytes) -> int:
        out, err = c_int64(0), c_void_p()
        _check(self._lib, self._lib.kvr_inflight(self._h(), server_id, len(server_id), byref(out), byref(err)), err)
        return out.value

    def total_inflight(self) -> int:
        out, err = c_int64(0), c_void_p()
        _check(self._lib, self._lib.kvr_total_inflight(self._h(), byref(out), byref(err)), err)
        return out.value

    def update_metrics(self, server_id: bytes, text: bytes, flavor: int) -> bool:
        err = c_void_p()
        code = self._lib.kvr_update_metrics(self._h(), server_id, len(server_id), text, len(text), flavor, byref(err))
        if code == KVR_NOT_FOUND:
            take_string(self._lib, err)
            return False
        _check(self._lib, code, err)
        return True

    def update_events(self, server_id: bytes, payload: bytes) -> bool:
        err = c_void_p()
        code = self._lib.kvr_update_events(self._h(), server_id, len(server_id), payload, len(payload), byref(err))
        if code == KVR_NOT_FOUND:
            take_string(self._lib, err)
            return False
        _check(self._lib, code, err)
        return True

    def set_kv_endpoints(self, server_id: bytes, endpoints: list) -> None:
        data = json.dumps(endpoints).encode("utf-8")
        err = c_void_p()
        _check(
            self._lib,
            self._lib.kvr_set_kv_endpoints(self._h(), server_id, len(server_id), data, len(data), byref(err)),
            err,
        )

    def status(self) -> dict:
        return self._json_out(self._lib.kvr_status)

    def clear_sticky(self) -> dict:
        return self._json_out(self._lib.kvr_clear_sticky)

    def reset_cache(self) -> None:
        err = c_void_p()
        _check(self._lib, self._lib.kvr_reset_cache(self._h(), byref(err)), err)


def debug_panic(kind: int, handle: int = 0) -> None:
    """Test hook: panics inside Go. Only the test build of the library
    (``make testlib``, loaded through ``$KVC_ROUTER_LIB``) has it."""
    lib = load()
    if not hasattr(lib, "kvr_debug_panic"):
        raise InvalidStateError(
            f"{_lib_path} is a release build: kvr_debug_panic exists only in `make testlib`", KVR_INVALID_STATE
        )
    err = c_void_p()
    _check(lib, lib.kvr_debug_panic(handle, kind, byref(err)), err)
