"""The native library's log (its collectors': scrape failures, KV-event
gaps, reconnects) as Python ``logging`` records.

On first load :mod:`kvc_router._native` gives the library the write end of a
pipe (``kvr_set_log_fd``); a daemon thread reads one JSON object per line
and re-emits it on the ``kvc_router.native`` logger at the record's level,
so the host's logging configuration (handlers, levels, Ray's worker log
capture) applies. The message is the library's ``msg`` followed by its
attributes as ``key=value``; the attributes are also on the record as
``record.kvc`` (a dict). The library's own ``log_level`` (default ``warn``)
filters first.

``KVC_ROUTER_LOG=stderr`` keeps the library writing logfmt text straight to
the process's stderr instead (no thread, no pipe).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Dict, Optional

ENV = "KVC_ROUTER_LOG"
LOGGER = "kvc_router.native"

_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR}
_reader: Optional[threading.Thread] = None


def wanted() -> bool:
    """Whether the log goes through Python's logging (the default)."""
    return os.environ.get(ENV, "python").strip().lower() != "stderr"


def _value(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v)
    return json.dumps(s) if (not s or any(c in s for c in ' "=')) else s


def emit(line: bytes, logger: Optional[logging.Logger] = None) -> None:
    """Re-emits one line of the library's log; a line that is not a JSON
    object (a truncated one) is logged as it is, at WARNING."""
    log = logger or logging.getLogger(LOGGER)
    text = line.decode("utf-8", "replace").strip()
    if not text:
        return
    try:
        rec: Dict[str, Any] = json.loads(text)
        if not isinstance(rec, dict):
            raise ValueError("not an object")
    except ValueError:
        log.warning("%s", text)
        return
    rec.pop("time", None)
    level = _LEVELS.get(str(rec.pop("level", "WARN")).upper(), logging.WARNING)
    msg = str(rec.pop("msg", ""))
    if log.isEnabledFor(level):
        attrs = " ".join(f"{k}={_value(v)}" for k, v in rec.items())
        log.log(level, "%s%s", msg, f" {attrs}" if attrs else "", extra={"kvc": rec})


def _read(fd: int) -> None:
    buf = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for ln in lines:
            try:
                emit(ln)
            except Exception:  # noqa: BLE001 - a logging error must not end the reader
                pass


def route(lib: Any) -> bool:
    """Hands the library a pipe and starts the reader; once per process.
    Returns whether the log now goes through Python's logging."""
    global _reader
    if _reader is not None:
        return True
    if not wanted() or not hasattr(lib, "kvr_set_log_fd"):
        return False
    from ctypes import byref, c_void_p

    r, w = os.pipe()  # not inheritable: children never hold the write end
    err = c_void_p()
    if lib.kvr_set_log_fd(w, byref(err)) != 0:
        os.close(r)
        os.close(w)
        if err.value:
            lib.kvr_free(err)
        return False
    _reader = threading.Thread(target=_read, args=(r,), name="kvc-router-native-log", daemon=True)
    _reader.start()
    return True
