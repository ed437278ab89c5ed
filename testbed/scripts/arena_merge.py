"""Replace some routers' rows of a published arena run with a re-run of the
same workloads and seeds, or add rows of routers it did not run, and say so
in the result (kvc_harness.arena_merge has the rules). Run with
PYTHONPATH=testbed.

    arena_merge.py --base docs/results/arena-rl-details.json \\
        --new build/arena-rl-dynamo/arena-details.json \\
        --policies dynamo_kv_router,dynamo_kv_router+ttl \\
        --note "Dynamo's rows re-run with its router as the request path" \\
        --out build/arena-rl
"""

from __future__ import annotations

import argparse
import json
import sys

try:
    from kvc_harness.arena_merge import merge, write
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--policies", required=True,
                    help="comma-separated: the rows to replace (or add: a policy the base did not run)")
    ap.add_argument("--note", required=True, help="what was re-run and why (appended to config.parts)")
    ap.add_argument("--out", required=True, help="directory for arena-details.json, arena.json and arena.png")
    a = ap.parse_args(argv)
    with open(a.base, encoding="utf-8") as f:
        base = json.load(f)
    with open(a.new, encoding="utf-8") as f:
        new = json.load(f)
    policies = [p for p in a.policies.split(",") if p]
    print(write(merge(base, new, policies, a.note), a.out, policies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
