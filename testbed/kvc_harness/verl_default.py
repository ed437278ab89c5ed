"""verl's default balancer, as the arena's ``verl_default`` row runs it.

verl 0.9.1's ``GlobalRequestLoadBalancer`` (verl/workers/rollout/router.py):
a request_id bound before goes back to its server (an LRU of 10,000
bindings; no load check); a new one goes to the server with the fewest
in-flight requests, ties broken by ``random.choice`` over the tied servers
in insertion order (PR #7613); release decrements by server id. verl 0.9.0
(verl/workers/rollout/llm_server.py) sent ties to the first tied server.

Written from that behaviour, not imported: the arena's venv has no verl (it
needs torch). ``tests/verl/test_verl_default_diff.py`` checks it decision
for decision against verl's own class, seeded alike: verl draws from the
module-level generator, this class from ``random.Random(seed)``, which
``random.seed(seed)`` puts in the same state.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

DEFAULT_ROUTING_CACHE_SIZE = 10000


class VerlDefault:
    """acquire_server(request_id) -> (server_id, None); release_server(server_id)."""

    def __init__(self, servers: List[str], seed: int = 0, first_tie: bool = False,
                 max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE) -> None:
        self.inflight: Dict[str, int] = {s: 0 for s in servers}
        self.first_tie = first_tie
        self.rng = random.Random(seed)
        self.max_cache_size = max_cache_size
        self.sticky: OrderedDict[str, str] = OrderedDict()

    def acquire_server(self, request_id: str) -> Tuple[str, Optional[object]]:
        sid = self.sticky.get(request_id)
        if sid is not None:
            self.sticky.move_to_end(request_id)  # a read refreshes recency (cachetools LRUCache)
            if sid in self.inflight:
                self.inflight[sid] += 1
                return sid, None
            del self.sticky[request_id]
        if not self.inflight:
            raise RuntimeError("No available servers in load balancer")
        low = min(self.inflight.values())
        tied = [s for s, n in self.inflight.items() if n == low]
        sid = tied[0] if self.first_tie else self.rng.choice(tied)
        self.sticky[request_id] = sid
        self.sticky.move_to_end(request_id)
        while len(self.sticky) > self.max_cache_size:
            self.sticky.popitem(last=False)
        self.inflight[sid] += 1
        return sid, None

    def release_server(self, server_id: str, request_id: Optional[str] = None) -> None:
        if self.inflight.get(server_id, 0) > 0:
            self.inflight[server_id] -= 1
