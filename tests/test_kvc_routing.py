"""kvc_aware routing through Ray: pushed metrics and KV events steer a prompt
to the server holding its prefix; overload breaks stickiness; a removed server
is never returned; real HTTP polling and a real ZMQ subscription feed it too."""

from __future__ import annotations

import http.server
import random
import struct
import threading
import time

import pytest
from kvc_harness.balancer import KVC_NO_COLLECTORS
from kvc_harness.wire import block_stored, event_batch, metrics_text

SERVERS = {"s0": None, "s1": None, "s2": None}


def prompt(seed, n=512):
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(n)]


def push_idle_metrics(ray, lb, ids):
    ray.get([lb.update_metrics.remote(sid, metrics_text()) for sid in ids])


@pytest.fixture
def kvc_lb(ray_cluster, make_actor):
    lb = make_actor(servers=dict(SERVERS), max_cache_size=10000, router_config=KVC_NO_COLLECTORS)
    push_idle_metrics(ray_cluster, lb, SERVERS)
    return lb


@pytest.fixture
def kvc_lb_together(ray_cluster, make_actor):
    """group_spread and task_spread 0: a prompt's requests follow its prefix
    holder (test_grpo_group_spreads_with_group_spread and
    test_agent_task_spreads_when_told_multi_turn spread them)."""
    strategy = {"_target_": "kvc_router.config.KVCAwareStrategyConfig", "group_spread": 0, "task_spread": 0}
    cfg = {"type": "kvc_aware", "config": {"strategies": [strategy]}}
    lb = make_actor(servers=dict(SERVERS), max_cache_size=10000, router_config=cfg)
    push_idle_metrics(ray_cluster, lb, SERVERS)
    return lb


def test_prompt_goes_to_prefix_holder(ray_cluster, kvc_lb_together):
    ray, lb = ray_cluster, kvc_lb_together
    p = prompt(1)
    assert ray.get(lb.update_kv_events.remote("s2", event_batch(block_stored(p[:384]))))
    sid, _ = ray.get(lb.acquire_server.remote(request_id="grpo-0", prompt_ids=p))
    assert sid == "s2"
    # A GRPO sibling (new request id, same prompt) follows it.
    assert ray.get(lb.acquire_server.remote(request_id="grpo-1", prompt_ids=p))[0] == "s2"
    # An unrelated prompt is placed by load, away from the busy holder.
    assert ray.get(lb.acquire_server.remote(request_id="other", prompt_ids=prompt(2)))[0] != "s2"
    d = ray.get(lb.acquire_server_detail.remote(request_id="grpo-2", prompt_ids=p))
    assert (
        d["server"] == "s2" and d["hit_blocks"][0] >= 24 and d["hittable_blocks"] == 31
    )  # the last token is never a cache hit
    status = ray.get(lb.get_status.remote())
    assert status["router"]["mode"] == "kvc_aware"
    assert status["router"]["collectors"]["push_events"]["stored_blocks"] == 24


def test_grpo_group_spreads_with_group_spread(ray_cluster, make_actor):
    """At the defaults (group_spread 0.1), told responses may reach 8,192
    tokens (response_tokens, as verl's hook sets it: over 4x this prompt),
    after one-request sessions, a GRPO group's samples (one prompt, new
    request ids) spread evenly over the servers: their lengths are
    correlated, so a group kept whole on one server would make it the
    step's straggler when the group is long."""
    ray = ray_cluster
    cfg = {"type": "kvc_aware", "config": {"response_tokens": 8192}}
    lb = make_actor(servers=dict(SERVERS), max_cache_size=10000, router_config=cfg)
    push_idle_metrics(ray, lb, SERVERS)
    # A history of one-request sessions (a GRPO step so far): the spread is
    # for one-request siblings, and a fresh router presumes multi-turn ones.
    for i in range(300):
        sid, _ = ray.get(lb.acquire_server.remote(request_id=f"warm-{i}", prompt_ids=prompt(1000 + i, 32)))
        ray.get(lb.release_server.remote(sid))
    p = prompt(11)
    ray.get(lb.update_kv_events.remote("s2", event_batch(block_stored(p[:384]))))
    got = [ray.get(lb.acquire_server.remote(request_id=f"g-{i}", prompt_ids=p))[0] for i in range(12)]
    assert got[0] == "s2"  # the first sample still goes to the prefix holder
    assert {s: got.count(s) for s in SERVERS} == {"s0": 4, "s1": 4, "s2": 4}
    # The decision view shows each candidate's placed siblings and the term.
    ray.get(lb.acquire_server.remote(request_id="g-12", prompt_ids=p))  # a 13th: s0 gets a 5th
    last = ray.get(lb.get_status.remote())["router"]["last_decision"]
    cands = {c["server"]: c for c in last["candidates"]}
    assert {s: c["siblings"] for s, c in cands.items()} == {"s0": 4, "s1": 4, "s2": 4}
    assert all("group_load" in {t["name"] for t in c["terms"]} for c in last["candidates"])
    assert last["decision"]["server"] == "s0"  # all even again: ties go to the first added


