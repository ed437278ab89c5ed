"""Every bad-input path from Python: prompts, ids, pushes, closed handles,
fork, and a Go panic recovered in a subprocess."""

from __future__ import annotations

import array
import ctypes
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from kvc_harness import debuglib
from kvc_harness.wire import metrics_text
from kvc_router import (
    ConfigError,
    ForkError,
    InvalidArgumentError,
    InvalidStateError,
    KVCAwareBalancer,
    NativeError,
    NoServerError,
    _native,
    errors,
)
from kvc_router.errors import KVR_INVALID_ARGUMENT, KVR_INVALID_STATE, InternalError, NativeConfigError, PoisonedError


@pytest.fixture
def lb():
    b = KVCAwareBalancer(
        {"s0": "h0", "s1": "h1"},
        router_config={
            "type": "kvc_aware",
            "config": {"strategies": [{"name": "kvc_aware"}], "max_prompt_tokens": 1000},
        },
    )
    yield b
    b.close()


def test_no_servers_error_text():
    b = KVCAwareBalancer({})
    with pytest.raises(NoServerError) as info:
        b.acquire_server("r")
    assert str(info.value) == "No available servers in load balancer"
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, NativeError)


def test_oversized_prompt(lb):
    with pytest.raises(InvalidArgumentError, match="1001 tokens, more than max_prompt_tokens") as info:
        lb.acquire_server("r", list(range(1001)))
    assert isinstance(info.value, ValueError) and info.value.code == KVR_INVALID_ARGUMENT
    assert lb.acquire_server("r", list(range(1000)))[0] in ("s0", "s1")
    assert lb.get_total_inflight() == 1


@pytest.mark.parametrize(
    "ids, exc, match",
    [
        ([1, 2**31], ValueError, "outside the int32 range"),
        ([-(2**31) - 1], ValueError, "outside the int32 range"),
        (np.array([1, 2**40]), ValueError, "outside the int32 range"),
        ([1, 2.5], TypeError, "only int token ids"),
        (["a"], TypeError, "only int token ids"),
        ("abc", TypeError, "sequence of int token ids"),
        (np.array([1.0, 2.0]), TypeError, "integer array"),
        (np.zeros((2, 3), dtype=np.int32), ValueError, "one-dimensional"),
        (array.array("d", [1.0]), TypeError, "not an integer array"),
        (object(), TypeError, "sequence of int token ids"),
        # Issue 20: byte buffers, unordered collections and bools are not token lists.
        (b"abc", TypeError, "got bytes"),
        (memoryview(b"abc"), TypeError, "got memoryview"),
        (memoryview(array.array("i", [1, 2])), TypeError, "got memoryview"),
        ({1, 2, 3}, TypeError, "ordered sequence of int token ids, got set"),
        (frozenset([1]), TypeError, "ordered sequence of int token ids, got frozenset"),
        ({1: 2}.keys(), TypeError, "ordered sequence of int token ids, got dict_keys"),
        ([True, False], TypeError, "only int token ids, found bool"),
        ((1, 2, False), TypeError, "only int token ids, found bool"),
        (iter([1, True]), TypeError, "only int token ids, found bool True"),
        # The length is refused before anything is packed or type-checked.
        (list(range(1000)) + [object()] * 5, InvalidArgumentError, "1005 tokens, more than max_prompt_tokens"),
        (np.zeros(1001, dtype=np.float64), InvalidArgumentError, "1001 tokens, more than max_prompt_tokens"),
        (array.array("d", [0.5] * 1001), InvalidArgumentError, "1001 tokens, more than max_prompt_tokens"),
    ],
)
def test_bad_prompt_ids(lb, ids, exc, match):
    with pytest.raises(exc, match=match):
        lb.acquire_server("r", ids)
    assert lb.get_total_inflight() == 0


class TorchLike:
    def __init__(self, v):
        self.v = v

    def tolist(self):
        return [self.v]


def test_prompt_id_forms(lb):
    p = list(range(64))
    for form in (
        p,
        tuple(p),
        array.array("i", p),
        array.array("q", p),
        np.asarray(p),
        np.asarray(p, np.uint16),
        TorchLike(p),
        iter(p),
        [],
        None,
        np.asarray([], dtype=np.int64),
    ):
        sid, handle = lb.acquire_server("same", form)
        assert (sid, handle) in (("s0", "h0"), ("s1", "h1"))


def test_bad_request_ids(lb):
    with pytest.raises(TypeError, match="request_id must be a str"):
        lb.acquire_server(123)
    with pytest.raises(ValueError, match="UTF-8"):
        lb.acquire_server("bad\udcff")
    with pytest.raises(InvalidArgumentError, match="more than the limit"):
        lb.acquire_server("x" * (70 << 10))


