"""The router's metrics in Ray's Prometheus export (kvc_router.metrics).

The end-to-end tests route through a real balancer actor on the session's
local Ray, read the node metrics agent's Prometheus text over HTTP on
loopback and find the metrics with the values ``get_status()`` reports
(polled: Ray's export lags a few seconds)."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import pytest
from kvc_harness import HOST, procs, wire
from kvc_router import KVCAwareBalancer, load_router_config
from kvc_router import metrics as km
from kvc_router.errors import ConfigError

PROMPT = list(range(1, 513))  # 32 blocks of 16
PROMPT_B = list(range(10_001, 10_513))
PROMPT_C = list(range(20_001, 20_513))


def _cfg(**metrics: Any) -> Dict[str, Any]:
    c: Dict[str, Any] = {"strategies": [{"name": "kvc_aware", "collector_names": []}]}
    if metrics:
        c["metrics"] = metrics
    return {"type": "kvc_aware", "config": c}


# --------------------------------------------------------------------------
# Configuration


def test_metrics_config_defaults_and_keys():
    m = load_router_config("kvc_aware").metrics
    assert (m.enabled, m.period_s, m.max_server_labels) == (None, 5.0, 64)
    m = load_router_config(_cfg(enabled=False, period_s=0.5, max_server_labels=3)).metrics
    assert (m.enabled, m.period_s, m.max_server_labels) == (False, 0.5, 3)
    assert load_router_config({"type": "kvc_aware", "config": {"metrics": False}}).metrics.enabled is False


@pytest.mark.parametrize(
    "metrics, key",
    [
        ({"period_s": 0}, "router.config.metrics.period_s"),
        ({"period_s": "5"}, "router.config.metrics.period_s"),
        ({"enabled": "yes"}, "router.config.metrics.enabled"),
        ({"max_server_labels": 0}, "router.config.metrics.max_server_labels"),
        ({"port": 9090}, "router.config.metrics.port"),
        ("on", "router.config.metrics"),
    ],
)
def test_metrics_config_errors_name_the_key(metrics, key):
    with pytest.raises(ConfigError) as e:
        load_router_config({"router": {"type": "kvc_aware", "config": {"metrics": metrics}}})
    assert e.value.key == key, (e.value.key, str(e.value))


def test_no_exporter_outside_ray_actors():
    with KVCAwareBalancer({"s0": None}, router_config="kvc_aware") as lb:
        assert lb._metrics is None


# --------------------------------------------------------------------------
# Flattening a status (the real library's)


def _by_key(ss) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    return km.merge(ss)


def test_samples_match_status_and_names_follow_conventions():
    with KVCAwareBalancer({"s0": None, "s1": None}, router_config="kvc_aware") as lb:
        # Two prompts, so the sessions split evenly and r0's next turn stays
        # (sessions piled on one server would move: router.session_moves).
        for i in range(6):
            lb.acquire_server(f"r{i}", PROMPT if i % 2 == 0 else PROMPT_B)
        lb.acquire_server("r0", PROMPT)  # sticky
        lb.release_server("s0")
        st = lb.get_status()
    c = st["router"]["counters"]
    got = _by_key(km.samples(st, lambda s: s))
    assert got[("acquires_total", ())] == c["acquires"] == 7
    assert got[("releases_total", ())] == 1
    assert got[("decisions_total", (("reason", "sticky"),))] == c["sticky_hits"] >= 1
    assert got[("credited_prefix_tokens_total", (("tier", "gpu"),))] == c["predicted_hit_tokens_gpu"] > 0
    assert sum(got[("credited_prefix_tokens_total", (("tier", t),))] for t in km.TIERS) == c["predicted_hit_tokens"]
    lat = st["router"]["decision_seconds"]
    assert got[("decision_seconds_bucket_total", (("le", "+Inf"),))] == lat["count"] == 7
    buckets = [v for (n, lab), v in got.items() if n == "decision_seconds_bucket_total"]
    assert len(buckets) == len(lat["le"]) + 1
    for sid, n in st["servers"].items():
        assert got[("server_inflight", (("server", sid),))] == n
    assert got[("index_entries", ())] == st["router"]["index"]["entries"] > 0
    # The running mean of the prompts placed, which group_spread_min_ratio reads.
    mean = round((4 * len(PROMPT) + 3 * len(PROMPT_B)) / 7)
    assert got[("prompt_tokens_mean", ())] == st["router"]["prompt_tokens_mean"] == mean, (mean, st["router"])
    for name, spec in km.SPECS.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name)
        # Counters end in _total; base units (seconds, bytes, ratio) in the name.
        assert (spec.kind == "counter") == name.endswith("_total"), name
        assert not re.search(r"_(ms|milliseconds|percent|kb|mb)(_|$)", name), name


def test_server_labels_are_bounded():
    ids = [f"s{i}" for i in range(5)]
    with KVCAwareBalancer(dict.fromkeys(ids), router_config="kvc_aware") as lb:
        for i in range(10):
            lb.acquire_server(f"r{i}", [i] * 64)
        st = lb.get_status()
    ex = km.Exporter(lambda: st, km.MetricsConfig(max_server_labels=2))
    got = _by_key(km.samples(st, ex.server_label))
    labels = {dict(lab)["server"] for (n, lab) in got if n == "server_inflight"}
    assert labels == {"s0", "s1", km.OTHER}
    assert got[("server_inflight", (("server", km.OTHER),))] == sum(st["servers"][s] for s in ids[2:])
    assert sum(v for (n, _), v in got.items() if n == "server_inflight") == st["total_inflight"] == 10


def test_samples_of_a_live_kv_event_subscription():
    """A real vllm_zmq subscription (pyzmq publishing vLLM's frames on
    loopback): batches, events, gaps and connected per server, from the
    collector's own status shape."""
    import struct

    import zmq
    from kvc_harness.balancer import kvc_config, publisher_status

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port(f"tcp://{HOST}")
    topic = b"kv@model"
    ep = f"tcp://{HOST}:{port}"
    cfg = kvc_config(endpoints={"s0": [{"endpoint": ep}]}, collectors=("vllm_zmq",))
    try:
        with KVCAwareBalancer({"s0": None, "s1": None}, router_config=cfg) as lb:

            def send(seq: int, first: int) -> None:
                payload = wire.event_batch(wire.block_stored(list(range(first, first + 64))))
                pub.send_multipart([topic, struct.pack(">Q", seq), payload])

            # The subscription joins asynchronously: publish until one lands.
            procs.wait_for(
                lambda: send(0, 1) or publisher_status(lb.get_status(), "s0").get("events", {}).get("batches"),
                10,
                "first KV-event batch applied",
                interval=0.1,
            )
            st = lb.get_status()
            seq0 = publisher_status(st, "s0")["last_seq"]
            send(seq0 + 2, 5000)  # seq0 + 1 never sent: a gap
            procs.wait_for(lambda: publisher_status(lb.get_status(), "s0").get("gaps"), 10, "the gap seen", 0.05)
            st = lb.get_status()
    finally:
        pub.close(linger=0)
        ctx.term()
    p = publisher_status(st, "s0")
    got = _by_key(km.samples(st))
    labels = (("_pub", ep), ("server", "s0"), ("source", "zmq"))
    assert got[("kv_event_batches_total", labels)] == p["events"]["batches"] >= 2
    assert got[("kv_events_total", labels)] == p["events"]["events"]
    assert got[("kv_event_decode_errors_total", labels)] == p["events"]["decode_errors"] == 0
    assert got[("kv_event_gaps_total", (("_pub", ep), ("server", "s0")))] == p["gaps"] >= 1
    assert got[("kv_event_connected", (("server", "s0"),))] == 1.0
    assert not [k for k in got if k[0].startswith("kv_event") and ("server", "s1") in k[1]]


