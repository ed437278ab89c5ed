#!/usr/bin/env python3
"""Joins one seed's kvbench runs of grpo_sat in submission order and longest
response first (``--oracle-longest-first``) into ``DIR/oracle-lpt-SEED.json``
for docs/step-time.md (``make kvbench-heldout`` runs it; ``make render`` copies
the result to docs/results/). Longest-first uses the true response lengths,
which no router sees: a reference for what length knowledge would buy.

  python testbed/scripts/oracle_lpt.py SEED DIR   # reads DIR/fifo-SEED.json and DIR/lpt-SEED.json
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    seed, d = argv
    with open(os.path.join(d, f"fifo-{seed}.json"), encoding="utf-8") as f:
        fifo = json.load(f)
    with open(os.path.join(d, f"lpt-{seed}.json"), encoding="utf-8") as f:
        lpt = json.load(f)
    doc = {
        "seed": int(seed),
        "workload": "grpo_sat",
        "order": "oracle longest first",
        "command": f"kvbench --workload grpo_sat --seed {seed} --oracle-longest-first",
        "fifo_verl_default": fifo["policies"]["verl_default"]["makespan_s"],
        "policies": {k: {"makespan_s": v["makespan_s"], "hit_rate": v["hit_rate"], "ttft_p99_s": v["ttft_p99_s"]}
                     for k, v in lpt["policies"].items()},
    }
    with open(os.path.join(d, f"oracle-lpt-{seed}.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