def test_group_with_a_long_prompt_spreads_like_the_rest(ray_cluster, make_actor):
    """group_spread's response-length gate reads the rollout's mean prompt
    (status prompt_tokens_mean), not each request's own: after a step of
    1,024-token prompts (8,192-token responses are 8x them), a group whose
    prompt is 4,096 tokens (2x its own) spreads like the others; kept whole,
    its samples, alike in length, would make one server the straggler."""
    ray = ray_cluster
    cfg = {"type": "kvc_aware", "config": {"response_tokens": 8192, "turns": "single"}}
    lb = make_actor(servers=dict(SERVERS), max_cache_size=10000, router_config=cfg)
    push_idle_metrics(ray, lb, SERVERS)
    for i in range(300):
        sid, _ = ray.get(lb.acquire_server.remote(request_id=f"warm-{i}", prompt_ids=prompt(1000 + i, 1024)))
        ray.get(lb.release_server.remote(sid))
    mean = ray.get(lb.get_status.remote())["router"]["prompt_tokens_mean"]
    assert mean == 1024, mean
    p = prompt(11, 4096)
    got = []
    for i in range(12):
        # Each released at once: no load tells the samples apart, only the
        # group's placed count (which a release does not undo) and the cache.
        sid, _ = ray.get(lb.acquire_server.remote(request_id=f"g-{i}", prompt_ids=p))
        ray.get(lb.release_server.remote(sid))
        got.append(sid)
    counts = {s: got.count(s) for s in SERVERS}
    assert max(counts.values()) <= 6 and min(counts.values()) >= 2, counts
    assert 1024 < ray.get(lb.get_status.remote())["router"]["prompt_tokens_mean"] < 4096


def test_agent_task_spreads_when_told_multi_turn(ray_cluster, make_actor):
    """At the defaults (task_spread 0.1) on a fresh router told the rollout
    is multi-turn (``turns: multi``, what verl's hook says for
    rollout.multi_turn.enable): an agent task's trajectories (one prompt, a
    request id each) spread over the servers instead of following the
    task's prefix holder, since a hard task's trajectories are long
    together; each trajectory's later turns stay where its first went."""
    ray = ray_cluster
    cfg = {"type": "kvc_aware", "config": {"turns": "multi"}}
    lb = make_actor(servers=dict(SERVERS), max_cache_size=10000, router_config=cfg)
    push_idle_metrics(ray, lb, SERVERS)
    p = prompt(12)
    ray.get(lb.update_kv_events.remote("s2", event_batch(block_stored(p[:384]))))
    got = [ray.get(lb.acquire_server.remote(request_id=f"traj-{i}", prompt_ids=p))[0] for i in range(6)]
    assert got[0] == "s2"  # the first trajectory goes to the prefix holder
    assert {s: got.count(s) for s in SERVERS} == {"s0": 2, "s1": 2, "s2": 2}, got
    # The decision view names the term: the last placement saw two siblings
    # on two servers and one on the third.
    last = ray.get(lb.get_status.remote())["router"]["last_decision"]
    assert sorted(c["siblings"] for c in last["candidates"]) == [1, 2, 2], last["candidates"]
    assert all("group_load" in {t["name"] for t in c["terms"]} for c in last["candidates"])
    # A trajectory's second turn (its context extends the task prompt) stays.
    for i, first in enumerate(got):
        assert ray.get(lb.acquire_server.remote(request_id=f"traj-{i}", prompt_ids=p + [7] * 64))[0] == first


@pytest.mark.parametrize("turns", [None, "single"])
def test_fresh_router_not_told_multi_turn_keeps_a_group(ray_cluster, make_actor, turns):
    """At the defaults, a fresh router not told the rollout is multi-turn
    (``turns`` auto, or single as verl's hook says for GRPO) places a
    prompt's requests exactly as with task_spread 0: with the prefix holder
    until load says otherwise, so a first GRPO step's groups stay whole."""
    ray = ray_cluster
    p = prompt(13)
    placed = []
    for strategies in (None, [{"_target_": "kvc_router.config.KVCAwareStrategyConfig", "task_spread": 0}]):
        inner: dict = {"turns": turns} if turns else {}
        if strategies:
            inner["strategies"] = strategies
        cfg = {"type": "kvc_aware", "config": inner}
        lb = make_actor(servers=dict(SERVERS), max_cache_size=10000, router_config=cfg)
        push_idle_metrics(ray, lb, SERVERS)
        ray.get(lb.update_kv_events.remote("s2", event_batch(block_stored(p[:384]))))
        placed.append([ray.get(lb.acquire_server.remote(request_id=f"g-{i}", prompt_ids=p))[0] for i in range(8)])
        got_turns = ray.get(lb.__ray_call__.remote(lambda self: self._config.effective["router"]["turns"]))
        assert got_turns == (turns or "auto")
        ray.kill(lb)
    assert placed[0] == placed[1], placed
    assert placed[0][:4] == ["s2"] * 4, placed[0]