def test_admission_queue_is_exported_when_status_has_one():
    with KVCAwareBalancer({"s0": None}, router_config="kvc_aware") as lb:
        lb.acquire_server("r", PROMPT)
        st = lb.get_status()
    adm = st["router"]["admission"]
    got = _by_key(km.samples(st, lambda s: s))
    for k, v in adm.items():
        assert got[(f"admission_{k}", ())] == float(v), k
        assert km.spec_of(f"admission_{k}").kind == ("counter" if k.endswith("_total") else "gauge")
    # A field the exporter does not know yet still goes out, typed by its name.
    st["router"]["admission"] = {"held": 3, "timeouts_total": 2, "policy": "fifo"}
    got = _by_key(km.samples(st, lambda s: s))
    assert got[("admission_held", ())] == 3 and got[("admission_timeouts_total", ())] == 2
    assert km.spec_of("admission_timeouts_total").kind == "counter"
    assert not [n for n, _ in got if n == "admission_policy"]


def test_length_learning_is_exported_only_when_on():
    cfg = _cfg()
    cfg["config"]["lengths"] = {"enabled": True}
    with KVCAwareBalancer({"s0": None}, router_config=cfg) as lb:
        for rid, prompt, n in (("a", PROMPT, 40), ("b", PROMPT_B, "x")):
            sid, _ = lb.acquire_server(rid, prompt)
            lb.release_server(sid, request_id=rid, output_tokens=n)
        lb.release_server("s0", request_id="ghost", output_tokens=3)  # never routed
        st = lb.get_status()
    got = _by_key(km.samples(st, lambda s: s))
    assert got[("lengths_observed_tokens_total", ())] == 1 and got[("bad_output_tokens_total", ())] == 1
    assert got[("lengths_unmatched_releases_total", ())] == 1 and got[("lengths_prompts", ())] == 1
    # No KV events here: nothing is read off them.
    assert got[("lengths_observed_from_events_total", ())] == 0
    # "b" (a bad count) taught its acquire-to-release time, or nothing at 0 ms.
    assert got[("lengths_observed_durations_total", ())] == st["router"]["lengths"]["observed_durations"] <= 1
    # The defaults run a correlation-only learner (group_spread_min_corr):
    # exported, with the correlation absent until a step is measured.
    with KVCAwareBalancer({"s0": None}, router_config=_cfg()) as lb:
        dflt = _by_key(km.samples(lb.get_status(), lambda s: s))
    assert dflt[("lengths_prompts", ())] == 0 and ("lengths_corr", ()) not in dflt
    off_cfg = _cfg()
    off_cfg["config"]["strategies"][0]["group_spread"] = 0
    off_cfg["config"]["strategies"][0]["task_spread"] = 0
    with KVCAwareBalancer({"s0": None}, router_config=off_cfg) as lb:
        off = _by_key(km.samples(lb.get_status(), lambda s: s))
    assert not [n for n, _ in off if n.startswith("lengths_") or n == "bad_output_tokens_total"]