def test_bad_server_ids(lb):
    with pytest.raises(TypeError, match="server ids must be str"):
        lb.add_servers({1: None})
    with pytest.raises(ValueError, match="non-empty"):
        lb.add_servers({"": None})
    lb.release_server(None)  # silent, as verl
    lb.release_server("bad\udcff")
    assert lb.get_inflight_count(None) == 0
    lb.remove_servers("s1")  # a bare id
    assert lb.get_all_servers() == ["s0"]


def test_server_ids_checked_at_the_boundary(lb):
    """Issue 20 D3/D4: ids that are not valid Unicode, hold NUL or exceed 64 KiB
    are refused when added, with an error naming the problem (a lone surrogate
    used to become U+FFFD in the library: the handle was lost, releases missed
    and two ids merged); releases and lookups of such ids are counted no-ops."""
    for bad, exc, match in (
        ("a\udc80b", InvalidArgumentError, r"lone surrogate '\\udc80' at index 1"),
        ("\ud800", InvalidArgumentError, r"lone surrogate '\\ud800' at index 0"),
        ("a\x00b", InvalidArgumentError, "contains a NUL character at index 1"),
        ("x" * (64 << 10) + "y", InvalidArgumentError, "65537 bytes as UTF-8, more than the limit of 65536"),
        ("é" * (32 << 10) + "y", InvalidArgumentError, "65537 bytes as UTF-8"),
    ):
        with pytest.raises(exc, match=match):
            lb.add_servers({"ok-first": "h", bad: "h"})
        assert lb.get_all_servers() == ["s0", "s1"]
    # Two ids that differ only in their invalid part stay apart (and are refused).
    with pytest.raises(InvalidArgumentError):
        lb.add_servers(dict([("s\udc80", 1), ("s\udc81", 2)]))
    # Unusual but valid ids round-trip exactly, handle included.
    odd = {"\U0001F600:8000": "emoji", "\ufffd:1": "replacement", "é:2": "accent"}
    lb.add_servers(odd)
    lb.remove_servers(["s0", "s1"])
    picks = [lb.acquire_server(f"r{i}") for i in range(60)]
    assert {h for _, h in picks} == set(odd.values()) and all(odd[sid] == h for sid, h in picks)
    for sid, _ in picks:
        lb.release_server(sid)
    assert lb.get_total_inflight() == 0
    # Releases and lookups of impossible ids: no-ops, counted (documented as no-ops for unknown ids).
    before = lb.get_status()["router"]["ignored_invalid_ids"]
    lb.release_server("x" * (70 << 10))
    lb.release_server("bad\udcff")
    lb.release_server("a\x00b")
    lb.release_server(42)
    assert lb.get_inflight_count("bad\udcff") == 0
    lb.remove_servers(["bad\udcff", "a\x00b", "x" * (70 << 10)])  # unknown ids: ignored
    assert lb.get_status()["router"]["ignored_invalid_ids"] == before + 5
    assert sorted(lb.get_all_servers()) == sorted(odd)


def test_malformed_pushes(lb):
    with pytest.raises(InvalidArgumentError, match='metrics for server "s0"'):
        lb.update_metrics("s0", "vllm:num_requests_running{ 1\n")
    with pytest.raises(InvalidArgumentError, match='KV events for server "s0"'):
        lb.update_kv_events("s0", b"\xff\x00garbage")
    with pytest.raises(TypeError):
        lb.update_kv_events("s0", "not bytes")
    with pytest.raises(TypeError):
        lb.update_metrics("s0", 42)
    with pytest.raises(ConfigError, match="flavor"):
        lb.update_metrics("s0", "", flavor="tgi")
    assert lb.update_metrics("nope", metrics_text()) is False
    assert lb.update_metrics("s0", metrics_text()) is True
    assert lb.acquire_server("still-serving", [1, 2, 3])[0] in ("s0", "s1")


def test_closed_balancer(lb):
    lb.close()
    lb.close()  # idempotent
    for call in (
        lambda: lb.acquire_server("r"),
        lb.get_status,
        lb.get_total_inflight,
        lb.get_all_servers,
        lambda: lb.release_server("s0"),
        lambda: lb.add_servers({"s9": None}),
    ):
        with pytest.raises(InvalidStateError, match="closed"):
            call()


