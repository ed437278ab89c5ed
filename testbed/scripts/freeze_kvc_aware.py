"""Freezes kvc_aware's whole configuration: writes docs/frozen-kvc-aware.json
with the library's kvc_aware defaults (``kvc_router.library_defaults``: the
strategy parameters and every router, index, load and collector setting, as
the balancer verl's hook creates runs them, so ``router.admission.enabled``
records whether that balancer holds acquires: true since admission's default
became ``auto``) and the commit they come from. Reported runs load it (``kvbench
--kvc-frozen``, ``testbed/scripts/arena.py`` by default) and record its commit;
nothing may be tuned on the reported seeds after it is written.

  make freeze-kvc-aware                       # status "frozen" (clean tree required)
  python testbed/scripts/freeze_kvc_aware.py --draft  # status "draft" (for trying the machinery)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "docs", "frozen-kvc-aware.json")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", action="store_true", help="allow a dirty tree; status 'draft'")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--tune-seeds", default="101,102", help="seeds any tuning used (comma list); never reported")
    a = ap.parse_args()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    if dirty and not a.draft:
        print(f"freeze: the tree has uncommitted changes; commit first (or --draft):\n{dirty}", file=sys.stderr)
        return 2
    seeds = [int(x) for x in a.tune_seeds.split(",") if x.strip()]
    import kvc_router

    full = kvc_router.library_defaults("kvc_aware", async_balancer=True)
    strategies = full["router"]["strategies"]
    if len(strategies) != 1 or strategies[0]["name"] != "kvc_aware":
        print(f"freeze: unexpected strategies {strategies}", file=sys.stderr)
        return 2
    doc = {
        "commit": git("rev-parse", "HEAD"),
        "status": "draft" if a.draft else "frozen",
        "frozen_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tune_seeds": seeds,
        "note": "kvc_aware's configuration for every reported run after this commit; "
        f"tuning only on seeds {a.tune_seeds}",
        "strategy": strategies[0]["params"],
        "library_defaults": full,
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    print(f"froze kvc_aware at {doc['commit'][:12]} ({doc['status']}) -> {os.path.relpath(a.out, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
