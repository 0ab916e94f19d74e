"""The error hierarchy: rejections (a policy refused to run the operation) and defects.

An operation's own exception always propagates unchanged; stoic never wraps it. A policy that
refuses raises a subclass of :class:`Rejected` (design/python.md, "Errors").
"""

from __future__ import annotations

import enum
import functools
import opcode
import re
import sys
import types


class RejectionReason(enum.StrEnum):
    """Why a policy refused to run an operation (``Rejected.reason``)."""

    CIRCUIT_OPEN = "circuit_open"
    RATE_LIMITED = "rate_limited"
    BULKHEAD_FULL = "bulkhead_full"
    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    SHED = "shed"
    THROTTLED = "throttled"

    def __str__(self) -> str:
        return self.value


class Rejected(Exception):
    """A policy refused to run the operation; the operation did not run.

    Attributes: ``reason`` (:class:`RejectionReason`), ``retry_after`` (seconds until trying
    again could succeed, or ``None`` when unknown) and ``label`` (the refusing policy's label).
    """

    reason: RejectionReason = RejectionReason.CIRCUIT_OPEN
    # True for a refusal the dependency itself made (an HTTP 429: stoic.httpx's TooManyRequests),
    # which reached it: the adaptive throttle counts that one as a request not accepted.
    _by_dependency: bool = False

    def __init__(self, message: str = "", *, label: str | None = None, retry_after: float | None = None) -> None:
        self.label = label
        self.retry_after = retry_after
        super().__init__(message or self._default_message())

    def _default_message(self) -> str:
        text = f"{self.reason.value}"
        if self.label is not None:
            text += f" ({self.label})"
        if self.retry_after is not None:
            text += f"; retry after {self.retry_after:.3f}s"
        return text


class CircuitOpen(Rejected):
    """A circuit breaker is open, or half-open with every probe permit taken."""

    reason = RejectionReason.CIRCUIT_OPEN


class RateLimited(Rejected):
    """A rate limiter could not grant the permits in time, or its queue was full."""

    reason = RejectionReason.RATE_LIMITED


class BulkheadFull(Rejected):
    """A bulkhead had every slot and every queue place taken."""

    reason = RejectionReason.BULKHEAD_FULL


class Shed(Rejected):
    """A bulkhead's queue management dropped a parked waiter (seed 003, "Queue management").

    ``cause`` says which rule: ``"sojourn"`` (CoDel: this waiter had waited past its allowance,
    twice the target while the queue stayed congested, the interval otherwise) or ``"priority"``
    (a full prioritized queue made room for a more critical arrival). Retryable: the dependency
    was not asked.
    """

    reason = RejectionReason.SHED

    def __init__(self, message: str = "", *, cause: str = "sojourn", label: str | None = None,
                 retry_after: float | None = None) -> None:
        self.cause = cause
        super().__init__(message, label=label, retry_after=retry_after)

    def _default_message(self) -> str:
        return f"shed ({self.cause}" + (f", {self.label})" if self.label is not None else ")")


class Throttled(Rejected):
    """An adaptive throttle refused the call locally, in proportion to the dependency's recent
    failures (seed 003, "Adaptive throttle"). Retryable: the dependency was not asked."""

    reason = RejectionReason.THROTTLED


class BudgetExhausted(Rejected):
    """A retry budget had no token for another attempt."""

    reason = RejectionReason.BUDGET_EXHAUSTED


class DeadlineExceeded(Rejected, TimeoutError):
    """The ambient deadline passed: raised by :func:`stoic.timeout` when it cuts a block short,
    and by policies that refuse to start (or keep waiting for) work that is already late.
    Also a :class:`TimeoutError`, so existing ``except TimeoutError`` handlers keep working.

    ``timed_out`` is True when a ``stoic.timeout``/``stoic.deadline`` block cut running work
    short (the work ran and took too long: evidence about a dependency), False when a policy
    refused to start or to keep waiting (nothing ran), and when the block's deadline fired while
    it waited in a local stage's queue (a bulkhead's slot, a limiter's permit): local queueing
    was cut, not the dependency (field report 20).
    """

    reason = RejectionReason.DEADLINE_EXCEEDED

    def __init__(
        self, message: str = "", *, label: str | None = None, retry_after: float | None = None,
        timed_out: bool = False,
    ) -> None:
        self.timed_out = timed_out
        super().__init__(message, label=label, retry_after=retry_after)


class Defect(Exception):
    """A bug in our own code, not a sign of the dependency's health.

    Raise it (or subclass it) for programming errors. Policies never count a defect against a
    dependency and never retry it; they re-raise it unchanged.
    """