def test_stale_and_invalid_handles_in_the_library():
    r = _native.Router({"router": {}})
    stale = r.handle
    r.close()
    r.closed = False  # bypass the Python guard: the library itself must refuse
    for method in (r.total_inflight, r.status, r.reset_cache, r.close):
        with pytest.raises(InvalidStateError, match=f"invalid or closed router handle {stale}") as info:
            method()
        assert info.value.code == KVR_INVALID_STATE
    r.handle, r.closed = 0, False
    with pytest.raises(NativeError, match="invalid handle 0"):
        r.total_inflight()
    r.handle = 987654321
    with pytest.raises(InvalidStateError, match="invalid or closed"):
        r.acquire(b"x", None, 0, -1, -1)
    r.closed = True


def test_raw_abi_rejects_bad_pointers_and_lengths():
    lib = _native.load()
    r = _native.Router({"router": {"max_prompt_tokens": 8}})
    r.add_servers(["a"])
    err = ctypes.c_void_p()
    idx, gen = ctypes.c_int32(), ctypes.c_int64()

    def call(rid, rid_len, toks, n, pin=-1):
        code = lib.kvr_acquire(
            r.handle,
            rid,
            rid_len,
            toks,
            n,
            pin,
            None,
            0,
            -1,
            ctypes.byref(idx),
            ctypes.byref(gen),
            None,
            None,
            ctypes.byref(err),
        )
        return code, _native.take_string(lib, err)

    assert call(b"id", 2, None, 0) == (0, None)
    assert call(None, 5, None, 0) == (1, "request_id is NULL with length 5")
    assert call(b"id", -1, None, 0) == (1, "request_id length is negative (-1)")
    assert call(b"\xff\xfe", 2, None, 0) == (1, "request_id is not valid UTF-8")
    assert call(b"id", 2, None, 3) == (1, "prompt token array is NULL with length 3")
    assert call(b"id", 2, None, -4) == (1, "prompt length is negative (-4)")
    assert call(b"id", 2, None, 1 << 40) == (1, "prompt has 1099511627776 tokens, more than max_prompt_tokens (8)")
    assert call(b"id", 2, None, 0, pin=-5)[0] == 1
    code = lib.kvr_router_new(b"{not json", 9, None, ctypes.byref(err))
    assert (code, _native.take_string(lib, err)) == (1, "out_handle is NULL")
    h = ctypes.c_uint64()
    for bad, want in [
        (b"{not json", "invalid JSON"),
        (b'{"routr": {}}', "routr: unknown key"),
        (b'{"router": {"mode": "x"}}', "router.mode: \"x\" (allowed: default, kvc_aware)"),
        (b'{"router": {"sticky_max_size": -1}}', "router.sticky_max_size: must be positive"),
        (b'{"max_procs": -2}', "max_procs: must be in"),
        (b'{"collectors": {"collectors": [{"name": "os.system"}]}}', "allowed: vllm_metrics"),
    ]:
        code = lib.kvr_router_new(bad, len(bad), ctypes.byref(h), ctypes.byref(err))
        msg = _native.take_string(lib, err)
        assert code == 7 and want in msg, (bad, code, msg)
        assert h.value == 0
    for bad in (b"[1, 2]", b'[""]', b"{}", b"nope"):
        code = lib.kvr_add_servers(r.handle, bad, len(bad), None, ctypes.byref(err))
        assert code == 1, bad
        _native.take_string(lib, err)
    r.close()


def test_release_library_has_no_debug_panic():
    lib = _native.load()
    assert not hasattr(lib, "kvr_debug_panic")
    with pytest.raises(InvalidStateError, match="release build"):
        _native.debug_panic(0)


def _run(code, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )


def test_panic_recovered_in_subprocess():
    out = _run(
        """
        from kvc_router import KVCAwareBalancer, _native
        from kvc_router.errors import InternalError, PoisonedError
        for kind in range(4):
            try:
                _native.debug_panic(kind)
            except InternalError as e:
                print("recovered", kind, e)
        lb = KVCAwareBalancer({"s0": None})
        try:
            _native.debug_panic(1, lb._router.handle)
        except InternalError as e:
            print("poisoned-by", "poisoned" in str(e))
        try:
            lb.acquire_server("r")
        except PoisonedError as e:
            print("poisoned", e.code)
        other = KVCAwareBalancer({"s1": None})
        print("other", other.acquire_server("r")[0], other.get_status()["router"]["panics"])
        lb.close()
        """,
        {"KVC_ROUTER_LIB": debuglib.path()},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[1] for line in lines[:4]] == ["0", "1", "2", "3"]
    assert "requested panic" in lines[0] and "nil map" in lines[1]
    assert "nil pointer dereference" in lines[2] and "index out of range" in lines[3]
    assert lines[4:] == ["poisoned-by True", "poisoned 5", "other s1 5"]
    assert "goroutine" in out.stderr  # the stack is reported once per panic