def test_prompt_ids_containers(ray_cluster, kvc_lb_together):
    import array

    import numpy as np

    ray, lb = ray_cluster, kvc_lb_together
    p = prompt(3, 256)
    ray.get(lb.update_kv_events.remote("s1", event_batch(block_stored(p))))
    for i, form in enumerate(
        [p, tuple(p), array.array("i", p), np.asarray(p, dtype=np.int64), np.asarray(p, dtype=np.int32)]
    ):
        assert ray.get(lb.acquire_server.remote(request_id=f"c{i}", prompt_ids=form))[0] == "s1"


def test_overload_breaks_stickiness(ray_cluster, kvc_lb):
    ray, lb = ray_cluster, kvc_lb
    p = prompt(4)
    ray.get(lb.update_kv_events.remote("s1", event_batch(block_stored(p))))
    assert ray.get(lb.acquire_server.remote(request_id="conv", prompt_ids=p))[0] == "s1"
    assert ray.get(lb.acquire_server.remote(request_id="conv", prompt_ids=p))[0] == "s1"  # sticky
    # s1 saturates: full KV cache and a long queue.
    ray.get(lb.update_metrics.remote("s1", metrics_text(running=256, waiting=512, kv_usage=1.0)))
    moved = ray.get(lb.acquire_server.remote(request_id="conv", prompt_ids=p))[0]
    assert moved != "s1"
    router = ray.get(lb.get_status.remote())["router"]
    assert router["counters"]["sticky_broken"] == 1
    # get_status() explains the breakout stage by stage (kvctl explain prints it).
    last = router["last_decision"]
    assert last["request_id"] == "conv" and last["pool"] == ["s0", "s1", "s2"]
    assert last["session"]["bound"] == "s1" and last["session"]["rule"] == "breakout_overloaded"
    assert last["scored"] and last["decision"]["server"] == moved and last["decision"]["reason"] == "rebalanced"
    by_server = {c["server"]: c for c in last["candidates"]}
    terms = {t["name"]: t["value"] for t in by_server["s1"]["terms"]}
    assert terms["overload_penalty"] == -1 and terms["score"] == by_server["s1"]["score"]
    assert by_server[moved]["score"] == max(c["score"] for c in last["candidates"])
    # The new binding sticks.
    assert ray.get(lb.acquire_server.remote(request_id="conv", prompt_ids=p))[0] == moved


def test_default_mode_ignores_overload(ray_cluster, make_actor):
    ray = ray_cluster
    lb = make_actor(servers=dict(SERVERS), max_cache_size=10000, full_determinism=False)
    assert ray.get(lb.acquire_server.remote(request_id="conv"))[0] == "s0"
    ray.get(lb.update_metrics.remote("s0", metrics_text(running=256, waiting=512, kv_usage=1.0)))
    assert ray.get(lb.acquire_server.remote(request_id="conv", prompt_ids=[1, 2, 3]))[0] == "s0"


def test_removed_server_never_returned(ray_cluster, kvc_lb):
    ray, lb = ray_cluster, kvc_lb
    p = prompt(5)
    ray.get(lb.update_kv_events.remote("s2", event_batch(block_stored(p))))
    assert ray.get(lb.acquire_server.remote(request_id="bound", prompt_ids=p))[0] == "s2"
    ray.get(lb.remove_servers.remote(server_ids=["s2"]))
    got = ray.get([lb.acquire_server.remote(request_id=f"r{i % 7}", prompt_ids=p) for i in range(40)])
    got += ray.get([lb.acquire_server.remote(request_id="bound", prompt_ids=p) for _ in range(5)])
    assert {sid for sid, _ in got} <= {"s0", "s1"}
    assert ray.get(lb.update_kv_events.remote("s2", event_batch(block_stored(p)))) is False
    assert ray.get(lb.update_metrics.remote("s2", metrics_text())) is False
    assert "s2" not in ray.get(lb.get_status.remote())["servers"]


