"""The C ABI from C: a program compiled with `cc` against cabi/kvcrouter.h and
linked to the built library, plus the exported-symbol and glibc checks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from kvc_harness import REPO, debuglib
from kvc_router import _native

HEADER_DIR = os.path.join(REPO, "cabi")

C_PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "kvcrouter.h"

static int fails = 0;
#define CHECK(cond, what) do { if (!(cond)) { printf("FAIL %s (line %d)\n", what, __LINE__); fails++; } } while (0)

static int expect(int32_t got, int32_t want, char *err, const char *needle, const char *what) {
    int ok = got == want && (needle == NULL || (err != NULL && strstr(err, needle) != NULL));
    if (!ok) { printf("FAIL %s: code %d want %d, err=%s\n", what, got, want, err ? err : "(null)"); fails++; }
    kvr_free(err);
    return ok;
}

#define EXPECT(call, want, e, needle, what) do { int32_t c_ = (call); expect(c_, want, e, needle, what); e = NULL; } while (0)

int main(void) {
    char *nothing = NULL;
    char *err = NULL, *json = NULL, *server = NULL;
    kvr_handle h = 0;
    int32_t idx = -1, released = 0;
    int64_t gen = 0, n = 0;

    CHECK(kvr_abi_version() == KVR_ABI_VERSION && kvr_abi_minor() >= KVR_ABI_MINOR, "abi version");
    EXPECT(kvr_version(&json, &err), KVR_OK, err, NULL, "version");
    CHECK(json && strstr(json, "\"abi_version\":1") && strstr(json, "\"version\":\"0."), "version json");
    kvr_free(json); json = NULL;
    const char *bad = "{\"router\": {\"mode\": \"fast\"}}";
    EXPECT(kvr_router_new(bad, (int64_t)strlen(bad), &h, &err), KVR_INVALID_CONFIG, err, "allowed: default, kvc_aware", "bad mode");
    CHECK(h == 0, "no handle on error");
    EXPECT(kvr_router_new("{", 1, &h, &err), KVR_INVALID_CONFIG, err, "invalid JSON", "malformed JSON");
    const char *defaults = "{\"router\": {\"mode\": \"kvc_aware\"}}";
    EXPECT(kvr_validate_config(defaults, (int64_t)strlen(defaults), &json, &err), KVR_OK, err, NULL, "validate");
    CHECK(json && strstr(json, "\"alpha\":0.3") && strstr(json, "\"kv_tokens\":480000"), "library defaults");
    kvr_free(json); json = NULL;
    const char *badp = "{\"router\": {\"mode\": \"kvc_aware\", \"strategies\": [{\"name\": \"kvc_aware\", \"weight\": 1, \"params\": {\"alpha\": 2}}]}}";
    EXPECT(kvr_validate_config(badp, (int64_t)strlen(badp), &json, &err), KVR_INVALID_CONFIG, err,
           "router.strategies[0].params.alpha: must be in [0, 1]", "validate names the key");
    CHECK(json && strcmp(json, "{\"key\":\"router.strategies[0].params.alpha\",\"reason\":\"must be in [0, 1], got 2\"}") == 0,
          "the error as {key, reason}");
    kvr_free(json); json = NULL;
    EXPECT(kvr_router_new(NULL, 4, &h, &err), KVR_INVALID_ARGUMENT, err, "NULL with length 4", "null config");

    const char *cfg = "{\"router\": {\"mode\": \"kvc_aware\", \"max_prompt_tokens\": 4096}}";
    EXPECT(kvr_router_new(cfg, (int64_t)strlen(cfg), &h, &err), KVR_OK, err, NULL, "new");
    CHECK(h != 0, "handle");

    int32_t tokens[64];
    for (int i = 0; i < 64; i++) tokens[i] = i + 1;
    EXPECT(kvr_acquire(h, "r", 1, tokens, 64, -1, NULL, 0, -1, &idx, &gen, &server, NULL, &err),
           KVR_NO_SERVERS, err, "No available servers in load balancer", "empty pool");

    const char *ids = "[\"10.0.0.1:8000\", \"10.0.0.2:8000\"]";
    EXPECT(kvr_add_servers(h, ids, (int64_t)strlen(ids), &gen, &err), KVR_OK, err, NULL, "add");
    EXPECT(kvr_acquire(h, "r", 1, tokens, 64, -1, NULL, 0, -1, &idx, &gen, &server, &json, &err), KVR_OK, err, NULL, "acquire");
    CHECK(idx == 0 && server != NULL && strcmp(server, "10.0.0.1:8000") == 0, "acquire result");
    CHECK(json != NULL && strstr(json, "\"reason\":\"scored\"") != NULL, "decision json");
    kvr_free(json); json = NULL;
    /* A known generation suppresses the string. */
    kvr_free(server); server = NULL;
    EXPECT(kvr_acquire(h, "r", 1, tokens, 64, -1, NULL, 0, gen, &idx, &gen, &server, NULL, &err), KVR_OK, err, NULL, "sticky");
    CHECK(server == NULL && idx == 0, "no string when generation is known");
    EXPECT(kvr_acquire(h, "p", 1, NULL, 0, 1, NULL, 0, -1, &idx, NULL, NULL, NULL, &err), KVR_OK, err, NULL, "pinned");
    CHECK(idx == 1, "pin selects index 1");
    /* The growable form, compiled against the header's struct. */
    kvr_acquire_opts o = {sizeof o, "p", 1, tokens, 64, 1, NULL, 0, -1}; /* "p" is bound to index 1 */
    EXPECT(kvr_acquire_with(h, &o, &idx, NULL, &server, NULL, &err), KVR_OK, err, NULL, "acquire_with");
    CHECK(idx == 1 && server && strcmp(server, "10.0.0.2:8000") == 0, "acquire_with pins");
    EXPECT(kvr_release(h, server, (int64_t)strlen(server), &released, &err), KVR_OK, err, NULL, "release acquire_with");
    kvr_free(server); server = NULL;
    o.size = offsetof(kvr_acquire_opts, pin); /* a first-version caller: pin and the rest default */
    EXPECT(kvr_acquire_with(h, &o, &idx, NULL, &server, NULL, &err), KVR_OK, err, NULL, "acquire_with short");
    CHECK(server != NULL, "short opts: known_generation defaults to -1");
    if (server) EXPECT(kvr_release(h, server, (int64_t)strlen(server), &released, &err), KVR_OK, err, NULL, "release short");
    kvr_free(server); server = NULL;
    o.size = 4;
    EXPECT(kvr_acquire_with(h, &o, &idx, NULL, NULL, NULL, &err), KVR_INVALID_ARGUMENT, err, "smaller", "acquire_with size");

    EXPECT(kvr_acquire(h, NULL, 3, tokens, 64, -1, NULL, 0, -1, &idx, NULL, NULL, NULL, &err), KVR_INVALID_ARGUMENT, err, "request_id is NULL", "null id");
    EXPECT(kvr_acquire(h, "r", -1, tokens, 64, -1, NULL, 0, -1, &idx, NULL, NULL, NULL, &err), KVR_INVALID_ARGUMENT, err, "negative", "negative id length");
    EXPECT(kvr_acquire(h, "\xff\xfe", 2, tokens, 64, -1, NULL, 0, -1, &idx, NULL, NULL, NULL, &err), KVR_INVALID_ARGUMENT, err, "UTF-8", "invalid UTF-8");
    EXPECT(kvr_acquire(h, "r", 1, NULL, 64, -1, NULL, 0, -1, &idx, NULL, NULL, NULL, &err), KVR_INVALID_ARGUMENT, err, "token array is NULL", "null tokens");
    EXPECT(kvr_acquire(h, "r", 1, tokens, -64, -1, NULL, 0, -1, &idx, NULL, NULL, NULL, &err), KVR_INVALID_ARGUMENT, err, "negative", "negative tokens");
    EXPECT(kvr_acquire(h, "r", 1, tokens, 4097, -1, NULL, 0, -1, &idx, NULL, NULL, NULL, &err), KVR_INVALID_ARGUMENT, err, "max_prompt_tokens (4096)", "oversized");
    EXPECT(kvr_acquire(h, "r", 1, tokens, 1, -1, NULL, 0, -1, &idx, NULL, NULL, NULL, NULL), KVR_OK, nothing, NULL, "err may be NULL");

    EXPECT(kvr_release(h, "10.0.0.1:8000", 13, &released, &err), KVR_OK, err, NULL, "release");
    CHECK(released == 1, "released");
    EXPECT(kvr_release(h, "nope", 4, &released, &err), KVR_OK, err, NULL, "release unknown");
    CHECK(released == 0, "unknown is a no-op");
    EXPECT(kvr_inflight(h, "10.0.0.1:8000", 13, &n, &err), KVR_OK, err, NULL, "inflight");
    CHECK(n == 2, "inflight count");
    EXPECT(kvr_total_inflight(h, &n, &err), KVR_OK, err, NULL, "total");
    CHECK(n == 3, "total inflight");
    EXPECT(kvr_total_inflight(h, NULL, &err), KVR_INVALID_ARGUMENT, err, "out is NULL", "null out");

    const char *metrics = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 2.0\n";
    EXPECT(kvr_update_metrics(h, "10.0.0.2:8000", 13, metrics, (int64_t)strlen(metrics), KVR_METRICS_VLLM, &err), KVR_OK, err, NULL, "metrics");
    EXPECT(kvr_update_metrics(h, "10.0.0.9:8000", 13, metrics, (int64_t)strlen(metrics), KVR_METRICS_VLLM, &err), KVR_NOT_FOUND, err, "not in the pool", "metrics unknown server");
    EXPECT(kvr_update_metrics(h, "10.0.0.2:8000", 13, "x{", 2, KVR_METRICS_VLLM, &err), KVR_INVALID_ARGUMENT, err, NULL, "bad metrics");
    EXPECT(kvr_update_metrics(h, "10.0.0.2:8000", 13, metrics, 10, 7, &err), KVR_INVALID_ARGUMENT, err, "flavor", "bad flavor");
    const unsigned char junk[3] = {0xc1, 0xc1, 0xc1};
    EXPECT(kvr_update_events(h, "10.0.0.2:8000", 13, junk, 3, &err), KVR_INVALID_ARGUMENT, err, "KV events", "bad events");
    EXPECT(kvr_set_kv_endpoints(h, "10.0.0.2:8000", 13, "[]", 2, &err), KVR_INVALID_CONFIG, err, "no vllm_zmq", "endpoints without zmq");

    EXPECT(kvr_status(h, &json, &err), KVR_OK, err, NULL, "status");
    CHECK(json && strstr(json, "\"mode\":\"kvc_aware\"") && strstr(json, "\"pool\":[\"10.0.0.1:8000\",\"10.0.0.2:8000\"]"), "status json");
    kvr_free(json); json = NULL;
    EXPECT(kvr_servers(h, &json, &gen, &err), KVR_OK, err, NULL, "servers");
    CHECK(json && strcmp(json, "[\"10.0.0.1:8000\",\"10.0.0.2:8000\"]") == 0, "servers json");
    kvr_free(json); json = NULL;
    EXPECT(kvr_clear_sticky(h, &json, &err), KVR_OK, err, NULL, "clear sticky");
    CHECK(json && strstr(json, "\"cleared_entries\":2") && strstr(json, "{\"id\":\"10.0.0.1:8000\",\"inflight\":2}"), "clear json");
    kvr_free(json); json = NULL;
    EXPECT(kvr_reset_cache(h, &err), KVR_OK, err, NULL, "reset");
    EXPECT(kvr_remove_servers(h, "[\"10.0.0.1:8000\"]", 17, &gen, &err), KVR_OK, err, NULL, "remove");
    EXPECT(kvr_add_servers(h, "[1]", 3, &gen, &err), KVR_INVALID_ARGUMENT, err, "JSON array of strings", "bad ids");

    /* Router-side admission (ABI 1.2): one slot per server, room for one held request. */
    {
        kvr_handle a = 0;
        const char *acfg = "{\"router\": {\"mode\": \"kvc_aware\", \"admission\": {\"enabled\": true, \"max_inflight\": 1, \"max_queue\": 1}}}";
        EXPECT(kvr_router_new(acfg, (int64_t)strlen(acfg), &a, &err), KVR_OK, err, NULL, "admission new");
        EXPECT(kvr_add_servers(a, "[\"s0\"]", 6, &gen, &err), KVR_OK, err, NULL, "admission add");
        kvr_acquire_opts q = {sizeof q, "q0", 2, tokens, 64, -1, NULL, 0, -1, 1, 1};
        EXPECT(kvr_acquire_with(a, &q, &idx, NULL, NULL, NULL, &err), KVR_OK, err, NULL, "submit with room");
        CHECK(idx == 0, "routed with room");
        q.request_id = "q1"; q.ticket = 2;
        EXPECT(kvr_acquire_with(a, &q, &idx, &gen, &server, &json, &err), KVR_HELD, err, NULL, "held");
        CHECK(idx == -1 && server == NULL && json == NULL, "held: outputs unset");
        q.request_id = "q2"; q.ticket = 3;
        EXPECT(kvr_acquire_with(a, &q, &idx, NULL, NULL, NULL, &err), KVR_QUEUE_FULL, err, "admission.max_queue", "queue full");
        EXPECT(kvr_release_admit(a, "s0", 2, &released, NULL, &err), KVR_INVALID_ARGUMENT, err, "out_admitted is NULL", "release_admit NULL out");
        EXPECT(kvr_release_admit(a, "s0", 2, &released, &json, &err), KVR_OK, err, NULL, "release_admit");
        CHECK(released == 1 && json && strcmp(json, "[{\"ticket\":2,\"index\":0,\"generation\":2,\"server\":\"s0\"}]") == 0, "admitted json");
        kvr_free(json); json = NULL;
        q.request_id = "q3"; q.ticket = 4;
        EXPECT(kvr_acquire_with(a, &q, &idx, NULL, NULL, NULL, &err), KVR_HELD, err, NULL, "held again");
        int32_t cancelled = 0;
        EXPECT(kvr_cancel(a, 4, &cancelled, &err), KVR_OK, err, NULL, "cancel");
        CHECK(cancelled == 1, "cancelled");
        EXPECT(kvr_pump(a, &json, &err), KVR_OK, err, NULL, "pump");
        CHECK(json == NULL, "nothing to admit");
        EXPECT(kvr_router_close(a, &err), KVR_OK, err, NULL, "admission close");
    }

    EXPECT(kvr_router_close(h, &err), KVR_OK, err, NULL, "close");
    EXPECT(kvr_router_close(h, &err), KVR_INVALID_STATE, err, "invalid or closed", "double close");
    EXPECT(kvr_total_inflight(h, &n, &err), KVR_INVALID_STATE, err, "invalid or closed", "use after close");
    EXPECT(kvr_total_inflight(0, &n, &err), KVR_INVALID_ARGUMENT, err, "invalid handle 0", "handle 0");
    kvr_free(NULL);
    printf(fails ? "FAILED %d\n" : "ALL OK\n", fails);
    return fails != 0;
}
"""


