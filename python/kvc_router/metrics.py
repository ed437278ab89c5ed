"""The router's metrics in Ray's Prometheus export (``ray.util.metrics``).

When :class:`~kvc_router.KVCAwareBalancer` runs as a Ray actor, a daemon
thread takes a snapshot of ``get_status()`` every ``period_s`` seconds and
records it with Ray's metric API; every node's metrics agent then serves it
in Prometheus format (with Ray's ``ray_`` prefix, e.g.
``ray_kvc_router_acquires_total``). Nothing runs on the acquire path: the
cost is one status call and a few hundred metric records per period.

* Counters are cumulative in the status; each snapshot adds the increase
  since the previous one (a value that went down -- a server re-added, a
  reset -- counts from zero again).
* Decision latency comes from the library's fixed-bucket histogram
  (``decision_seconds`` in the status) as Prometheus' classic histogram
  layout -- a ``le``-labelled counter of decisions at most that slow, ``+Inf``
  included, plus the total seconds -- because Ray's ``Histogram`` takes one
  call per observation, which would put a per-decision cost back.
  ``histogram_quantile(0.99, sum by (le) (rate(ray_kvc_router_decision_seconds_bucket_total[5m])))``
  reads it.
* ``server`` labels are bounded: at most ``max_server_labels`` live server
  ids keep their own label value, others share ``_other`` (summed); a
  removed server's gauges go to 0 and its slot goes to a live server.
  Label values are printable ASCII of at most 64 characters (longer or
  non-ASCII ids keep a prefix and a hash suffix; see :func:`label_value`).

Configuration: ``router.config.metrics`` (:class:`MetricsConfig`) --
``enabled`` (default: on inside a Ray actor, off elsewhere), ``period_s``
(default 5), ``max_server_labels`` (default 64). ``KVC_ROUTER_METRICS=0`` in
the actor's environment turns it off whatever the config says.

See docs/observability.md for the metric list and the Grafana dashboard.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from .config import MetricsConfig

logger = logging.getLogger("kvc_router")

PREFIX = "kvc_router_"
OTHER = "_other"
TIERS = ("gpu", "cpu", "ssd")
#: Decision reasons and the status counter that counts each.
REASONS = {
    "sticky": "sticky_hits",
    "scored": "scored",
    "rebalanced": "sticky_broken",
    "pinned": "pinned",
    "no_servers": "no_servers",
    "rejected": "rejected",
}


def in_ray_actor() -> bool:
    """True inside a Ray actor process (Ray imported and an actor id set)."""
    import sys

    if "ray" not in sys.modules:
        return False
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001 - any Ray trouble means "not an actor"
        return False


def wanted(cfg: MetricsConfig) -> bool:
    if os.environ.get("KVC_ROUTER_METRICS", "").strip().lower() in ("0", "false", "off", "no"):
        return False
    return in_ray_actor() if cfg.enabled is None else cfg.enabled


# --------------------------------------------------------------------------
# What the status says, as flat samples


@dataclass(frozen=True)
class Spec:
    """One metric: kind is "counter" or "gauge"; labels its tag keys."""

    kind: str
    help: str
    labels: Tuple[str, ...] = ()


SPECS: Dict[str, Spec] = {
    # decisions
    "acquires_total": Spec("counter", "acquire_server calls that reached the router"),
    "releases_total": Spec("counter", "release_server calls for a pool member"),
    "decisions_total": Spec("counter", "routing decisions by reason", ("reason",)),
    "sticky_hits_total": Spec("counter", "requests routed to their sticky server"),
    "sticky_breaks_total": Spec("counter", "sticky bindings broken because the bound server was overloaded"),
    "sticky_stale_total": Spec("counter", "sticky bindings dropped because their server left the pool"),
    "sticky_bindings": Spec("gauge", "live sticky bindings (request id -> server)"),
    "decision_seconds_total": Spec("counter", "time spent deciding (the library's acquire, lock wait included)"),
    "decision_seconds_bucket_total": Spec(
        "counter", "decisions that took at most le seconds (cumulative buckets; le=+Inf counts all)", ("le",)
    ),
    "prompt_tokens_total": Spec("counter", "prompt tokens routed"),
    "credited_prefix_tokens_total": Spec(
        "counter", "prompt tokens predicted to hit a cached prefix on the chosen server, by tier", ("tier",)
    ),
    "client_batches_total": Spec("counter", "route_batch calls (client-side batching)"),
    # pool and load
    "servers": Spec("gauge", "servers in the pool"),
    "inflight": Spec("gauge", "requests in flight over all servers"),
    "prompt_tokens_mean": Spec(
        "gauge",
        "running mean prompt length of the requests placed: the rollout's typical prompt, "
        "which group_spread_min_ratio compares response_tokens with",
    ),
    "server_inflight": Spec("gauge", "requests in flight per server", ("server",)),
    "server_inflight_tokens": Spec("gauge", "prompt tokens in flight per server", ("server",)),
    "server_load": Spec("gauge", "the router's load estimate per server (0..1 of capacity)", ("server",)),
    "server_running": Spec("gauge", "running requests the server reported", ("server",)),
    "server_waiting": Spec("gauge", "waiting requests the server reported", ("server",)),
    "server_kv_cache_usage_ratio": Spec("gauge", "KV-cache usage the server reported (0..1)", ("server",)),
    # metrics scraping
    "server_healthy": Spec("gauge", "1 when the router considers the server healthy", ("server",)),
    "server_metrics_fresh": Spec("gauge", "1 when the server's load metrics are fresh", ("server",)),
    "server_metrics_age_seconds": Spec("gauge", "age of the server's last load metrics", ("server",)),
    "server_scrape_failures": Spec("gauge", "consecutive failed metrics scrapes", ("server",)),
    "server_scrapes_total": Spec("counter", "metrics scrapes (pull or push)", ("server",)),
    "server_scrape_errors_total": Spec("counter", "failed metrics scrapes", ("server",)),
    # prefix index
    "index_entries": Spec("gauge", "block residency entries in the prefix index"),
    "index_keys": Spec("gauge", "distinct block keys in the prefix index"),
    "index_max_entries": Spec("gauge", "the prefix index's entry budget"),
    "index_bytes": Spec("gauge", "estimated memory of the prefix index"),
    "index_evictions_total": Spec("counter", "prefix index entries evicted, by cause", ("cause",)),
    "index_server_entries": Spec("gauge", "prefix index entries per server", ("server",)),
    # KV events
    "kv_event_batches_total": Spec("counter", "KV-event batches applied", ("server", "source")),
    "kv_events_total": Spec("counter", "KV events applied", ("server", "source")),
    "kv_event_gaps_total": Spec("counter", "KV-event sequence gaps seen", ("server",)),
    "kv_event_decode_errors_total": Spec("counter", "KV-event payloads that failed to decode", ("server", "source")),
    "kv_event_apply_errors_total": Spec("counter", "KV-event batches the index rejected", ("server", "source")),
    "kv_event_connected": Spec("gauge", "KV-event subscriptions connected per server", ("server",)),
    # admission queue (router.admission; kept when the status has it)
    "admission_enabled": Spec("gauge", "1 when router-side admission holds requests for a full pool"),
    "admission_held": Spec("gauge", "requests held in the admission queue now"),
    "admission_max_held": Spec("gauge", "most requests ever held at once"),
    "admission_queued_total": Spec("counter", "requests that waited in the admission queue"),
    "admission_admitted_total": Spec("counter", "held requests admitted to a server"),
    "admission_cancelled_total": Spec("counter", "held requests cancelled by their caller"),
    "admission_rejected_total": Spec("counter", "requests refused because the admission queue was full"),
    "admission_group_spread_total": Spec(
        "counter", "held groups a freed slot passed over: the group had more on that server than on another"
    ),
    # response-length learning (router.lengths; only when it is on)
    "lengths_observed_tokens_total": Spec("counter", "releases that taught a response length (output tokens)"),
    "lengths_observed_from_events_total": Spec("counter", "releases without a count that read it off KV events"),
    "lengths_observed_durations_total": Spec("counter", "releases that taught an acquire-to-release time"),
    "lengths_unmatched_releases_total": Spec("counter", "releases naming a request the router did not route"),
    "lengths_prompts": Spec("gauge", "prompts with a learnt response length"),
    "lengths_corr": Spec("gauge", "within-prompt correlation of log response lengths over the last measured step"),
    "lengths_longest_first_gated": Spec(
        "gauge", "1 while lengths.min_corr keeps longest-first admission closed (no alike samples measured)"
    ),
    "lengths_predicted_tokens": Spec(
        "gauge", "output predicted for the requests in flight per server (kvc_aware's work_weight)", ("server",)
    ),
    "bad_output_tokens_total": Spec("counter", "releases whose output_tokens was not a count (released without it)"),
    # health of the library
    "panics_total": Spec("counter", "panics recovered at the C boundary"),
    "collector_panics_total": Spec("counter", "panics recovered in collector goroutines (which restarted)"),
    "memory_returns_total": Spec("counter", "memory returned to the OS after a large input"),
    "ignored_invalid_ids_total": Spec("counter", "releases and lookups of ids no server can have (no-ops)"),
    "pool_change_retries_total": Spec("counter", "acquires routed again: their server was removed meanwhile"),
    "goroutines": Spec("gauge", "goroutines in the library"),
}
SERVER_GAUGES = tuple(n for n, s in SPECS.items() if s.kind == "gauge" and "server" in s.labels)


Sample = Tuple[str, Tuple[Tuple[str, str], ...], float]


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float(bool(v))


def samples(status: Mapping[str, Any], server_label: Callable[[str], str] = str) -> List[Sample]:
    """Flattens one ``get_status()`` into ``(name, labels, value)``. Labels
    starting with ``_`` identify a source within a series (a KV-event
    publisher: one per data-parallel rank) and are never exported; samples
    with the same name and labels are summed by :func:`merge`."""
    out: List[Sample] = []

    def add(name: str, value: Any, **labels: str) -> None:
        out.append((name, tuple(sorted(labels.items())), _num(value)))

    r = status.get("router") or {}
    c = r.get("counters") or {}
    add("acquires_total", c.get("acquires", 0))
    add("releases_total", c.get("releases", 0))
    for reason, key in REASONS.items():
        add("decisions_total", c.get(key, 0), reason=reason)
    add("sticky_hits_total", c.get("sticky_hits", 0))
    add("sticky_breaks_total", c.get("sticky_broken", 0))
    add("sticky_stale_total", c.get("sticky_stale", 0))
    add("sticky_bindings", r.get("sticky_size", 0))
    add("prompt_tokens_total", c.get("prompt_tokens", 0))
    for tier in TIERS:
        add("credited_prefix_tokens_total", c.get(f"predicted_hit_tokens_{tier}", 0), tier=tier)
    lat = r.get("decision_seconds") or {}
    if lat:
        add("decision_seconds_total", lat.get("sum", 0.0))
        for le, n in zip(lat.get("le", ()), lat.get("buckets", ())):
            add("decision_seconds_bucket_total", n, le=_le(le))
        add("decision_seconds_bucket_total", lat.get("count", 0), le="+Inf")
    add("client_batches_total", (r.get("client_batches") or {}).get("calls", 0))

    add("servers", status.get("active_servers", 0))
    add("inflight", status.get("total_inflight", 0))
    add("prompt_tokens_mean", r.get("prompt_tokens_mean", 0))
    for s in r.get("servers") or ():
        sid = server_label(s["id"])
        ld = s.get("load") or {}
        add("server_inflight", ld.get("inflight", 0), server=sid)
        add("server_inflight_tokens", ld.get("inflight_tokens", 0), server=sid)
        add("server_load", ld.get("load", 0.0), server=sid)
        add("server_running", s.get("running", 0), server=sid)
        add("server_waiting", s.get("waiting", 0), server=sid)
        add("server_kv_cache_usage_ratio", s.get("kv_cache_usage", 0.0), server=sid)
        add("server_healthy", ld.get("healthy", False), server=sid)
        add("server_metrics_fresh", ld.get("fresh", False), server=sid)
        add("server_metrics_age_seconds", ld.get("metrics_age_ms", 0) / 1000.0, server=sid)
        add("server_scrape_failures", ld.get("consecutive_failures", 0), server=sid)
        add("server_scrapes_total", ld.get("scrapes", 0), server=sid)
        add("server_scrape_errors_total", ld.get("errors", 0), server=sid)

    ix = r.get("index") or {}
    add("index_entries", ix.get("entries", 0))
    add("index_keys", ix.get("keys", 0))
    add("index_max_entries", ix.get("max_entries", 0))
    add("index_bytes", ix.get("bytes_estimate", 0))
    add("index_evictions_total", ix.get("evicted_budget", 0), cause="budget")
    add("index_evictions_total", ix.get("evicted_capacity", 0), cause="capacity")
    for s in ix.get("servers") or ():
        add("index_server_entries", s.get("entries", 0), server=server_label(s["name"]))

    col = r.get("collectors") or {}
    push = col.get("push_events") or {}
    add("kv_event_batches_total", push.get("batches", 0), server="", source="push")
    add("kv_events_total", push.get("events", 0), server="", source="push")
    add("kv_event_decode_errors_total", push.get("decode_errors", 0), server="", source="push")
    add("kv_event_apply_errors_total", push.get("apply_errors", 0), server="", source="push")
    for pub in (col.get("collectors") or {}).get("vllm_zmq") or ():
        if not isinstance(pub, Mapping) or "server" not in pub:
            continue
        sid = server_label(pub["server"])
        ep = str(pub.get("endpoint", ""))
        ev = pub.get("events") or {}
        add("kv_event_batches_total", ev.get("batches", 0), server=sid, source="zmq", _pub=ep)
        add("kv_events_total", ev.get("events", 0), server=sid, source="zmq", _pub=ep)
        add("kv_event_decode_errors_total", ev.get("decode_errors", 0), server=sid, source="zmq", _pub=ep)
        add("kv_event_apply_errors_total", ev.get("apply_errors", 0), server=sid, source="zmq", _pub=ep)
        add("kv_event_gaps_total", pub.get("gaps", 0), server=sid, _pub=ep)
        add("kv_event_connected", pub.get("connected", False), server=sid)

    add("panics_total", r.get("panics", 0))
    add("collector_panics_total", col.get("panics", 0))
    add("memory_returns_total", (col.get("memory") or {}).get("trims", 0))
    add("ignored_invalid_ids_total", r.get("ignored_invalid_ids", 0))
    add("pool_change_retries_total", r.get("pool_change_retries", 0))
    add("goroutines", r.get("goroutines", 0))
    lens = r.get("lengths")
    if isinstance(lens, Mapping):
        add("lengths_observed_tokens_total", lens.get("observed_tokens", 0))
        add("lengths_observed_from_events_total", lens.get("observed_from_events", 0))
        add("lengths_observed_durations_total", lens.get("observed_durations", 0))
        add("lengths_unmatched_releases_total", lens.get("unmatched_releases", 0))
        add("lengths_prompts", lens.get("prompts", 0))
        if lens.get("length_corr_known"):
            add("lengths_corr", lens.get("length_corr", 0.0))
        add("lengths_longest_first_gated", 1 if lens.get("longest_first_gated") else 0)
        if lens.get("task_corr_known"):
            add("lengths_task_corr", lens.get("task_corr", 0.0))
        for sid, v in (lens.get("predicted_tokens") or {}).items():
            add("lengths_predicted_tokens", v, server=server_label(sid))
        add("bad_output_tokens_total", r.get("bad_output_tokens", 0))
    out.extend(_admission(r.get("admission")))
    return out


def _le(bound: float) -> str:
    """Prometheus' float text for a bucket bound (1e-06, 0.0001, 0.1)."""
    return repr(float(bound))


