"""The real NVIDIA Dynamo KV router (ai-dynamo-runtime from .venv-peers):
the differential test against kvbench's dynamo_cost on a freshly recorded
trace, and the arena's in-process route on a real vllm-sim fleet (KV events
through Dynamo's own ZMQ relay)."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS_PY = os.environ.get("KVR_PEERS_PYTHON") or os.path.join(REPO, ".venv-peers", "bin", "python")


def _dynamo_ready() -> str:
    if not os.path.isfile(PEERS_PY):
        return f"{PEERS_PY} missing (testbed/scripts/peers_venv.sh)"
    r = subprocess.run([PEERS_PY, "-c", "import dynamo._core"], capture_output=True, text=True, timeout=120)
    return "" if r.returncode == 0 else f"dynamo._core not importable: {r.stderr[-300:]}"


pytestmark = pytest.mark.skipif(bool(_dynamo_ready()), reason=_dynamo_ready() or "ready")


def test_differential_fresh_trace(tmp_path):
    """A trace nothing was tuned on (seed 7): every decision of real
    dynamo._core either matches kvbench's dynamo_cost or has a known cause."""
    trace = tmp_path / "trace.json"
    script = os.path.join(REPO, "testbed", "scripts", "dynamo_diff.py")
    r = subprocess.run([PEERS_PY, script, "--seed", "7", "--ops", "300",
                        "--out", str(trace)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    g = subprocess.run(["go", "test", "-count=1", "-v", "-run", "^TestDynamoDifferential$", "./testbed/peers"],
                       cwd=REPO, env=dict(os.environ, KVR_DYNAMO_TRACE=str(trace)), capture_output=True, text=True,
                       timeout=600)
    assert g.returncode == 0, g.stdout[-3000:]
    m = re.search(r"(\d+) decisions, dynamo_cost agrees with dynamo._core on (\d+)", g.stdout)
    assert m, g.stdout[-2000:]
    decisions, agree = int(m.group(1)), int(m.group(2))
    assert decisions >= 100 and agree / decisions >= 0.9, (decisions, agree)


def _two_servers(tmp_path, cleanup):
    """A 2-server vllm-sim fleet with map-encoded KV events (Dynamo's relay reads them)."""
    from kvc_harness.arena import MODEL, sim_binary
    from kvc_harness.fleet import start_sim_fleet

    _, servers, _ = start_sim_fleet(sim_binary(), 2, cleanup,
                                    ["--model", MODEL, "--num-gpu-blocks", "1024", "--kv-events-encoding", "map"],
                                    str(tmp_path / "sim.log"))
    return servers


def _wait_for_events(router, servers, timeout: float = 60.0) -> None:
    """Until Dynamo has heard each server's KV events. Its ZMQ subscriptions
    join asynchronously, and a slow joiner misses what was published before
    it joined; a prompt sent again is cached and publishes nothing new, so
    each try is a fresh prompt (on a loaded host the join has taken longer
    than a first request)."""
    from kvc_harness.arena import stream_text_completion, tokenize

    deadline = time.time() + timeout
    for k, s in enumerate(servers):
        i = 0
        while True:
            text = " ".join(f"warm{k}x{i}y{j}" for j in range(64))
            ids = tokenize(s.url, text)
            stream_text_completion(s.url, text, 1, 1)
            time.sleep(0.2)
            if router.overlap_scores(ids).get(s.sid):
                break
            assert time.time() < deadline, f"Dynamo heard no KV events from {s.sid} in {timeout:g} s"
            i += 1


@pytest.mark.parametrize("where", ["in_process", "own_process"])
def test_arena_route_follows_kv_events(tmp_path, where):
    """Dynamo's KvRouter on a real 2-server vllm-sim fleet, in this process
    and served from its own (the arena's DynamoRoute): after one server
    served a prompt, Dynamo routes the same prompt there with its full-block
    overlap; after the fleet's prefix-cache reset (the RL weight update) the
    servers' AllBlocksCleared events leave no overlap."""
    from kvc_harness.arena import MODEL, stream_text_completion, tokenize
    from kvc_harness.client import reset_prefix_caches
    from kvc_harness.dynamo_route import DynamoKvRouter, DynamoRouterProcess
    from kvc_harness.procs import Cleanup

    cleanup = Cleanup()
    router = None
    try:
        servers = _two_servers(tmp_path, cleanup)
        cls = DynamoKvRouter if where == "in_process" else DynamoRouterProcess
        router = cls(PEERS_PY, [(s.sid, s.events[0], s.topic) for s in servers], 16, 1024, 64, 8192, MODEL)
        _wait_for_events(router, servers)
        text = " ".join(f"dyn{j}" for j in range(200))
        ids = tokenize(servers[0].url, text)
        deadline = time.time() + 20
        overlap = {}
        # The ZMQ subscription joins asynchronously: repeat until Dynamo saw it.
        while time.time() < deadline:
            stream_text_completion(servers[1].url, text, 2, 1)
            time.sleep(0.3)
            overlap = router.overlap_scores(ids)
            if overlap.get(servers[1].sid):
                break
        assert overlap.get(servers[1].sid) == 200 // 16, overlap
        assert not overlap.get(servers[0].sid), overlap
        assert router.best_worker(ids, None) == (servers[1].sid, 200 // 16)
        rid = router.new_request_id()
        assert router.best_worker(ids, rid)[0] == servers[1].sid
        loads = router.potential_loads(ids)
        assert loads[servers[1].sid]["active_requests"] == 1 and loads[servers[0].sid]["active_requests"] == 0
        router.mark_prefill_complete(rid)
        router.free(rid)
        assert router.potential_loads(ids)[servers[1].sid]["active_requests"] == 0
        reset_prefix_caches({s.sid: s.url for s in servers})
        deadline = time.time() + 10
        while time.time() < deadline and router.overlap_scores(ids).get(servers[1].sid):
            time.sleep(0.1)
        assert not router.overlap_scores(ids).get(servers[1].sid)
        if where == "own_process":
            # A failing call comes back as an error and the process keeps serving.
            with pytest.raises(RuntimeError, match="unknown method"):
                router._call("no_such_method")
            assert router.best_worker(ids, None)[0] in {s.sid for s in servers}
            assert router.proc.poll() is None
    finally:
        if router is not None:
            router.close()
        cleanup.run()


def test_proxy_routes_forwards_and_tracks(tmp_path):
    """The served router as the request path (the arena's DynamoRoute): a
    streamed completion sent to the proxy comes back whole from the server
    Dynamo chose; a repeated prompt goes where its blocks are (the engine
    reports them cached); every request is marked at its first token and freed
    at its end (no active request left); a prompt without token ids is
    tokenised by an engine; a malformed request gets 400, an unknown path 404,
    and the proxy keeps serving."""
    from kvc_harness.arena import MODEL, stream_text_completion, tokenize
    from kvc_harness.client import http_request
    from kvc_harness.dynamo_route import DynamoRouterProcess
    from kvc_harness.procs import Cleanup

    cleanup = Cleanup()
    router = None
    try:
        servers = _two_servers(tmp_path, cleanup)
        router = DynamoRouterProcess(PEERS_PY, [(s.sid, s.events[0], s.topic) for s in servers], 16, 1024, 64, 8192,
                                     MODEL, proxy_urls={s.sid: s.url for s in servers})
        assert http_request(router.proxy_url + "/health", timeout=10.0)[0] == 200
        _wait_for_events(router, servers)  # straight to the servers: the proxy's counts stay the test's
        text = " ".join(f"prox{j}" for j in range(200))
        ids = tokenize(servers[0].url, text)
        first = stream_text_completion(router.proxy_url, text, 8, 1, extra_body={"prompt_token_ids": ids})
        assert first["completion_tokens"] == 8 and first["text"], first
        # Dynamo hears the first request's blocks through the KV events; the
        # same prompt then goes to the server holding them.
        deadline = time.time() + 20
        while time.time() < deadline and max(router.overlap_scores(ids).values(), default=0) == 0:
            time.sleep(0.1)
        again = stream_text_completion(router.proxy_url, text, 4, 2, extra_body={"prompt_token_ids": ids})
        assert again["cached"] >= 192, again
        # No ids: the proxy tokenises with an engine's /tokenize.
        plain = stream_text_completion(router.proxy_url, "no ids here at all", 3, 3)
        assert plain["completion_tokens"] == 3
        st = router.proxy_stats()
        assert st["requests"] == 3 and st["first_token_marks"] == 3 and st["errors"] == 0, st
        assert st["tokenized"] == 1 and st["overlap_blocks"] >= 200 // 16, st
        loads = router.potential_loads(ids)
        assert all(v["active_requests"] == 0 for v in loads.values()), loads
        host, port = router.proxy_url.rsplit("//", 1)[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10.0)
        conn.request("POST", "/v1/completions", body=b"{not json", headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 400 and b"request body" in resp.read()
        conn.close()
        assert router.proxy_stats()["errors"] == 1
        assert http_request(router.proxy_url + "/v1/chat", "POST", {"x": 1}, timeout=10.0)[0] == 404
        assert stream_text_completion(router.proxy_url, text, 2, 4,
                                      extra_body={"prompt_token_ids": ids})["completion_tokens"] == 2
        # A non-streamed request gets one completion (the proxy streamed from
        # the engine to hear the first token): the same text, token count and
        # cached tokens a streamed one gets, and the first token was marked.
        marks = router.proxy_stats()["first_token_marks"]
        whole = stream_text_completion(router.proxy_url, text, 6, 5, stream=False,
                                       extra_body={"prompt_token_ids": ids})
        streamed = stream_text_completion(router.proxy_url, text, 6, 5, extra_body={"prompt_token_ids": ids})
        assert whole["completion_tokens"] == 6 and whole["text"] == streamed["text"] and whole["id"], whole
        assert whole["cached"] >= 192 and whole["prompt_tokens"] == streamed["prompt_tokens"], (whole, streamed)
        assert router.proxy_stats()["first_token_marks"] == marks + 2
        assert all(v["active_requests"] == 0 for v in router.potential_loads(ids).values())
        assert router.proc.poll() is None
    finally:
        if router is not None:
            router.close()
        cleanup.run()


def test_sse_to_completion_joins_events_and_reports_errors():
    """The proxy's conversion of an engine's events into a non-streamed
    completion (no processes): texts and token ids joined in order, the last
    finish reason, the usage chunk; an engine's error event is a 503 and a
    broken event a 502, never a partial completion."""
    from kvc_harness.dynamo_route import sse_to_completion

    def ev(obj) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    ok = (ev({"id": "c1", "object": "text_completion", "model": "m",
              "choices": [{"text": "a", "token_ids": [1], "finish_reason": None}]})
          + ev({"id": "c1", "choices": [{"text": "b", "token_ids": [2], "finish_reason": "length"}]})
          + ev({"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
          + b"data: [DONE]\n\n")
    cases = [
        (ok, 200, {"id": "c1", "object": "text_completion", "model": "m",
                   "choices": [{"index": 0, "text": "ab", "token_ids": [1, 2], "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
        (ev({"object": "error", "message": "engine stopped", "code": 503}), 503, {"error": "engine stopped"}),
        (b"data: {not json\n\n", 502, None),
        (b"data: [1, 2]\n\n", 502, None),
    ]
    for raw, status, want in cases:
        got_status, got = sse_to_completion(raw)
        assert got_status == status, (raw, got)
        if want is not None:
            assert got == want
        else:
            assert "error" in got and "choices" not in got
