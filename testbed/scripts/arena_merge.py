#!/usr/bin/env python3
"""Replace some routers' rows of a published arena run with a newer run of
the same workloads and seeds, and say so in the result.

    arena_merge.py --base docs/results/arena-rl-details.json \\
        --new build/arena-rl-dynamo/arena-details.json \\
        --policies dynamo_kv_router,dynamo_kv_router+ttl \\
        --note "Dynamo's rows re-run with its router as the request path" \\
        --out build/arena-rl

Only the named policies' rows change; every (workload, policy, seed) they
had must be in the new run and nothing else of the new run is taken. The two
runs' configurations must be equal except where a re-run may differ: the
output directory, the repeated policy and, when kvc_aware is among the
replaced policies, its frozen configuration (the merged file then records the
new one). The note is appended to ``config.parts``; the summary, verdicts,
gain shares and noise floor are recomputed from the merged rows."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kvc_harness.arena import (  # noqa: E402
    RESULT_KEYS,
    aggregate,
    gain_shares,
    is_policy,
    noise_floor,
    plot,
    verdicts,
)

# Configuration keys a re-run may change; the kvc_* ones only with kvc_aware replaced.
FREE_KEYS = {"out_dir", "repeat_policy", "parts"}
KVC_KEYS = {"kvc_knobs", "kvc_frozen", "kvc_frozen_commit"}


def key(run: Dict[str, Any]) -> Tuple[str, str, int]:
    r = run["row"]
    return r["workload"], r["policy"], int(r["seed"])


def merge(base: Dict[str, Any], new: Dict[str, Any], policies: List[str], note: str) -> Dict[str, Any]:
    free = FREE_KEYS | (KVC_KEYS if "kvc_aware" in policies or "kvc_aware+nohold" in policies else set())
    bc, nc = base["config"], new["config"]
    differ = sorted(k for k in set(bc) | set(nc) if k not in free and bc.get(k) != nc.get(k))
    if differ:
        raise SystemExit(f"the runs' configurations differ in {differ}: not the same protocol")
    wanted = set(policies)
    fresh = {key(r): r for r in new["runs"] if r["row"]["policy"] in wanted}
    old = [key(r) for r in base["runs"] if r["row"]["policy"] in wanted]
    if not old:
        raise SystemExit(f"the base has no rows of {sorted(wanted)}")
    missing = sorted(set(old) - set(fresh))
    if missing:
        raise SystemExit(f"the new run lacks {len(missing)} rows the base has, e.g. {missing[:3]}")
    extra = sorted(set(fresh) - set(old))
    if extra:
        raise SystemExit(f"the new run has rows the base does not (other workloads or seeds): {extra[:3]}")
    runs = [fresh[key(r)] if r["row"]["policy"] in wanted else r for r in base["runs"]]
    config = dict(bc)
    for k in free & KVC_KEYS:
        if k in nc:
            config[k] = nc[k]
    config["parts"] = list(bc.get("parts") or []) + [note]
    summary = [{"workload": a["workload"], "policy": a["policy"], "seeds": a["seeds"],
                **{k: v.as_dict() for k, v in a["ci"].items()}, "errors": a["errors"],
                "overhead_ms": a["overhead_ms"]} for a in aggregate(runs)]
    out = {k: v for k, v in base.items() if k not in ("config", "runs", "gain_shares", "summary", "verdicts",
                                                       "noise_floor")}
    return {"config": config, "runs": runs, "gain_shares": gain_shares(runs), "summary": summary,
            "verdicts": verdicts(runs), "noise_floor": noise_floor(runs), **out}


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--policies", required=True, help="comma-separated: the rows to replace")
    ap.add_argument("--note", required=True, help="what was re-run and why (appended to config.parts)")
    ap.add_argument("--out", required=True, help="directory for arena-details.json, arena.json and arena.png")
    a = ap.parse_args(argv)
    with open(a.base, encoding="utf-8") as f:
        base = json.load(f)
    with open(a.new, encoding="utf-8") as f:
        new = json.load(f)
    merged = merge(base, new, [p for p in a.policies.split(",") if p], a.note)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "arena-details.json"), "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1)
    with open(os.path.join(a.out, "arena.json"), "w", encoding="utf-8") as f:
        json.dump({"results": [{k: r["row"][k] for k in RESULT_KEYS} for r in merged["runs"]
                               if is_policy(r["row"]["policy"])]}, f, indent=1)
    plot([r for r in merged["runs"] if is_policy(r["row"]["policy"])], os.path.join(a.out, "arena.png"))
    n = sum(r["row"]["policy"] in a.policies.split(",") for r in merged["runs"])
    print(f"replaced {n} rows of {a.policies}; {len(merged['runs'])} rows in {a.out}/arena-details.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