@pytest.fixture(scope="module")
def lib_path():
    return _native.library_path()


def test_c_program(tmp_path, lib_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "abi_test.c"
    src.write_text(C_PROGRAM)
    exe = tmp_path / "abi_test"
    libdir = os.path.dirname(lib_path)
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-Wall",
            "-Werror",
            "-I",
            HEADER_DIR,
            str(src),
            "-o",
            str(exe),
            lib_path,
            f"-Wl,-rpath,{libdir}",
        ],
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip().endswith("ALL OK"), out.stdout + out.stderr


def _exports(lib_path):
    out = subprocess.run(["nm", "-D", "--defined-only", lib_path], capture_output=True, text=True, check=True).stdout
    return sorted({line.split()[-1] for line in out.splitlines() if line.strip()})


def _declared():
    """The header's functions: (release ABI, test build only)."""
    with open(os.path.join(HEADER_DIR, "kvcrouter.h")) as f:
        text = f.read()
    test_block = re.search(r"^#ifdef KVR_TEST_BUILD$(.*?)^#endif$", text, re.M | re.S).group(1)
    names = lambda t: sorted(set(re.findall(r"^\S.*?\b(kvr_\w+)\(", t, re.M)))  # noqa: E731
    test_only = names(test_block)
    return [n for n in names(text) if n not in test_only], test_only


