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
import weakref
from typing import Any

_log = logging.getLogger("stoic")
# Callbacks already reported: weakly (a per-request lambda must not live for ever because it
# failed once), by function and instance for a bound method (a new object per access), and by id
# in a small bounded set for the rare callable that takes no weak reference.
_reported: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()
_reported_ids: dict[int, None] = {}
_MAX_IDS = 1024
_lock = threading.Lock()


def _first_report(callback: object) -> bool:
    func = getattr(callback, "__func__", None)
    owner = id(getattr(callback, "__self__", None)) if func is not None else 0
    target = func if func is not None else callback
    with _lock:
        try:
            owners = _reported.setdefault(target, set())
        except TypeError:  # no weak reference to it
            key = id(target) ^ owner
            if key in _reported_ids:
                return False
            if len(_reported_ids) >= _MAX_IDS:
                _reported_ids.pop(next(iter(_reported_ids)))
            _reported_ids[key] = None
            return True
        if owner in owners:
            return False
        owners.add(owner)
        return True


def callback_failed(callback: object, role: str, failure: BaseException, error: BaseException) -> None:
    """Record that ``callback`` (the policy's ``role``, e.g. ``"classify"``) raised
    ``failure`` while judging ``error``: chain ``failure`` into ``error``'s context (unless
    ``error`` already has one) and report it, the first time for this callback only."""
    if error.__context__ is None and failure is not error:
        error.__context__ = failure
    try:
        _report(callback, role, failure, error)
    except Exception:  # nor may reporting it (a callback whose __hash__ raises, a failure whose __str__ does)
        pass


def _report(callback: object, role: str, failure: BaseException, error: BaseException) -> None:
    if not _first_report(callback):
        return
    name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    try:
        text = str(failure)
    except Exception:
        text = "<the exception's str() raised>"
    message = (f"stoic: the {role} callback {name} raised {type(failure).__qualname__}: {text} "
               f"(while judging {type(error).__qualname__}); the policy took its conservative decision "
               "and this callback's later failures are not reported again")
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Warning:  # warnings turned into errors must not replace the operation's error either
        pass
    _log.error(message, exc_info=failure)