def test_reset_prefix_index(ray_cluster, kvc_lb):
    ray, lb = ray_cluster, kvc_lb
    p = prompt(6)
    ray.get(lb.update_kv_events.remote("s2", event_batch(block_stored(p))))
    ray.get(lb.reset_prefix_index.remote())
    d = ray.get(lb.acquire_server_detail.remote(request_id="after-reset", prompt_ids=p))
    assert d["hit_blocks"] == [0, 0, 0]
    assert d["server"] == "s0"


def test_malformed_pushes_keep_serving(ray_cluster, kvc_lb):
    ray, lb = ray_cluster, kvc_lb
    bad = [
        ("metrics", 'vllm:num_requests_running{engine="0" 3.0\n'),
        ("metrics", '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} abc\n'),
        ("events", b"\xc1\xc1\xc1"),
        ("events", b"\x93\x01"),  # truncated array
        ("events", event_batch(["BlockStored", [1, 2], None, [1] * 16, 16, None, "GPU"])[:-3]),
    ]
    for kind, payload in bad:
        call = (
            lb.update_metrics.remote("s0", payload) if kind == "metrics" else lb.update_kv_events.remote("s0", payload)
        )
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(call)
        assert isinstance(info.value, ValueError), info.value
        assert "s0" in str(info.value)
    assert ray.get(lb.acquire_server.remote(request_id="still-ok", prompt_ids=[1, 2, 3]))[0] in SERVERS


# ---------------------------------------------------------------------------
# Live collectors: HTTP /metrics polling and a ZMQ KV-event subscription.


class _MetricsHandler(http.server.BaseHTTPRequestHandler):
    body = metrics_text(running=1).encode()

    def do_GET(self):  # noqa: N802
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


UPSTREAM_BLOCK = {
    "router": {
        "type": "kvc_aware",
        "config": {
            "strategies": [
                {
                    "_target_": "verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig",
                    "alpha": 0.7,
                    "load_threshold": 0.9,
                    "layer_weights": {"gpu": 0.7, "cpu": 0.2, "ssd": 0.1},
                    "collector_names": ["vllm_polling"],
                    "weight": 1.0,
                }
            ],
            "sticky_max_size": 10000,
        },
    }
}


def _wait(pred, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    return pred()


def test_upstream_block_polls_metrics(ray_cluster, make_actor, metrics_server):
    ray = ray_cluster
    lb = make_actor(servers={metrics_server: None}, max_cache_size=10000, router_config=UPSTREAM_BLOCK)

    def scraped():
        st = ray.get(lb.get_status.remote())["router"]
        return st["servers"][0]["load"]["has_metrics"] and st

    st = _wait(scraped)
    assert st, "the vllm_polling collector never scraped the metrics server"
    assert st["servers"][0]["running"] == 1
    targets = st["collectors"]["collectors"]["vllm_metrics"]
    assert targets[0]["server"] == metrics_server and targets[0]["scrapes"] >= 1
    assert ray.get(lb.acquire_server.remote(request_id="r", prompt_ids=[1] * 32))[0] == metrics_server


def test_zmq_events_from_ray_handle(ray_cluster, make_actor):
    zmq = pytest.importorskip("zmq")
    ray = ray_cluster
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")

    @ray.remote(num_cpus=0)
    class FakeVLLMServer:
        def get_kv_events_endpoints(self):
            return [f"127.0.0.1:{port}", None, "zmq", "kv-event"]

    handle = FakeVLLMServer.remote()
    cfg = {
        "type": "kvc_aware",
        "config": {
            "strategies": [{"_target_": "kvc_router.config.KVCAwareStrategyConfig", "collector_names": ["vllm_zmq"]}],
        },
    }
    lb = make_actor(servers={"s0": None, "s1": handle}, max_cache_size=10000, router_config=cfg)
    push_idle_metrics(ray, lb, ["s0", "s1"])
    p = prompt(7)
    payload = event_batch(block_stored(p))
    seq = 0

    def applied():
        nonlocal seq
        pub.send_multipart([b"kv-event", struct.pack(">Q", seq), payload])
        seq += 1
        st = ray.get(lb.get_status.remote())["router"]
        subs = st["collectors"]["collectors"].get("vllm_zmq") or []
        return any(s["events"]["stored_blocks"] > 0 for s in subs) and subs

    try:
        subs = _wait(applied)
        assert subs, "the vllm_zmq collector never applied a published batch"
        assert subs[0]["server"] == "s1" and subs[0]["endpoint"] == f"tcp://127.0.0.1:{port}"
        push_idle_metrics(ray, lb, ["s0", "s1"])
        assert ray.get(lb.acquire_server.remote(request_id="z", prompt_ids=p))[0] == "s1"
    finally:
        ray.kill(lb)
        pub.close(linger=0)
        ray.kill(handle)