def _admission(adm: Any) -> List[Sample]:
    """The admission queue, when the status has one: each numeric or
    boolean field ``f`` becomes ``admission_<f>`` (a counter when ``f`` ends
    in ``_total``, else a gauge; see :func:`spec_of`)."""
    if not isinstance(adm, Mapping):
        return []
    return [
        (f"admission_{k}", (), _num(v))
        for k, v in adm.items()
        if isinstance(k, str) and re.fullmatch(r"[a-z][a-z0-9_]*", k) and isinstance(v, (int, float))
    ]


def spec_of(name: str) -> Spec:
    """The spec of a sample name; admission fields the list above does not
    know yet follow their name (``_total``: counter)."""
    spec = SPECS.get(name)
    if spec is None:
        field = name[len("admission_") :]
        spec = Spec("counter" if name.endswith("_total") else "gauge", f"admission queue: {field}")
    return spec


def merge(ss: List[Sample]) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """Sums samples with the same name and labels."""
    merged: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
    for name, labels, v in ss:
        merged[(name, labels)] = merged.get((name, labels), 0.0) + v
    return merged


# --------------------------------------------------------------------------
# Recording


#: Longest exported label value: longer ids are cut and keep a hash suffix.
MAX_LABEL_CHARS = 64
_LABEL_SAFE = re.compile(r"[^!-~]")  # printable ASCII without space


