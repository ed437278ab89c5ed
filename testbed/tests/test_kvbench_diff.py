"""testbed/scripts/kvbench_diff.py: a refactor's routing must match on fixed seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "testbed", "scripts", "kvbench_diff.py")

RUN = {"policies": {"kvc_aware": {"hit_rate": 0.71, "makespan_s": 93.0, "decision_p50_us": 190.0}}}


def run(tmp_path, a, b):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    return subprocess.run([sys.executable, SCRIPT, str(pa), str(pb)], capture_output=True, text=True, timeout=60)


def test_wall_clock_fields_may_differ(tmp_path):
    b = json.loads(json.dumps(RUN))
    b["policies"]["kvc_aware"]["decision_p50_us"] = 330.0
    r = run(tmp_path, RUN, b)
    assert r.returncode == 0, r.stdout
    assert "0 routing differences" in r.stdout


def test_a_routing_outcome_may_not(tmp_path):
    b = json.loads(json.dumps(RUN))
    b["policies"]["kvc_aware"]["hit_rate"] = 0.70
    r = run(tmp_path, RUN, b)
    assert r.returncode == 1
    assert "/policies/kvc_aware/hit_rate: 0.71 -> 0.7" in r.stdout
