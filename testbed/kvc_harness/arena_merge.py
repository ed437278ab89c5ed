"""Replace some routers' rows of a published arena run with a newer run of
the same workloads and seeds, or add rows of routers it did not run
(testbed/scripts/arena_merge.py is the command).

Only the named policies' rows change; every (workload, policy, seed) they
had must be in the new run and nothing else of the new run is taken. A
named policy the base never ran is added only when the new run has it on
exactly the base's (workload, seed) pairs, so every row stays paired. The two
runs' configurations must be equal except where a re-run may differ: the
output directory, the repeated policy and, when kvc_aware is among the
replaced policies, its frozen configuration (the merged file then records the
new one). The note is appended to ``config.parts``; the summary, verdicts,
gain shares and noise floor are recomputed from the merged rows."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple

from kvc_harness.arena import (
    NOHOLD_SUFFIX,
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
# Configuration keys of the hold; free when only "+nohold" rows are merged.
HOLD_KEYS = {"both_holds", "nohold_only"}


def key(run: Dict[str, Any]) -> Tuple[str, str, int]:
    r = run["row"]
    return r["workload"], r["policy"], int(r["seed"])


def merge(base: Dict[str, Any], new: Dict[str, Any], policies: List[str], note: str) -> Dict[str, Any]:
    bc, nc = base["config"], new["config"]
    if policies and all(p.endswith(NOHOLD_SUFFIX) for p in policies):
        # Rows without the hold name it, so a run of only those may add them
        # to a run of the held rows; kvc_aware must be configured as in the
        # base (its rows pair with the held ones), though the frozen file's
        # path may differ (a retired freeze lives under docs/results/).
        free = FREE_KEYS | HOLD_KEYS | {"kvc_frozen"}
    else:
        free = FREE_KEYS | (KVC_KEYS if "kvc_aware" in policies or "kvc_aware+nohold" in policies else set())
    differ = sorted(k for k in set(bc) | set(nc) if k not in free and bc.get(k) != nc.get(k))
    if differ:
        raise SystemExit(f"the runs' configurations differ in {differ}: not the same protocol")
    had = {r["row"]["policy"] for r in base["runs"]}
    added = [p for p in policies if p not in had]
    wanted = set(policies) - set(added)
    fresh = {key(r): r for r in new["runs"] if r["row"]["policy"] in wanted}
    old = [key(r) for r in base["runs"] if r["row"]["policy"] in wanted]
    pairs = sorted({(r["row"]["workload"], int(r["row"]["seed"])) for r in base["runs"]})
    extra_runs = []
    for p in added:
        rows = [r for r in new["runs"] if r["row"]["policy"] == p]
        got = sorted((r["row"]["workload"], int(r["row"]["seed"])) for r in rows)
        if got != pairs:
            raise SystemExit(f"{p} is not in the base, and the new run does not have it on exactly the base's "
                             f"{len(pairs)} (workload, seed) pairs ({len(got)} rows): it cannot be added")
        extra_runs += rows
    missing = sorted(set(old) - set(fresh))
    if missing:
        raise SystemExit(f"the new run lacks {len(missing)} rows the base has, e.g. {missing[:3]}")
    extra = sorted(set(fresh) - set(old))
    if extra:
        raise SystemExit(f"the new run has rows the base does not (other workloads or seeds): {extra[:3]}")
    runs = [fresh[key(r)] if r["row"]["policy"] in wanted else r for r in base["runs"]] + extra_runs
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


def write(merged: Dict[str, Any], out: str, policies: List[str]) -> str:
    """arena-details.json, arena.json and arena.png of the merged run in ``out``."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "arena-details.json"), "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1)
    with open(os.path.join(out, "arena.json"), "w", encoding="utf-8") as f:
        json.dump({"results": [{k: r["row"][k] for k in RESULT_KEYS} for r in merged["runs"]
                               if is_policy(r["row"]["policy"])]}, f, indent=1)
    plot([r for r in merged["runs"] if is_policy(r["row"]["policy"])], os.path.join(out, "arena.png"))
    n = sum(r["row"]["policy"] in policies for r in merged["runs"])
    return f"replaced or added {n} rows of {','.join(policies)}; {len(merged['runs'])} rows in {out}/arena-details.json"