def label_value(sid: str) -> str:
    """A server id as a metric label value: Ray encodes label values as
    ASCII (one non-ASCII id stopped every kvc-router metric), and a 70 KB id
    was exported verbatim. Printable-ASCII ids up to MAX_LABEL_CHARS stay as
    they are; others become their ASCII-safe prefix, ``~`` and 12 hex digits
    of a hash of the whole id (distinct ids stay distinct)."""
    if len(sid) <= MAX_LABEL_CHARS and not _LABEL_SAFE.search(sid):
        return sid
    digest = hashlib.blake2b(sid.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return _LABEL_SAFE.sub("_", sid[: MAX_LABEL_CHARS - 13]) + "~" + digest


class _Gone(Exception):
    """The balancer was collected: the exporter thread ends."""


class Exporter:
    """Records status snapshots with ``ray.util.metrics``; :meth:`start`
    runs :meth:`export_once` every ``period_s`` in a daemon thread."""

    def __init__(self, status: Callable[[], Mapping[str, Any]], cfg: MetricsConfig) -> None:
        self._status = status
        self._cfg = cfg
        self._metrics: Dict[str, Any] = {}
        self._last: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}  # raw samples
        self._gauge_keys: set = set()  # exported gauge series still nonzero-able
        self._labels: Dict[str, str] = {}  # server id -> label value
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.exports = 0
        self.errors = 0

    def server_label(self, sid: str) -> str:
        label = self._labels.get(sid)
        if label is None:
            own = sum(1 for v in self._labels.values() if v != OTHER)
            label = label_value(sid) if own < self._cfg.max_server_labels and sid != OTHER else OTHER
            self._labels[sid] = label
        return label

    def prune(self, live: Iterable[str]) -> None:
        """Follows the pool: ids no longer live give up their label (their
        gauges already went to 0), and live ids folded into ``_other`` take
        the freed slots in the order they were first seen. Without it the
        first ``max_server_labels`` ids ever seen kept every slot: after
        churn every live server was ``_other`` and the map grew forever."""
        live = set(live)
        for sid in [k for k in self._labels if k not in live]:
            del self._labels[sid]
        free = self._cfg.max_server_labels - sum(1 for v in self._labels.values() if v != OTHER)
        for sid, label in list(self._labels.items()):
            if free <= 0:
                break
            if label == OTHER and sid != OTHER:
                self._labels[sid] = label_value(sid)
                free -= 1

    def _metric(self, name: str) -> Any:
        m = self._metrics.get(name)
        if m is None:
            from ray.util import metrics as rm

            spec = spec_of(name)
            full = PREFIX + name
            m = (rm.Counter if spec.kind == "counter" else rm.Gauge)(full, description=spec.help, tag_keys=spec.labels)
            self._metrics[name] = m
        return m

    def _fold(self, labels: Tuple[Tuple[str, str], ...]) -> Tuple[Tuple[str, str], ...]:
        """Exported labels: the bounded server label, no source labels."""
        return tuple((k, self.server_label(v) if k == "server" and v else v) for k, v in labels if k[0] != "_")

    def export_once(self, status: Optional[Mapping[str, Any]] = None) -> None:
        """Records one snapshot (``status`` or a fresh ``get_status()``).

        Counter increases are taken per source (one server, one publisher)
        before servers are folded into ``_other``, so a folded server that
        leaves, or one publisher that restarts, never makes the others'
        counts look new."""
        st = self._status() if status is None else status
        self.prune(s["id"] for s in (st.get("router") or {}).get("servers") or ())
        raw = merge(samples(st))
        incs: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
        gauges: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
        for (name, labels), v in raw.items():
            key = (name, self._fold(labels))
            if spec_of(name).kind == "counter":
                prev = self._last.get((name, labels), 0.0)
                delta = v - prev if v >= prev else v  # went down: the source restarted from 0
                incs[key] = incs.get(key, 0.0) + delta
            else:
                gauges[key] = gauges.get(key, 0.0) + v
        # Gauges of servers that left the pool go to 0 (Ray keeps a series forever).
        for key in self._gauge_keys:
            if key not in gauges and key[0] in SERVER_GAUGES:
                gauges[key] = 0.0
        for (name, labels), d in incs.items():
            if d > 0:
                self._metric(name).inc(d, tags=dict(labels) or None)
        for (name, labels), v in gauges.items():
            self._metric(name).set(v, tags=dict(labels) or None)
        self._last = raw
        self._gauge_keys = {k for k, v in gauges.items() if v != 0.0 or k[0] not in SERVER_GAUGES}
        self.exports += 1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kvc-router-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._cfg.period_s):
            try:
                self.export_once()
            except _Gone:
                return
            except Exception as e:  # noqa: BLE001 - never take the actor down
                self.errors += 1
                if self._stop.is_set():
                    return
                if self.errors <= 3:
                    logger.warning("[kvc_router.metrics] export failed: %s", e)

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self._cfg.period_s + 5)


def start_for(balancer: Any, cfg: MetricsConfig) -> Optional[Exporter]:
    """Starts an exporter for ``balancer`` when :func:`wanted`; the thread
    holds only a weak reference, so the balancer can still be collected."""
    if not wanted(cfg):
        return None
    try:
        import ray.util.metrics  # noqa: F401
    except ImportError:
        if cfg.enabled:
            logger.warning("[kvc_router.metrics] enabled but ray is not installed; not exporting")
        return None
    ref = weakref.ref(balancer)

    def status() -> Mapping[str, Any]:
        b = ref()
        if b is None:
            raise _Gone()
        return b.get_status()

    ex = Exporter(status, cfg)
    ex.start()
    return ex


__all__ = ["MetricsConfig", "Exporter", "SPECS", "samples", "spec_of", "start_for", "wanted", "in_ray_actor"]
