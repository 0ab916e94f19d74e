"""A user callback that raises: reported once, never in place of the operation's error.

Classifiers, ``retry_decision`` properties, ``record_when`` and fallback predicates are user
code run while stoic decides what to do with an operation's error. When one of them raises,
the policy takes its conservative decision (stop retrying, count the failure, do not fall
back), the operation's own error propagates with the callback's chained as its
``__context__``, and the failure is reported once per callback: a ``RuntimeWarning`` and an
error on the ``"stoic"`` logger (a misconfigured callback fails on every call; one report
says so without flooding the log).
"""

from __future__ import annotations

import logging
import threading
import warnings

_log = logging.getLogger("stoic")
_reported: dict[object, object] = {}  # key -> the callback (kept, so its id is never reused)
_lock = threading.Lock()


def _key(callback: object) -> object:
    # A bound method is a new object per access: key it by its function and instance.
    func = getattr(callback, "__func__", None)
    owner = getattr(callback, "__self__", None)
    return (id(func), id(owner)) if func is not None else id(callback)


def callback_failed(callback: object, role: str, failure: BaseException, error: BaseException) -> None:
    """Record that ``callback`` (the policy's ``role``, e.g. ``"classify"``) raised
    ``failure`` while judging ``error``: chain ``failure`` into ``error``'s context (unless
    ``error`` already has one) and report it, the first time for this callback only."""
    if error.__context__ is None and failure is not error:
        error.__context__ = failure
    key = _key(callback)
    with _lock:
        if key in _reported:
            return
        _reported[key] = callback
    name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    message = (f"stoic: the {role} callback {name} raised {type(failure).__qualname__}: {failure} "
               f"(while judging {type(error).__qualname__}); the policy took its conservative decision "
               "and this callback's later failures are not reported again")
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    except Warning:  # warnings turned into errors must not replace the operation's error either
        pass
    _log.error(message, exc_info=failure)
