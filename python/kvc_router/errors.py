"""Exceptions raised by kvc_router.

* :class:`ConfigError` (a ``ValueError``): a configuration value is wrong; the
  message names the key path and the allowed values.
* :class:`NoServerError` (a ``RuntimeError``): the pool is empty. Its message is
  exactly verl's ``"No available servers in load balancer"``, so callers that
  match on the text keep working through Ray's exception wrapping.
* :class:`NativeError` (a ``RuntimeError``): the native library reported an
  error; ``code`` is its status code. Subclasses refine it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

NO_SERVERS_MESSAGE = "No available servers in load balancer"

# Status codes of libkvcrouter, as cabi/kvcrouter.h defines them
# (tests/test_errors.py checks these against the header).
KVR_OK = 0
KVR_INVALID_ARGUMENT = 1
KVR_NOT_FOUND = 2
KVR_INVALID_STATE = 3
KVR_INTERNAL = 4
KVR_POISONED = 5
KVR_NO_SERVERS = 6
KVR_INVALID_CONFIG = 7
#: kvr_acquire_with with submit: held by admission (not an error).
KVR_HELD = 8
KVR_QUEUE_FULL = 9

CODE_NAMES = {
    KVR_OK: "OK",
    KVR_INVALID_ARGUMENT: "INVALID_ARGUMENT",
    KVR_NOT_FOUND: "NOT_FOUND",
    KVR_INVALID_STATE: "INVALID_STATE",
    KVR_INTERNAL: "INTERNAL",
    KVR_POISONED: "POISONED",
    KVR_NO_SERVERS: "NO_SERVERS",
    KVR_INVALID_CONFIG: "INVALID_CONFIG",
    KVR_HELD: "HELD",
    KVR_QUEUE_FULL: "QUEUE_FULL",
}


class ConfigError(ValueError):
    """A configuration key has an invalid value.

    ``key`` is the dotted key path (e.g. ``router.config.strategies[0].alpha``)
    and ``allowed`` describes the accepted values, when known.
    """

    def __init__(self, message: str, key: Optional[str] = None, allowed: Any = None) -> None:
        super().__init__(message)
        self.key = key
        self.allowed = allowed

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.key, self.allowed))


class NativeError(RuntimeError):
    """An error reported by libkvcrouter; ``code`` is its status code."""

    def __init__(self, message: str, code: int = KVR_INTERNAL) -> None:
        super().__init__(message)
        self.code = code

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, str(self.code))

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.code))


class NoServerError(NativeError):
    """The active pool is empty (verl's exact message)."""

    def __init__(self, message: str = NO_SERVERS_MESSAGE, code: int = KVR_NO_SERVERS) -> None:
        super().__init__(message, code)


class InvalidArgumentError(NativeError, ValueError):
    """The library rejected an input (malformed payload, oversized prompt, ...)."""


class NotFoundError(NativeError):
    """A server id is not in the pool."""


class InvalidStateError(NativeError):
    """The router handle is closed or stale."""


class InternalError(NativeError):
    """A library bug: a recovered Go panic (the handle is then poisoned) or
    an error the library could not classify."""


class PoisonedError(NativeError):
    """The handle saw an earlier panic; create a new balancer."""


class AdmissionQueueFullError(NativeError):
    """Router-side admission already holds ``admission.max_queue`` requests;
    this one was neither routed nor held."""

    def __init__(self, message: str, code: int = KVR_QUEUE_FULL) -> None:
        super().__init__(message, code)


class ForkError(NativeError):
    """The library was loaded before fork(); it cannot be used in the child."""


class NativeConfigError(NativeError, ConfigError):
    """The library rejected the configuration; the message starts with the
    library's key path (kvc_router.config maps it onto the user's key)."""

    def __init__(self, message: str, code: int = KVR_INVALID_CONFIG) -> None:
        NativeError.__init__(self, message, code)
        # kvr_validate_config's {"key", "reason"}: the native key path and
        # the reason, when the error came from it.
        self.key: Optional[str] = None
        self.reason: Optional[str] = None
        self.allowed = None

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.code))


_BY_CODE = {
    KVR_INVALID_ARGUMENT: InvalidArgumentError,
    KVR_NOT_FOUND: NotFoundError,
    KVR_INVALID_STATE: InvalidStateError,
    KVR_INTERNAL: InternalError,
    KVR_POISONED: PoisonedError,
    KVR_NO_SERVERS: NoServerError,
    KVR_INVALID_CONFIG: NativeConfigError,
    KVR_QUEUE_FULL: AdmissionQueueFullError,
}


def error_for(code: int, message: str) -> NativeError:
    """Builds the exception for a library status code."""
    if code == KVR_NO_SERVERS:
        return NoServerError(message or NO_SERVERS_MESSAGE)
    cls = _BY_CODE.get(code, NativeError)
    if cls is NativeError:
        return NativeError(f"{message} (status {code})", code)
    return cls(message, code)


def allowed_text(values: Sequence[Any]) -> str:
    return ", ".join(repr(v) if isinstance(v, str) else str(v) for v in values)


__all__ = [
    "NO_SERVERS_MESSAGE",
    "ConfigError",
    "NativeError",
    "NoServerError",
    "InvalidArgumentError",
    "NotFoundError",
    "InvalidStateError",
    "InternalError",
    "PoisonedError",
    "ForkError",
    "NativeConfigError",
    "AdmissionQueueFullError",
    "error_for",
]