# --------------------------------------------------------------------------
# End to end: Ray's Prometheus export


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(port: int) -> List[Tuple[str, Dict[str, str], float]]:
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1).startswith("ray_kvc_router_"):
            out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


OWN_LABELS = ("server", "tier", "reason", "le", "cause", "source")


def exported(port: int, worker: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """This actor's kvc_router series, keyed like km.merge (no prefix/suffix, no Ray labels)."""
    out = {}
    for name, labels, v in scrape(port):
        if labels.get("WorkerId") != worker:
            continue
        own = tuple(sorted((k, lab) for k, lab in labels.items() if k in OWN_LABELS))
        out[(name[len("ray_kvc_router_") :], own)] = v
    return out


#: Gauges that change with time alone (age, freshness and the load estimate
#: built on it, goroutines): a later snapshot legitimately differs.
VOLATILE = {"server_metrics_age_seconds", "server_metrics_fresh", "server_load", "goroutines"}


def expected(status: Dict[str, Any]) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """What the export must show for this status: every sample but the
    VOLATILE ones, with counters that never moved absent (Ray exports a
    counter on its first increment)."""
    exp: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
    for (name, labels), v in km.merge(km.samples(status)).items():
        key = (name, tuple(kv for kv in labels if not kv[0].startswith("_")))
        exp[key] = exp.get(key, 0.0) + v
    return {
        k: v for k, v in exp.items() if k[0] not in VOLATILE and not (km.spec_of(k[0]).kind == "counter" and v == 0)
    }


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def wait_matching(port: int, worker: str, want: Dict, timeout: float = 60.0) -> Dict:
    deadline = time.monotonic() + timeout
    diff: Dict = {}
    while time.monotonic() < deadline:
        try:
            got = exported(port, worker)
        except OSError:
            got = {}
        diff = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) is None or not _close(got[k], v)}
        if not diff:
            return got
        time.sleep(0.5)
    raise AssertionError(f"Ray's export did not match get_status() within {timeout}s: (want, got) {diff}")


def _actor_attr(ray, actor, fn):
    return ray.get(actor.__ray_call__.remote(fn), timeout=30)


