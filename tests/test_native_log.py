"""The library's log (its collectors') reaches the host: by default as
Python logging records on ``kvc_router.native``, with ``KVC_ROUTER_LOG=stderr``
as logfmt text on stderr. A server whose /metrics cannot be reached is
logged once, with its URL and the reason, however many scrapes fail."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

from kvc_router import KVCAwareBalancer, _logs

HERE = os.path.dirname(os.path.abspath(__file__))


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _config():
    """kvc_aware scraping /metrics only, every 20 ms (retries at most 40 ms apart)."""
    return {"type": "kvc_aware", "config": {
        "strategies": [{"_target_": "kvc_router.config.KVCAwareStrategyConfig", "collector_names": ["vllm_metrics"]}],
        "collector": {"interval_ms": 20, "backoff_max_ms": 40}}}


def test_unreachable_metrics_server_logged_once_with_url_and_reason(caplog):
    caplog.set_level(logging.WARNING, logger=_logs.LOGGER)
    sid = f"127.0.0.1:{_dead_port()}"
    lb = KVCAwareBalancer({sid: None}, router_config=_config())
    try:
        deadline, st = time.monotonic() + 10, {"errors": 0}
        while time.monotonic() < deadline:
            targets = lb.get_status()["router"]["collectors"]["collectors"]["vllm_metrics"]
            st = targets[0] if targets else st
            if st["errors"] >= 5 and any(r.name == _logs.LOGGER for r in caplog.records):
                break
            time.sleep(0.05)
    finally:
        lb.close()
    lines = [r for r in caplog.records if r.name == _logs.LOGGER and "cannot scrape" in r.getMessage()]
    assert st["errors"] >= 5, st
    assert len(lines) == 1, [r.getMessage() for r in lines]  # 5+ failed scrapes, one line
    rec = lines[0]
    assert rec.levelno == logging.WARNING
    assert rec.kvc["url"] == f"http://{sid}/metrics" and rec.kvc["server"] == sid
    assert "connection refused" in rec.kvc["err"] and f"url=http://{sid}/metrics" in rec.getMessage()


def test_log_to_stderr_when_asked():
    child = (
        "import time\n"
        "from kvc_router import KVCAwareBalancer\n"
        f"lb = KVCAwareBalancer({{'127.0.0.1:{_dead_port()}': None}}, router_config={_config()!r})\n"
        "time.sleep(1.0)\n"
        "lb.close()\n"
    )
    env = dict(os.environ, KVC_ROUTER_LOG="stderr")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if 'msg="metrics: cannot scrape server"' in ln]
    assert len(lines) == 1 and "level=WARN" in lines[0] and "connection refused" in lines[0], out.stderr[-2000:]


def test_emit_maps_levels_and_keeps_broken_lines(caplog):
    caplog.set_level(logging.DEBUG, logger="t")
    log = logging.getLogger("t")
    _logs.emit(json.dumps({"time": "x", "level": "ERROR", "msg": "kv events: boom", "server": "a b"}).encode(), log)
    _logs.emit(b'{"time": "x", "level": "DEBUG", "msg": "m"}', log)
    _logs.emit(b'{"level": "WARN", "msg": "cut', log)  # a dropped tail: kept as text
    _logs.emit(b"", log)
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [
        (logging.ERROR, 'kv events: boom server="a b"'),
        (logging.DEBUG, "m"),
        (logging.WARNING, '{"level": "WARN", "msg": "cut'),
    ]
