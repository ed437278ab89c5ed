"""``KVCAwareBalancer``: a drop-in for verl's ``GlobalRequestLoadBalancer``.

A plain class with synchronous methods only; verl turns it into a Ray actor
with ``ray.remote(KVCAwareBalancer).remote(servers=..., max_cache_size=...)``.
The routing state lives in libkvcrouter (loaded lazily in ``__init__``, i.e. in
the actor process); this class keeps the server handles and mirrors the pool
order so the hot path returns an integer index instead of a string.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import _native, metrics
from .config import RouterConfig, load_router_config, parse_endpoint
from .errors import ConfigError, NativeError, NoServerError, allowed_text

logger = logging.getLogger("kvc_router")

#: Routing attempts when each picks a server removed concurrently (pool churn).
_ACQUIRE_ATTEMPTS = 64
_MISSING = object()
#: kvr_release_done's bound on output_tokens (cabi maxOutputTokens).
_MAX_OUTPUT_TOKENS = 1 << 24

#: verl's DEFAULT_ROUTING_CACHE_SIZE.
DEFAULT_ROUTING_CACHE_SIZE = 10000


def _pool_kept_changing() -> NoServerError:
    return NoServerError(
        f"the server pool changed during each of {_ACQUIRE_ATTEMPTS} routing attempts; no server could be returned"
    )


class KVCAwareBalancer:
    """Routes requests to servers; same methods and semantics as verl's balancer.

    Router-side admission needs the async
    :class:`~kvc_router.KVCAwareAdmissionBalancer` (which verl's hook creates
    for kvc_aware, where admission's default, ``auto``, turns it on). Here
    ``auto`` means off, and ``admission: {enabled: true}`` is refused with a
    :class:`~kvc_router.errors.ConfigError` naming the class to use.

    Parameters
    ----------
    servers:
        ``{server_id: handle}`` in rank order; may be empty. Handles are opaque
        (``None`` is fine); a handle offering ``get_kv_events_endpoints()`` is
        asked for its KV-event publishers when the ``vllm_zmq`` collector runs.
    max_cache_size:
        Sticky LRU capacity (verl's ``DEFAULT_ROUTING_CACHE_SIZE`` = 10000),
        unless the router config sets ``sticky_max_size``.
    full_determinism:
        New bindings go to ``list(servers)[hash(request_id) % len(servers)]``
        (CPython ``str`` hash, as verl does), ignoring load.
    router_config:
        ``None`` (verl's default behaviour), ``"kvc_aware"``, a dict, an
        OmegaConf ``DictConfig``, a YAML path or a :class:`RouterConfig`; see
        :mod:`kvc_router.config`.

    verl >= 0.9.1's ``rollout.router_config_path`` route creates the actor
    with ``ray.remote(cls).remote(servers, yaml_dict)``: a mapping given as the
    second positional argument is taken as ``router_config`` (its
    ``router_class`` key is ignored; a YAML naming only the class selects the
    packaged ``kvc_aware`` defaults).
    """

    #: True in the subclass that implements router-side admission.
    _ADMISSION = False

    def __init__(
        self,
        servers: Optional[Mapping[str, Any]] = None,
        max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
        full_determinism: bool = False,
        router_config: Any = None,
    ) -> None:
        if router_config is None and _is_mapping(max_cache_size):
            # ray.remote(cls).remote(servers, yaml_config): verl's plugin route.
            router_config, max_cache_size = max_cache_size, DEFAULT_ROUTING_CACHE_SIZE
        if not isinstance(full_determinism, bool):
            raise ConfigError(
                f"full_determinism must be true or false, got {full_determinism!r}",
                key="full_determinism",
                allowed=(True, False),
            )
        # The library checks max_cache_size and refuses admission to the
        # synchronous class, naming the key; admission's default (auto) is on
        # only in the async class.
        self._config: RouterConfig = load_router_config(
            router_config,
            max_cache_size=max_cache_size,
            sync_balancer=not self._ADMISSION,
            async_balancer=self._ADMISSION,
        )
        self._full_determinism = full_determinism
        self._flavor = _native.METRICS_FLAVORS[self._config.metrics_flavor]
        self._zmq = "vllm_zmq" in self._config.collector_names
        self._uses_prompt = self._config.type == "kvc_aware"
        self._handles: Dict[str, Any] = {}
        #: acquires re-routed because their server was removed concurrently
        self._races = 0
        #: releases and in-flight lookups of non-str ids (no-ops)
        self._ignored_ids = 0
        # (pool order, handles, generation): replaced as a whole on every
        # membership change, read without locking on the hot path. The one
        # copy of the pool outside the router: an acquire that knows the
        # generation gets an index into it instead of the id string, which
        # saves 2-4 us of the actor's CPU per acquire+release
        # (docs/performance.md, "The pool has one copy").
        self._view: Tuple[Tuple[str, ...], Dict[str, Any], int] = ((), {}, -1)
        self._lock = threading.Lock()  # serialises pool changes (threaded actors)
        #: route_batch calls and what they carried (status: is client batching on?)
        self._batches = {"calls": 0, "acquires": 0, "releases": 0}
        #: releases whose output_tokens was not a count (released without it)
        self._bad_counts = 0
        self._router = _native.Router(self._config.native())
        self._finalizer = weakref.finalize(self, self._router.close_in_owner)
        #: max_prompt_tokens: longer prompts are refused before being packed
        first = self._router.status()["router"]
        self._max_tokens: Optional[int] = first.get("max_prompt_tokens") or None
        #: lengths.enabled: releases that name their request teach the learner
        self._learns = first.get("lengths") is not None
        self._refresh()
        if servers:
            self.add_servers(servers)
        # Ray metrics from periodic get_status() snapshots (a daemon thread;
        # nothing on the acquire path). On by default inside Ray actors.
        self._metrics = metrics.start_for(self, self._config.metrics)

    # -- verl's interface ----------------------------------------------------

    def acquire_server(self, request_id: str, prompt_ids: Any = None) -> Tuple[str, Any]:
        """Routes a request; returns ``(server_id, handle)``.

        Raises :class:`~kvc_router.errors.NoServerError` (a ``RuntimeError``
        with verl's exact text) when the pool is empty.
        """
        rid = _native._utf8(request_id, "request_id")
        # Default mode never reads the prompt (as verl's balancer ignores it).
        keep, addr, n = _native.pack_tokens(prompt_ids, self._max_tokens) if self._uses_prompt else (None, None, 0)
        for _ in range(_ACQUIRE_ATTEMPTS):
            pool, handles, known = self._view
            pin = self._pin(request_id, pool)
            idx, _gen, sid = self._router.acquire(rid, addr, n, pin, known)
            sid, handle = self._handle_for(pool, handles, idx, sid)
            if handle is not _MISSING:
                del keep
                return sid, handle
        del keep
        raise _pool_kept_changing()

    def require_acquire_fields(self) -> List[str]:
        """verl >= 0.9.1: ``generate()`` kwargs the client must send with
        ``acquire_server`` (only ``prompt_ids``, and only in kvc_aware mode)."""
        return ["prompt_ids"] if self._uses_prompt else []

    def require_release_fields(self) -> List[str]:
        """verl >= 0.9.1: ``request_id`` when the router learns response
        lengths (``lengths.enabled``, or kvc_aware's defaults
        ``group_spread_min_corr`` and ``task_spread_min_corr``, which measure
        how alike a prompt's samples and a task's trajectories are), else
        nothing."""
        return ["request_id"] if self._learns else []

    def release_server(
        self, server_id: str, request_id: Optional[str] = None, output_tokens: Any = None, **kwargs: Any
    ) -> None:
        """Counts one request finished; unknown ids and zero counts are ignored.

        With ``lengths.enabled``, ``request_id`` (as given to
        :meth:`acquire_server`) and ``output_tokens`` (how many tokens the
        request generated; the verl hook sends both) teach the router the
        prompt's response length; without a count the time since the acquire
        is learnt. A count that is not a non-negative int is dropped and
        counted (``router.bad_output_tokens``); the release still counts.
        Other keywords are accepted and unused."""
        sid = _native.lookup_id(server_id)
        if sid is None:
            self._ignored_ids += 1  # not a str: no server has it
            return
        done = self._done_args(request_id, output_tokens)
        if done is None:
            self._router.release(sid)  # the library counts impossible ids
        else:
            self._router.release_done(sid, *done)

    def _done_args(self, request_id: Any, output_tokens: Any) -> Optional[Tuple[bytes, int]]:
        """``(request id, output tokens)`` for ``kvr_release_done`` when the
        release can teach the length learner, else None (a plain release)."""
        if not self._learns or not isinstance(request_id, str) or not request_id:
            return None
        try:
            rid = request_id.encode("utf-8")
        except UnicodeEncodeError:
            return None  # no acquire had this id either
        n = output_tokens
        if n is None:
            return rid, 0
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= _MAX_OUTPUT_TOKENS:
            self._bad_counts += 1
            return rid, 0
        return rid, n

    def route_batch(self, releases: Sequence[Any], acquires: Sequence[Tuple[str, Any]]) -> List[Any]:
        """Many ``release_server`` then ``acquire_server`` calls in one actor
        call (see :mod:`kvc_router.batching`, which sends them from verl's
        clients). Returns one entry per acquire, in order: ``(server_id,
        handle)``, or the exception that acquire raised (the others still run)."""
        return self._route_batch(releases, acquires, self.release_server, self.acquire_server)

    def _route_batch(
        self,
        releases: Sequence[Any],
        acquires: Sequence[Tuple[str, Any]],
        release: Callable[..., Any],
        acquire: Callable[[str, Any], Any],
    ) -> List[Any]:
        """route_batch with the release and acquire steps given (the
        admission class's never wait)."""
        b = self._batches
        b["calls"] += 1
        b["acquires"] += len(acquires)
        b["releases"] += len(releases)
        for item in releases:
            # A str (server id), or (server id, request id, output tokens)
            # from a client that knows the request's output.
            if isinstance(item, (tuple, list)) and len(item) == 3:
                release(*item)
            else:
                release(item)
        out: List[Any] = []
        for item in acquires:
            try:
                request_id, prompt_ids = item
                out.append(acquire(request_id, prompt_ids))
            except Exception as e:  # noqa: BLE001 - each caller gets its own error
                out.append(e)
        return out

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Adds servers (``{id: handle}``); re-adding resets the count to 0."""
        items = _server_items(servers)
        if not items:
            return
        with self._lock:
            # Handles first: an acquire may return a new id as soon as the
            # library has it, and must find its handle.
            for sid, handle in items:
                self._handles[sid] = handle
            try:
                self._router.add_servers([sid for sid, _ in items])
            except BaseException:
                self._forget_unknown()
                raise
            finally:
                self._refresh()
        logger.info("[KVCAwareBalancer] added %d servers", len(items))
        if self._zmq:
            for sid, handle in items:
                self._configure_events(sid, handle)

    def remove_servers(self, server_ids: Iterable[str]) -> None:
        """Removes servers; unknown ids are ignored; sticky bindings drop lazily."""
        if isinstance(server_ids, str):
            server_ids = [server_ids]
        # Ids no server can have are unknown ids: ignored, like the others.
        ids = [s for s in server_ids if _valid_id(s)]
        if not ids:
            return
        with self._lock:
            # The library forgets the ids first; their handles go after, so
            # an acquire that picked one just before still finds its handle.
            self._router.remove_servers(ids)
            for sid in ids:
                self._handles.pop(sid, None)
            self._refresh()

    def get_all_servers(self) -> List[str]:
        """Active pool ids in insertion order."""
        self._router._h()
        return list(self._view[0])

    def get_inflight_count(self, server_id: str) -> int:
        sid = _native.lookup_id(server_id)
        if sid is None:
            self._ignored_ids += 1
            return 0
        return self._router.inflight(sid)

    def get_total_inflight(self) -> int:
        return self._router.total_inflight()

    def get_status(self) -> Dict[str, Any]:
        """verl's keys (``servers``, ``total_inflight``, ``active_servers``,
        ``registered_handles``) plus ``router``: the native status (mode,
        strategy, per-server load, index, collectors, counters)."""
        doc = self._router.status()
        rs = doc["router"]
        servers = {s["id"]: s["load"]["inflight"] for s in rs["servers"]}
        router = dict(rs)
        router["collectors"] = doc.get("collectors")
        router["full_determinism"] = self._full_determinism
        router["generation"] = doc.get("generation")
        router["panics"] = doc.get("panics", 0)
        router["goroutines"] = doc.get("goroutines", 0)
        router["library"] = _native.loaded_path()
        router["client_batches"] = dict(self._batches)
        #: acquires routed again because their server was removed meanwhile
        router["pool_change_retries"] = self._races
        #: releases / in-flight lookups of ids no server can have (no-ops)
        router["ignored_invalid_ids"] = doc.get("ignored_invalid_ids", 0) + self._ignored_ids
        router["bad_output_tokens"] = self._bad_counts
        if self._uses_prompt:
            router["index_mode"] = (
                "approximate: no KV-event stream; cached prefixes are predicted from this balancer's own routing"
                if rs.get("approximate")
                else "exact: prefixes come from the servers' KV-cache events"
            )
        return {
            "servers": servers,
            "total_inflight": sum(servers.values()),
            "active_servers": len(servers),
            "registered_handles": list(self._handles),
            "router": router,
        }

    def clear_sticky_cache(self) -> Dict[str, Any]:
        """Drops every sticky binding; in-flight counts are unchanged."""
        doc = self._router.clear_sticky()
        return {
            "cleared_entries": doc["cleared_entries"],
            "server_loads": {s["id"]: s["inflight"] for s in doc["server_loads"]},
        }

    # -- extras ----------------------------------------------------------------

    def reset_prefix_index(self) -> None:
        """Forgets every cached prefix (call after a weight update)."""
        self._router.reset_cache()

    def update_metrics(self, server_id: str, text: Any, flavor: Optional[str] = None) -> bool:
        """Push mode: one Prometheus text scrape of a server.

        Returns False when the server is not in the pool. Malformed text raises
        :class:`~kvc_router.errors.InvalidArgumentError` (a ``ValueError``) and
        the previous snapshot is kept.
        """
        sid = _native._utf8(server_id, "server_id")
        if isinstance(text, str):
            body = text.encode("utf-8")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            body = bytes(text)
        else:
            raise TypeError(f"metrics text must be str or bytes, got {type(text).__name__}")
        fl = self._flavor
        if flavor is not None:
            if flavor not in _native.METRICS_FLAVORS:
                allowed = tuple(_native.METRICS_FLAVORS)
                raise ConfigError(
                    f"flavor: {flavor!r} (allowed: {allowed_text(allowed)})", key="flavor", allowed=allowed
                )
            fl = _native.METRICS_FLAVORS[flavor]
        return self._router.update_metrics(sid, body, fl)

    def update_kv_events(self, server_id: str, payload: Any) -> bool:
        """Push mode: one raw msgpack KVEventBatch (vLLM's ZMQ payload frame).

        Returns False when the server is not in the pool; a malformed payload
        raises :class:`~kvc_router.errors.InvalidArgumentError`.
        """
        sid = _native._utf8(server_id, "server_id")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        return self._router.update_events(sid, bytes(payload))

    def acquire_server_detail(self, request_id: str, prompt_ids: Any = None) -> Dict[str, Any]:
        """Like :meth:`acquire_server` but returns the decision details
        (server, reason, score, load, hit blocks per tier, ...)."""
        rid = _native._utf8(request_id, "request_id")
        keep, addr, n = _native.pack_tokens(prompt_ids, self._max_tokens)
        pin = self._pin(request_id, self._view[0])
        d = self._router.acquire_detail(rid, addr, n, pin)
        del keep
        return d

    def close(self) -> None:
        """Stops the collectors and frees the native router. Idempotent."""
        self._finalizer.detach()
        if self._metrics is not None:
            self._metrics.stop()
        if self._router.closed:
            return
        self._router.close()

    def __enter__(self) -> KVCAwareBalancer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals -------------------------------------------------------------

    def _pin(self, request_id: str, pool: Sequence[str]) -> int:
        """The pool index ``full_determinism`` pins a request to, or -1."""
        return hash(request_id) % len(pool) if self._full_determinism and pool else -1

    def _handle_for(
        self, pool: Sequence[str], handles: Dict[str, Any], idx: int, sid: Optional[str]
    ) -> Tuple[str, Any]:
        """The routed server's id and handle, ``_MISSING`` for a server removed
        after the library picked it (counted in ``_races``; the caller routes
        again: the removed server's count went with it). ``sid`` is None when
        the decision has the same generation as our mirror ``(pool,
        handles)``, whose index ``idx`` then names the server. add_servers
        stores a handle before the library sees its id and remove_servers
        drops it only after the library forgot the id, so a missing handle
        can only mean that removal."""
        if sid is None:
            sid = pool[idx]
            handle = handles.get(sid, _MISSING)
        else:
            handle = self._handles.get(sid, _MISSING)
        if handle is _MISSING:
            self._races += 1
        return sid, handle

    def _forget_unknown(self) -> None:
        """Drops handles the library does not have (an add it refused);
        callers hold ``_lock``."""
        pool = set(self._router.servers()[0])
        for sid in [s for s in self._handles if s not in pool]:
            del self._handles[sid]

    def _refresh(self) -> None:
        """Re-reads the native pool order; callers hold ``_lock``."""
        pool, gen = self._router.servers()
        self._view = (tuple(pool), dict(self._handles), gen)

    def _configure_events(self, sid: str, handle: Any) -> None:
        """Gives the vllm_zmq collector a server's KV-event publishers: from the
        config when listed there, else from ``handle.get_kv_events_endpoints()``."""
        c = self._config.collector
        if sid in c.endpoints or not c.use_handle_endpoints or handle is None:
            return
        eps = endpoints_from_handle(handle, c.handle_timeout_ms / 1000.0, c.topic)
        if not eps:
            return
        try:
            self._router.set_kv_endpoints(sid.encode("utf-8"), [e.native() for e in eps])
        except NativeError as e:
            logger.warning("[KVCAwareBalancer] server %s: KV-event endpoints rejected: %s", sid, e)

    def __reduce__(self) -> Any:
        raise TypeError("KVCAwareBalancer instances cannot be pickled; create one per process (Ray actor)")


def _is_mapping(obj: Any) -> bool:
    if isinstance(obj, Mapping):
        return True
    mod = type(obj).__module__ or ""
    return mod.startswith("omegaconf") and type(obj).__name__ == "DictConfig"


def _valid_id(server_id: Any) -> bool:
    try:
        _native.check_server_id(server_id)
    except (TypeError, ValueError):
        return False
    return True


def _server_items(servers: Any) -> List[Tuple[str, Any]]:
    if isinstance(servers, Mapping):
        items = list(servers.items())
    elif isinstance(servers, str):
        items = [(servers, None)]
    else:
        try:
            items = [(s, None) for s in servers]
        except TypeError:
            raise TypeError(f"servers must be a dict of server id -> handle, got {type(servers).__name__}") from None
    for sid, _ in items:
        _native.check_server_id(sid)  # TypeError / InvalidArgumentError naming the problem
    return items


def endpoints_from_handle(handle: Any, timeout_s: float = 5.0, topic: str = "") -> list:
    """Asks a server handle for its KV-event publishers.

    Works with plain objects and Ray actor handles (``.remote()`` then
    ``ray.get`` with a timeout). The method returns ``[endpoint, replay,
    publisher, topic]`` (or a list of those, one per DP rank); missing
    methods, errors and non-zmq publishers give ``[]``.
    """
    try:
        method = getattr(handle, "get_kv_events_endpoints", None)
    except Exception:  # noqa: BLE001 - handles are arbitrary objects
        return []
    if method is None:
        return []
    try:
        if hasattr(method, "remote"):
            import ray

            result = ray.get(method.remote(), timeout=timeout_s)
        else:
            result = method()
    except Exception as e:  # noqa: BLE001
        logger.warning("[KVCAwareBalancer] get_kv_events_endpoints() failed: %s", e)
        return []
    if not result:
        return []
    entries = result if isinstance(result[0], (list, tuple)) else [result]
    out = []
    for entry in entries:
        entry = list(entry) + [None] * 4
        endpoint, replay, publisher, t = entry[:4]
        if not endpoint or (publisher not in (None, "zmq")):
            continue
        try:
            out.append(parse_endpoint({"endpoint": endpoint, "replay": replay, "topic": t or topic}, "endpoint"))
        except ConfigError as e:
            logger.warning("[KVCAwareBalancer] ignoring KV-event endpoint %r: %s", endpoint, e)
    return out


__all__ = ["KVCAwareBalancer", "DEFAULT_ROUTING_CACHE_SIZE", "endpoints_from_handle"]