def test_only_kvr_symbols_exported(lib_path):
    if not shutil.which("nm"):
        pytest.skip("no nm")
    exports = _exports(lib_path)
    assert exports and all(s.startswith("kvr_") for s in exports), [s for s in exports if not s.startswith("kvr_")]
    release, test_only = _declared()
    assert test_only == ["kvr_debug_panic"]
    assert exports == release  # the release library has no debug export


def test_test_build_adds_only_the_debug_export(tmp_path):
    if not shutil.which("nm"):
        pytest.skip("no nm")
    release, test_only = _declared()
    assert _exports(debuglib.path()) == sorted(release + test_only)


def test_debug_panic_from_c(tmp_path):
    """The test build, from C: a panic is KVR_INTERNAL and poisons the handle."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lib = debuglib.path()
    src = tmp_path / "panic.c"
    src.write_text(PANIC_PROGRAM)
    exe = tmp_path / "panic"
    subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", "-DKVR_TEST_BUILD", "-I", HEADER_DIR, str(src), "-o", str(exe), lib,
         f"-Wl,-rpath,{os.path.dirname(lib)}"],
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ALL OK", out.stdout + out.stderr


PANIC_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include "kvcrouter.h"

int main(void) {
    char *err = NULL;
    kvr_handle h = 0;
    int64_t n = 0;
    if (kvr_router_new("{}", 2, &h, &err) != KVR_OK) { printf("new failed\n"); return 1; }
    int32_t c = kvr_debug_panic(h, 0, &err);
    if (c != KVR_INTERNAL || !err || !strstr(err, "requested panic")) { printf("panic: %d %s\n", c, err ? err : ""); return 1; }
    kvr_free(err); err = NULL;
    c = kvr_total_inflight(h, &n, &err);
    if (c != KVR_POISONED) { printf("after panic: %d\n", c); return 1; }
    kvr_free(err); err = NULL;
    c = kvr_debug_panic(0, 9, &err);
    if (c != KVR_INVALID_ARGUMENT) { printf("unknown kind: %d\n", c); return 1; }
    kvr_free(err);
    kvr_router_close(h, NULL);
    printf("ALL OK\n");
    return 0;
}
"""


def test_glibc_requirement_matches_wheel_tag(lib_path):
    if not shutil.which("objdump"):
        pytest.skip("no objdump")
    out = subprocess.run(["objdump", "-T", lib_path], capture_output=True, text=True, check=True).stdout
    versions = sorted({tuple(map(int, v)) for v in re.findall(r"GLIBC_(\d+)\.(\d+)", out)})
    assert versions and versions[-1] <= (2, 34), versions[-1]