@pytest.mark.slow
def test_ray_prometheus_export_matches_status(ray_cluster, make_actor):
    ray = ray_cluster
    port = procs.RAY_METRICS_PORT
    assert port, "start_ray sets the metrics export port"
    lb = make_actor(servers={"s0": None, "s1": None, "s2": None}, router_config=_cfg(period_s=0.3))
    worker = _actor_attr(ray, lb, lambda self: __import__("ray").get_runtime_context().get_worker_id())
    assert _actor_attr(ray, lb, lambda self: self._metrics is not None)

    # Phase 1: decisions (scored, sticky), releases, a pushed scrape, a pushed KV-event batch.
    for i in range(8):  # three prompts: the sessions split evenly, so r0's next turn stays
        ray.get(lb.acquire_server.remote(f"r{i}", (PROMPT, PROMPT_B, PROMPT_C)[i % 3]))
    ray.get(lb.acquire_server.remote("r0", PROMPT))
    ray.get(lb.release_server.remote("s0"))
    assert ray.get(lb.update_metrics.remote("s0", wire.metrics_text(running=3, waiting=1, kv_usage=0.25)))
    batch = wire.event_batch(wire.block_stored(list(range(1000, 1064)), medium="GPU"))
    assert ray.get(lb.update_kv_events.remote("s1", batch))
    st = ray.get(lb.get_status.remote())
    c = st["router"]["counters"]
    assert c["acquires"] == 9 and c["sticky_hits"] >= 1 and c["predicted_hit_tokens_gpu"] > 0
    want = expected(st)
    got = wait_matching(port, worker, want)
    assert got[("acquires_total", ())] == 9
    assert got[("decision_seconds_bucket_total", (("le", "+Inf"),))] == st["router"]["decision_seconds"]["count"]
    assert got[("server_running", (("server", "s0"),))] == 3
    assert got[("server_kv_cache_usage_ratio", (("server", "s0"),))] == 0.25
    assert got[("kv_event_batches_total", (("server", ""), ("source", "push")))] == 1
    assert got[("server_metrics_age_seconds", (("server", "s0"),))] >= 0
    assert got[("goroutines", ())] >= 1

    # Phase 2: counters add only the increase; a removed server's gauges drop to 0.
    for i in range(8, 12):
        ray.get(lb.acquire_server.remote(f"r{i}", PROMPT))
    ray.get(lb.remove_servers.remote(["s2"]))
    st2 = ray.get(lb.get_status.remote())
    want2 = expected(st2)
    want2[("server_inflight", (("server", "s2"),))] = 0.0
    got2 = wait_matching(port, worker, want2)
    assert got2[("acquires_total", ())] == 13
    assert "s2" not in st2["servers"]


@pytest.mark.slow
def test_folded_servers_count_once_when_one_leaves(ray_cluster, make_actor):
    """With one own server label, s1 and s2 share _other; s2 leaving must
    not make s1's scrapes look new (increases are taken per server)."""
    ray = ray_cluster
    port = procs.RAY_METRICS_PORT
    lb = make_actor(servers={"s0": None, "s1": None, "s2": None}, router_config=_cfg(period_s=0.2, max_server_labels=1))
    worker = _actor_attr(ray, lb, lambda self: __import__("ray").get_runtime_context().get_worker_id())
    text = wire.metrics_text(running=1)
    for sid, n in (("s0", 1), ("s1", 2), ("s2", 3)):
        for _ in range(n):
            assert ray.get(lb.update_metrics.remote(sid, text))
    other = ("server_scrapes_total", (("server", km.OTHER),))
    wait_matching(port, worker, {other: 5.0, ("server_scrapes_total", (("server", "s0"),)): 1.0})
    ray.get(lb.remove_servers.remote(["s2"]))
    assert ray.get(lb.update_metrics.remote("s1", text))
    k = _actor_attr(ray, lb, lambda self: self._metrics.exports)
    assert _wait_exports(ray, lb, k + 2) is not None, "no export after the removal"  # the removal is exported
    got = wait_matching(port, worker, {other: 6.0})
    assert ("server_scrapes_total", (("server", "s2"),)) not in got