def is_defect(error: BaseException) -> bool:
    """True when ``error`` is or wraps a :class:`Defect`.

    "Wraps" means: a ``Defect`` in its explicit ``__cause__`` chain, or inside an exception group.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, Defect):
            return True
        if isinstance(current, BaseExceptionGroup) and any(is_defect(inner) for inner in current.exceptions):
            return True
        current = current.__cause__
    return False


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions an error stands for: ``[error]`` itself, or for an exception group (nested
    to any depth) every non-group exception inside it, depth first.

    The exception-group rule (docs/design.md, "Exception groups") is stated over these leaves:
    a group is a rejection when every leaf is one, a defect when any leaf is one, and otherwise
    each classifier judges it by its leaves.
    """
    if not isinstance(error, BaseExceptionGroup):
        return [error]
    found: list[BaseException] = []
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            pending.extend(reversed(current.exceptions))
        else:
            found.append(current)
    return found


def is_rejection(error: BaseException) -> bool:
    """True for a :class:`Rejected`, or an exception group every leaf of which is one (an inner
    policy refused, in every branch of a fan-out); False for anything else."""
    if isinstance(error, Rejected):
        return True
    if not isinstance(error, BaseExceptionGroup):
        return False
    found = leaves(error)
    return bool(found) and all(isinstance(leaf, Rejected) for leaf in found)


def cut_by_deadline(error: BaseException) -> bool:
    """True when ``error``, or a leaf of it (a fan-out's group), is a :class:`DeadlineExceeded`
    that cut running work short (``timed_out``): a hung call, which the policies counting
    failures count, though a deadline is a :class:`Rejected`."""
    return any(isinstance(leaf, DeadlineExceeded) and leaf.timed_out for leaf in leaves(error))


def client_timeout(error: BaseException) -> bool:
    """True for a ``TimeoutError``, or an HTTP client's timeout that is none: httpx's
    ``TimeoutException`` (connect, read, write, pool; aiohttp's are ``TimeoutError`` s)."""
    if isinstance(error, TimeoutError):
        return True
    # Read from sys.modules, never imported: an error can only be of a client's type once that
    # client is imported, so nothing is missed, and the check costs two lookups on error paths.
    httpx = sys.modules.get("httpx")
    kind = getattr(httpx, "TimeoutException", None)
    return isinstance(kind, type) and isinstance(error, kind)


def client_transient(error: BaseException) -> bool:
    """True for a timeout (:func:`client_timeout`), a ``ConnectionError``, or an HTTP client's
    connection failure that is no ``ConnectionError``: httpx's ``NetworkError`` (connect, read,
    write, close) and ``RemoteProtocolError`` (the server dropped the connection mid-answer),
    aiohttp's ``ClientConnectionError`` (``ClientOSError``, ``ServerDisconnectedError``, ...).
    Not the clients' other errors (an unsupported URL scheme, a malformed request, a status),
    nor a certificate that failed verification (:func:`_certificate_refused`)."""
    if isinstance(error, ConnectionError) or client_timeout(error):
        return True
    for module, names in (("httpx", ("NetworkError", "RemoteProtocolError")), ("aiohttp", ("ClientConnectionError",))):
        found = sys.modules.get(module)
        if found is not None:
            for name in names:
                kind = getattr(found, name, None)
                if isinstance(kind, type) and isinstance(error, kind):
                    return not _certificate_refused(error)
    return False


def _certificate_refused(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised from, an ``ssl.SSLCertVerificationError`` (aiohttp's
    certificate error is one; httpx's ``ConnectError`` is raised from it, through httpcore's): it
    fails alike on every attempt, so it is no transient failure."""
    ssl = sys.modules.get("ssl")
    kind = getattr(ssl, "SSLCertVerificationError", None)
    if not isinstance(kind, type):
        return False
    seen = 0
    link: BaseException | None = error
    while link is not None and seen < 8:  # (a few links: httpx -> httpcore -> ssl; never a loop)
        if isinstance(link, kind):
            return True
        link = link.__cause__ or link.__context__
        seen += 1
    return False


# The instruction behind ``await x``'s "can't be used in 'await' expression" (the wording differs
# between Python versions; the instruction raising it does not).
_GET_AWAITABLE = opcode.opmap.get("GET_AWAITABLE", -1)


def failed_await(error: BaseException) -> bool:
    """True when ``error`` was raised by an ``await`` of stoic's own, on something not
    awaitable (what a plain function handed to a policy returned: a generator, async generator,
    ``None`` or other value): the innermost frame of its traceback is stoic's and stopped at that
    instruction. A bug at the call site, never a failure of the awaited work.

    An ``await`` on something not awaitable deeper in, in the operation's own code or a
    library's, is not one: that is the operation failing (a ``TypeError`` like any other, which
    the policies count, retry or hand to a fallback as their classifiers say)."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    name = tb.tb_frame.f_globals.get("__name__")
    return type(name) is str and name.startswith(_OWN) and stopped_at_await(tb)


