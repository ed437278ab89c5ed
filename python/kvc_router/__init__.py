"""kvc_router: a KV-cache-aware request load balancer for LLM rollout servers.

``KVCAwareBalancer`` is a drop-in for verl's ``GlobalRequestLoadBalancer``::

    import ray
    from kvc_router import KVCAwareBalancer

    lb = ray.remote(KVCAwareBalancer).remote(servers={"10.0.0.1:8000": handle}, max_cache_size=10000)
    server_id, handle = ray.get(lb.acquire_server.remote(request_id="r1", prompt_ids=[1, 2, 3]))

Without ``router_config`` it routes exactly like verl's default balancer; with
``router_config="kvc_aware"`` (or a dict / DictConfig / YAML path) it routes on
prefix-cache hits and live load. The async ``KVCAwareAdmissionBalancer``
adds router-side admission (on by default there, ``admission.enabled: auto``;
verl's hook creates it for kvc_aware; docs/verl.md); this synchronous class
runs without it. The routing core is the Go library
``libkvcrouter.so`` shipped inside this package, loaded lazily through ctypes.
"""

from .admission import KVCAwareAdmissionBalancer
from .balancer import DEFAULT_ROUTING_CACHE_SIZE, KVCAwareBalancer
from .config import (
    CollectorConfig,
    KVCAwareConfig,
    KVCAwareStrategyConfig,
    KVEventEndpoint,
    LeastInflightStrategyConfig,
    RouterConfig,
    library_defaults,
    load_router_config,
)
from .errors import (
    NO_SERVERS_MESSAGE,
    AdmissionQueueFullError,
    ConfigError,
    ForkError,
    InvalidArgumentError,
    InvalidStateError,
    NativeError,
    NoServerError,
)

# The package version: pyproject.toml reads it from here (its one source).
# The C ABI has its own version (KVR_ABI_VERSION in cabi/kvcrouter.h).
__version__ = "0.1.0"

__all__ = [
    "KVCAwareBalancer",
    "KVCAwareAdmissionBalancer",
    "AdmissionQueueFullError",
    "DEFAULT_ROUTING_CACHE_SIZE",
    "RouterConfig",
    "KVCAwareConfig",
    "KVCAwareStrategyConfig",
    "LeastInflightStrategyConfig",
    "CollectorConfig",
    "KVEventEndpoint",
    "load_router_config",
    "library_defaults",
    "ConfigError",
    "NativeError",
    "NoServerError",
    "InvalidArgumentError",
    "InvalidStateError",
    "ForkError",
    "NO_SERVERS_MESSAGE",
    "__version__",
]
