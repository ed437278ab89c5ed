#!/usr/bin/env python3
"""Long soak (`make soak`): 1M acquire/release pairs through the balancer Ray
actor from several client actors while two vllm-sim servers stream KV events
and metrics. Fails (exit 1) unless nothing is lost (in-flight back to 0,
acquires == releases == pairs), the actor's RSS grows under 5% after warm-up
and the goroutine count does not grow. Prints one JSON line of figures.

    PYTHONPATH=testbed .venv/bin/python testbed/scripts/soak.py [--pairs 1000000] [--clients 4]

The soak itself is kvc_harness.soak (tests/test_soak.py runs it scaled down).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

try:
    from kvc_harness.procs import start_ray
    from kvc_harness.soak import check_soak, run_soak
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed (as `make soak` does)")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of pairs before the RSS baseline")
    ap.add_argument("--rss-slack", type=float, default=0.05, help="allowed RSS growth after warm-up")
    args = ap.parse_args(argv)
    ray = start_ray(num_cpus=max(4, args.clients + 1))
    try:
        out = run_soak(ray, pairs=args.pairs, clients=args.clients, warmup_frac=args.warmup)
    finally:
        ray.shutdown()
    print(json.dumps(out))
    try:
        check_soak(out, rss_slack=args.rss_slack)
    except AssertionError as e:
        print(f"soak FAILED: {e}", file=sys.stderr)
        return 1
    print("soak OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