def test_fork_guard_in_subprocess():
    out = _run(
        """
        import os
        from kvc_router import KVCAwareBalancer, ForkError
        lb = KVCAwareBalancer({"s0": None})
        lb.acquire_server("r")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                lb.acquire_server("child")
                msg = b"no error"
            except ForkError as e:
                msg = str(e).encode()
            try:
                KVCAwareBalancer({"s0": None})
            except ForkError:
                msg += b" | new refused"
            os.write(w, msg)
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(r, 4096).decode())
        print("parent", lb.acquire_server("r")[0])
        """
    )
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.strip().splitlines()
    assert "before fork()" in first and first.endswith("| new refused")
    assert second == "parent s0"


def test_error_classes_pickle():
    import pickle

    for e in (
        NoServerError(),
        NativeConfigError("router.mode: bad"),
        InvalidArgumentError("bad", 1),
        ConfigError("k: bad", "k", (1, 2)),
        ForkError("f", 3),
        PoisonedError("p", 5),
        InternalError("i", 4),
    ):
        e2 = pickle.loads(pickle.dumps(e))
        assert type(e2) is type(e) and str(e2) == str(e)


def test_codes_and_abi_version_match_the_header():
    """cabi/kvcrouter.h defines the status codes and the ABI version; the
    Python constants must agree with it (cabi/abi_test.go checks Go's)."""
    from kvc_harness import REPO

    with open(os.path.join(REPO, "cabi", "kvcrouter.h"), encoding="utf-8") as f:
        defines = dict(re.findall(r"^#define (KVR_[A-Z_]+) (-?\d+)", f.read(), re.M))
    codes = {k: int(v) for k, v in defines.items() if not k.startswith(("KVR_ABI_", "KVR_METRICS_"))}
    python = {k: v for k, v in vars(errors).items() if re.fullmatch(r"KVR_[A-Z_]+", k)}
    assert python == codes
    assert set(errors.CODE_NAMES) == set(codes.values())
    assert int(defines["KVR_ABI_VERSION"]) == _native.ABI_VERSION == _native.load().kvr_abi_version()
    assert int(defines["KVR_ABI_MINOR"]) == _native.ABI_MINOR == _native.load().kvr_abi_minor()
    assert {k: int(v) for k, v in defines.items() if k.startswith("KVR_METRICS_")} == {
        f"KVR_METRICS_{k.upper()}": v for k, v in _native.METRICS_FLAVORS.items()
    }


def test_unclassified_library_error_is_internal():
    e = errors.error_for(errors.KVR_INTERNAL, "internal error: something unexpected")
    assert isinstance(e, InternalError) and e.code == errors.KVR_INTERNAL


def test_set_kv_endpoints_validated():
    """Issue 20: a garbage replay address, ids not in the pool and 1,000
    publishers for one server are refused (the last used to start 1,002
    goroutines); no subscription starts and the goroutine count does not
    move."""
    from kvc_harness.balancer import kvc_config
    from kvc_router.errors import NotFoundError

    b = KVCAwareBalancer(
        {"10.0.0.1:8000": None, "10.0.0.2:8000": None}, router_config=kvc_config(collectors=("vllm_zmq",))
    )
    r = b._router
    g0 = b.get_status()["router"]["goroutines"]
    sid = b"10.0.0.1:8000"
    with pytest.raises(NativeConfigError, match=r"endpoints\[0\]\.replay: .*scheme must be tcp or ipc"):
        r.set_kv_endpoints(sid, [{"endpoint": "tcp://127.0.0.1:5557", "replay": "garbage!"}])
    with pytest.raises(NativeConfigError, match="1000 endpoints, more than the limit of 64 per server"):
        r.set_kv_endpoints(sid, [{"endpoint": f"tcp://127.0.0.1:{20000 + i}"} for i in range(1000)])
    with pytest.raises(NotFoundError, match="not in the pool"):
        r.set_kv_endpoints(b"10.0.0.9:8000", [{"endpoint": "tcp://127.0.0.1:5557"}])
    # An accepted (empty) list for another server runs a subscription sync
    # pass at once, which would start any refused list that was recorded.
    r.set_kv_endpoints(b"10.0.0.2:8000", [])
    st = b.get_status()["router"]
    assert st["collectors"]["collectors"]["vllm_zmq"] == [], st["collectors"]
    assert st["goroutines"] <= g0 + 2
    b.close()
