"""The ctypes declarations of kvc_router._native against cabi/kvcrouter.h:
every export of the header is declared with the argument and result types
its prototype gives, and nothing else is declared."""

from __future__ import annotations

import ctypes
import os
import re
from ctypes import POINTER, c_char_p, c_int32, c_int64, c_uint64, c_void_p

import pytest
from kvc_harness import REPO
from kvc_router import _native

# C parameter type -> the ctypes types that pass it correctly. Borrowed
# buffers may be declared c_char_p (bytes) or c_void_p (an address).
C_TO_CTYPES = {
    "int32_t": (c_int32,),
    "int64_t": (c_int64,),
    "uint64_t": (c_uint64,),
    "kvr_handle": (c_uint64,),
    "const char *": (c_char_p,),
    "const void *": (c_char_p, c_void_p),
    "const int32_t *": (c_void_p,),
    "void *": (c_void_p,),
    "char **": (POINTER(c_void_p),),
    "int32_t *": (POINTER(c_int32),),
    "int64_t *": (POINTER(c_int64),),
    "kvr_handle *": (POINTER(c_uint64),),
    "const kvr_acquire_opts *": (POINTER(_native.AcquireOpts),),
}
C_RESULT = {"int32_t": c_int32, "void": None}


def _header() -> str:
    with open(os.path.join(REPO, "cabi", "kvcrouter.h"), encoding="utf-8") as f:
        text = f.read()
    # The test-build block is declared separately (kvr_debug_panic).
    text = re.sub(r"#ifdef KVR_TEST_BUILD.*?#endif", "", text, flags=re.S)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _prototypes() -> dict:
    out = {}
    for ret, name, params in re.findall(r"\b(int32_t|void)\s+(kvr_\w+)\(([^)]*)\);", _header()):
        types = []
        params = " ".join(params.split())
        if params != "void":
            for p in params.split(","):
                m = re.fullmatch(r"\s*(.*?)\s*(\**)\s*(\w+)\s*", p)
                assert m, f"{name}: cannot parse parameter {p!r}"
                base, stars = m.group(1), m.group(2)
                types.append(f"{base} {stars}" if stars else base)
        out[name] = (types, ret)
    return out


def test_header_parses_every_export():
    protos = _prototypes()
    assert len(protos) >= 20 and "kvr_acquire_with" in protos and "kvr_version" in protos


def test_ctypes_declarations_match_the_header():
    _native.load()  # fills SIGNATURES with every declaration
    protos = _prototypes()
    assert set(_native.SIGNATURES) == set(protos), "declared and header exports differ"
    for name, (ctypes_args, ctypes_res) in _native.SIGNATURES.items():
        c_args, c_ret = protos[name]
        assert len(ctypes_args) == len(c_args), f"{name}: {len(ctypes_args)} argtypes, header has {len(c_args)}"
        for i, (got, want) in enumerate(zip(ctypes_args, c_args)):
            assert want in C_TO_CTYPES, f"{name}: no ctypes mapping for C type {want!r}"
            assert got in C_TO_CTYPES[want], f"{name} argument {i}: ctypes {got}, header {want!r}"
        assert ctypes_res is C_RESULT[c_ret], f"{name}: restype {ctypes_res}, header {c_ret}"
        fn = getattr(_native.load(), name)
        assert fn.argtypes == ctypes_args or (not ctypes_args and not fn.argtypes)
        assert fn.restype is ctypes_res


def test_acquire_opts_matches_the_header():
    m = re.search(r"typedef struct kvr_acquire_opts \{(.*?)\} kvr_acquire_opts;", _header(), re.S)
    assert m
    names = [re.findall(r"(\w+);", line)[0] for line in m.group(1).strip().splitlines()]
    assert names == [f for f, _ in _native.AcquireOpts._fields_]
    assert ctypes.sizeof(_native.AcquireOpts) == 8 * len(names)


def test_acquire_with_from_python():
    """kvr_acquire_with through ctypes: the struct's declared size decides
    which fields are read."""
    lib = _native.load()
    r = _native.Router({"router": {"mode": "kvc_aware"}})
    try:
        r.add_servers(["a:1", "b:1"])
        toks = (ctypes.c_int32 * 32)()
        opts = _native.AcquireOpts(
            size=ctypes.sizeof(_native.AcquireOpts),
            request_id=b"q",
            request_id_len=1,
            tokens=ctypes.addressof(toks),
            n_tokens=32,
            pin=1,
            lora=b"",
            lora_len=0,
            known_generation=-1,
        )
        idx, gen, srv, dec, err = ctypes.c_int32(-1), ctypes.c_int64(0), c_void_p(), c_void_p(), c_void_p()
        args = (ctypes.byref(idx), ctypes.byref(gen), ctypes.byref(srv), ctypes.byref(dec), ctypes.byref(err))
        assert lib.kvr_acquire_with(r.handle, ctypes.byref(opts), *args) == 0
        assert idx.value == 1 and _native.take_string(lib, srv) == "b:1"
        _native.take_string(lib, dec)
        opts.size = 8
        assert lib.kvr_acquire_with(r.handle, ctypes.byref(opts), *args) == _native.KVR_INVALID_ARGUMENT
        assert "smaller than the first kvr_acquire_opts" in _native.take_string(lib, err)
    finally:
        r.close()


def test_library_version():
    v = _native.library_version()
    assert v["abi_version"] == _native.ABI_VERSION and v["abi_minor"] >= _native.ABI_MINOR
    assert v["version"].startswith(__import__("kvc_router").__version__)
    assert v["go_version"].startswith("go")


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"router": {"mode": "fast"}}, "router.mode"),
        (
            {"collectors": {"collectors": [{"name": "vllm_metrics", "interval_ms": -1}]}},
            "collectors.collectors[0].interval_ms",
        ),
    ],
)
def test_validate_config_error_is_structured(doc, key):
    with pytest.raises(_native.NativeConfigError) as e:
        _native.validate_config(doc)
    assert e.value.key == key and str(e.value) == f"{key}: {e.value.reason}"