# The modules whose frames are stoic's (stoic._retry's compiled first attempts run in its globals).
_OWN = __name__.partition(".")[0] + "."


def stopped_at_await(tb: types.TracebackType) -> bool:
    """Whether the frame of traceback entry ``tb`` raised at an ``await`` (its GET_AWAITABLE)."""
    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] == _GET_AWAITABLE


def code_of(fn: object) -> object:
    """The code object a call of operation ``fn`` runs in its own frame (through partials and
    bound methods; a callable object's ``__call__``), or None when there is none to read."""
    for _ in range(8):  # (partials of bound methods of partials: a few levels, never a loop)
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__func__"):
            fn = fn.__func__
        else:
            break
    code = getattr(fn, "__code__", None)
    if code is None and callable(fn) and not isinstance(fn, type):
        code = getattr(type(fn).__call__, "__code__", None)
    return code


def not_bound(error: TypeError, fn: object) -> bool:
    """Whether ``error`` is Python's refusal to call operation ``fn`` with the arguments its
    caller handed a policy (``name() takes 1 positional argument but 2 were given``,
    ``missing``, ``got an unexpected keyword argument``): its message names ``fn``'s code, and
    no frame of that code ever ran (a wrong call inside the operation, its own failure, runs
    under its frame). The call site is wrong: a breaker that counted it would let one buggy
    caller open the circuit for everyone, a fallback that substituted it would answer every
    call while the real call never runs.

    Also such a refusal raised where an inner stage of stoic's called the operation (``fn`` is
    then that stage's ``execute``, in a pipeline): the innermost frame of the traceback is
    stoic's, stopped at a call, and the message has the binding error's shape. And ``fn`` not
    callable at all (``retry(schedule, fetch())``: the operation's coroutine handed over in
    place of the operation), which no arguments can call."""
    if _refused_in_own_call(error) or not callable(fn):
        return True
    code = code_of(fn)
    if not isinstance(code, types.CodeType):
        return False
    message = error.args[0] if len(error.args) == 1 else None
    if type(message) is not str or not message.startswith(code.co_qualname + "() "):
        return False
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return False
        tb = tb.tb_next
    return True


# Python's refusal to bind a call's arguments ("f() takes 1 positional argument but 2 were
# given", "f() missing 1 required ...", "f() got an unexpected keyword argument 'x'", "got
# multiple values", "len() takes exactly one argument (2 given)"), or to call at all ("'coroutine'
# object is not callable").
_BINDING = re.compile(r"[\w.<>]+\(\) (?:takes |missing |got )|'[\w.]+' object is not callable$")
_CALLS = frozenset(opcode.opmap[name] for name in ("CALL", "CALL_FUNCTION_EX", "CALL_KW") if name in opcode.opmap)


def _refused_in_own_call(error: TypeError) -> bool:
    """Whether ``error`` is a binding refusal raised by a call in a frame of stoic's own, the
    innermost: the called function never got a frame, so it is the call, not the callee."""
    tb = error.__traceback__
    message = error.args[0] if len(error.args) == 1 else None
    if tb is None or type(message) is not str or not _BINDING.match(message):
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    name = tb.tb_frame.f_globals.get("__name__")
    code = tb.tb_frame.f_code.co_code
    return type(name) is str and name.startswith(_OWN) and 0 <= tb.tb_lasti < len(code) \
        and code[tb.tb_lasti] in _CALLS


def misused(error: BaseException, fn: object) -> bool:
    """Whether ``error`` says operation ``fn`` was handed to a policy wrongly: the ``TypeError``
    of an ``await`` of stoic's on what a plain function returned (:func:`failed_await`), or of
    calling ``fn`` with arguments it does not take (:func:`not_bound`). The misuse rule, the same
    in every policy: raised at once and unchanged, never retried or hedged, never counted
    against the dependency, and neither earning nor spending budget tokens (the dependency was
    never asked)."""
    return type(error) is TypeError and (failed_await(error) or not_bound(error, fn))


def close_unrun(fn: object) -> None:
    """Close ``fn`` when it is a coroutine handed to a policy in place of the operation (refused
    as misused): it will never run, so it must not warn "never awaited" on top of the error."""
    if isinstance(fn, types.CoroutineType):
        fn.close()
