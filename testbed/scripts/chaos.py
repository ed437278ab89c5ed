#!/usr/bin/env python3
"""Long chaos run (`make chaos`): the fault and hostile-input tests at scale,
then the 10M-block event flood, then every figure in one summary.

  - 20 kill/restart cycles of a vllm-sim in a 3-server fleet under traffic
    (KVR_CHAOS_CYCLES), 400 completions with every 3rd KV-event batch
    withheld, with and without replay (KVR_CHAOS_COMPLETIONS);
  - 1M seeded random hostile C ABI calls from C (KVR_C_HOSTILE_ITERS), the
    hypothesis-driven Python ABI and config fuzzing, exact size limits;
  - a 2M-block flood through the Python push path (KVR_PY_FLOOD_BLOCKS) and a
    10M-block flood in Go (KVR_FLOOD_BLOCKS, core/internal/collector TestEventFlood);
  - 10M acquires per balancer mode racing add_servers/remove_servers, none
    returning a missing handle (KVR_CHURN_ACQUIRES);
  - hostile ZMQ publishers and replay endpoints (a 2^50-byte frame header, a
    400 MiB frame against a 1 MiB limit, endless MORE frames, a slow-loris
    greeting), each dropped and counted KVR_CHAOS_ZMQ_ROUNDS times with RSS
    back to baseline (tests/test_hostile_zmq.py);
  - 20,000 requests beside a server whose /metrics hold impossible values,
    none routed to it (KVR_CHAOS_HOSTILE_REQUESTS), collector panics
    recovered, and memory returned after giant KV-event batches;
  - admission under faults (KVR_CHAOS_ADMISSION_REQUESTS per case): a client
    dying with held tickets, the balancer actor restarted (max_restarts)
    under held requests, a churning pool; 0 lost, nothing left counted.

Only loopback is used; every process started is stopped by the tests'
fixtures. Exit status 1 when any part fails.

    PYTHONPATH=testbed .venv/bin/python testbed/scripts/chaos.py [--cycles 20] [--flood-blocks 10000000]

The parts are kvc_harness.chaos.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

try:
    from kvc_harness.chaos import ChaosOptions, run_chaos
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed (as `make chaos` does)")


def main(argv: Optional[List[str]] = None) -> int:
    d = ChaosOptions()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=d.cycles)
    ap.add_argument("--completions", type=int, default=d.completions)
    ap.add_argument("--c-iters", type=int, default=d.c_iters)
    ap.add_argument("--py-flood-blocks", type=int, default=d.py_flood_blocks)
    ap.add_argument("--flood-blocks", type=int, default=d.flood_blocks)
    ap.add_argument("--churn-acquires", type=int, default=d.churn_acquires)
    ap.add_argument("--hostile-requests", type=int, default=d.hostile_requests)
    ap.add_argument("--admission-requests", type=int, default=d.admission_requests)
    ap.add_argument("--zmq-rounds", type=int, default=d.zmq_rounds)
    ok = run_chaos(ChaosOptions(**vars(ap.parse_args(argv))))
    print("chaos:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