def test_metrics_off_switch(ray_cluster, make_actor):
    lb = make_actor(servers={"s0": None}, router_config=_cfg(enabled=False))
    ray_cluster.get(lb.acquire_server.remote("r", PROMPT))
    assert _actor_attr(ray_cluster, lb, lambda self: self._metrics is None)


def _wait_exports(ray, lb, n: int, timeout: float = 30.0) -> Optional[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        k = _actor_attr(ray, lb, lambda self: self._metrics.exports)
        if k >= n:
            return k
        time.sleep(0.2)
    return None


def test_exporter_runs_periodically_and_stops_on_close(ray_cluster, make_actor):
    ray = ray_cluster
    lb = make_actor(servers={"s0": None}, router_config=_cfg(period_s=0.1))
    assert _wait_exports(ray, lb, 3) is not None
    alive = _actor_attr(ray, lb, lambda self: (self.close(), self._metrics._thread.is_alive())[1])
    assert alive is False
    assert _actor_attr(ray, lb, lambda self: self._metrics.errors) == 0


def test_grafana_dashboard_uses_only_exported_metrics():
    """docs/grafana-kvc-router.json parses, and every series it queries is
    one the exporter records (Ray adds the ray_ prefix)."""
    import json
    import os

    from kvc_harness import REPO

    with open(os.path.join(REPO, "docs", "grafana-kvc-router.json")) as f:
        dash = json.load(f)
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert exprs and all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    used = set()
    for e in exprs:
        assert e.count("(") == e.count(")"), e
        for name in re.findall(r"\bray_kvc_router_([a-z0-9_]+)", e):
            used.add(name)
    assert used and used <= set(km.SPECS), used - set(km.SPECS)
    # The panels cover the metric families the issue lists.
    for want in (
        "decisions_total",
        "decision_seconds_bucket_total",
        "credited_prefix_tokens_total",
        "sticky_breaks_total",
        "index_evictions_total",
        "kv_event_gaps_total",
        "kv_event_decode_errors_total",
        "server_healthy",
        "server_inflight",
        "admission_held",
    ):
        assert want in used, want


class _FakeMetric:
    """Stands in for a ray.util.metrics Counter/Gauge: records tags."""

    def __init__(self, seen: set) -> None:
        self.seen = seen

    def inc(self, v: float, tags=None) -> None:
        self.seen.update((tags or {}).items())

    def set(self, v: float, tags=None) -> None:
        self.seen.update((tags or {}).items())


def _fake_exporter(max_labels: int):
    seen: set = set()
    ex = km.Exporter(lambda: {}, km.MetricsConfig(max_server_labels=max_labels))
    ex._metric = lambda name: _FakeMetric(seen)  # no Ray needed to see the exported tags
    return ex, seen


def _pool_status(ids) -> dict:
    return {"router": {"servers": [{"id": s, "load": {"inflight": 1}} for s in ids]}}


def test_server_label_values_are_ascii_and_bounded():
    """Issue 29 row 14/15: one id with a non-ASCII character stopped every
    metric (Ray encodes label values as ASCII); a 70 KB id was exported
    verbatim. Exported values are printable ASCII of at most 64 chars, and
    distinct ids keep distinct values."""
    ids = ["10.0.0.1:8000", "serveur-é:8000", "サーバー:1", "x" * 70_000, "x" * 69_999 + "y", "a b\n"]
    ex, seen = _fake_exporter(max_labels=64)
    ex.export_once(_pool_status(ids))
    values = {v for k, v in seen if k == "server"}
    assert len(values) == len(ids)
    assert "10.0.0.1:8000" in values  # plain ids unchanged
    for v in values:
        assert v.isascii() and v.isprintable() and " " not in v and 0 < len(v) <= 64, repr(v[:80])


def test_server_labels_follow_pool_churn():
    """Issue 29 row 15: labels went to the first 64 ids ever seen and were
    never pruned: after churn every live server was _other and the label map
    grew without bound. Freed slots go to live servers; the map follows the
    pool."""
    ex, seen = _fake_exporter(max_labels=2)
    for gen in range(200):
        ex.export_once(_pool_status([f"g{gen}-a", f"g{gen}-b", f"g{gen}-c"]))
    seen.clear()
    ex.export_once(_pool_status(["g199-a", "g199-b", "g199-c"]))
    values = {v for k, v in seen if k == "server"}
    assert values == {"g199-a", "g199-b", km.OTHER}
    assert len(ex._labels) <= 3
