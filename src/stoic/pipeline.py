"""Retrying (retry as a pipeline stage) and Pipeline (seed 000, "Retrying", "Semantics").

Errors are flat by construction in Python: every stage runs "the rest of the pipeline" as its
operation, an inner policy's refusal is an ordinary exception (a :class:`stoic.Rejected`)
that outer stages see as the operation's error, and the caller sees either the operation's own
exception or the refusing policy's rejection, never a wrapper.

Recommended order, outermost first: overall timeout (``stoic.timeout`` around the call) ->
``Retrying`` -> ``CircuitBreaker`` -> ``RateLimiter`` -> ``Bulkhead`` -> attempt timeout
(``stoic.timeout`` inside the operation) -> the operation. Retry sits outside the breaker so
each attempt is judged and an open breaker's ``retry_after`` shapes the backoff; the breaker
sits outside the limiter and bulkhead so local load-shedding never reaches its window; the
attempt timeout is innermost so a hung call is a slow, failed call to the breaker.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from . import _random, _source
from ._attempt import Attempt
from ._budget import _NO_OP, RetryBudget
from ._classify import ClassifierLike, RetryClassifier, RetryNesting
from ._clock import Clock, current_clock
from ._policy import Policy, is_async_callable, not_a_policy, through_method_decorators
from ._retry import (
    _learn_op,
    _Retrier,
    _retrying_execute,
    _run_async,
    _run_sync,
    wants_attempt,
)
from .schedule import BoundedSchedule

__all__ = ["Pipeline", "Retrying"]

P = ParamSpec("P")
R = TypeVar("R")


class Retrying:
    """``retry`` as a reusable :class:`stoic.Policy`, for use alone or as a pipeline stage.

    ``Retrying(schedule, *, label, budget=RetryBudget.PER_CALL_SITE,
    classify=RetryClassifier.standard, nesting=RetryNesting.SINGLE_ATTEMPT, clock=None)``. The
    per-call-site budget is that of this construction (file:line of ``Retrying(...)``), shared
    by every call through it. Sleeps run on ``clock`` (validated: ``TypeError`` naming
    ``clock``), else the ambient clock at construction. ``label`` (keyword, required, a
    non-empty ``str``) names the events.

    ``await execute(fn, *args, **kwargs)`` for coroutine functions, ``call(fn, ...)`` for plain
    ones, or use it as a decorator on either. Semantics, checks and events are :func:`stoic.retry`'s.
    Raises ``TypeError`` at construction for an unbounded schedule, and when decorating a
    generator function; ``call`` raises ``TypeError`` when the function returns a coroutine
    or a generator (never retried).
    """

    __slots__ = ("_clock", "_retrier")

    def __init__(
        self,
        schedule: BoundedSchedule,
        *,
        label: str,
        budget: RetryBudget = RetryBudget.PER_CALL_SITE,
        classify: ClassifierLike = RetryClassifier.standard,
        nesting: RetryNesting = RetryNesting.SINGLE_ATTEMPT,
        clock: Clock | None = None,
    ) -> None:
        self._retrier = _Retrier(schedule, budget, classify, nesting, label, None,
                                 clock if clock is not None else current_clock(), _random.call_site(1))
        self._clock: Clock = self._retrier.clock  # type: ignore[assignment]

    @property
    def schedule(self) -> BoundedSchedule:
        """The schedule every call through this stage runs under (its delays and attempt bound)."""
        return self._retrier.schedule

    @property
    def label(self) -> str:
        """The label carried by this stage's events."""
        return self._retrier.label

    @property
    def budget(self) -> RetryBudget:
        """The bucket calls through this stage draw on (its own, for ``PER_CALL_SITE``)."""
        return self._retrier.bucket

    if TYPE_CHECKING:
        async def execute(self, fn: Callable[..., Awaitable[R]], /, *args: Any, **kwargs: Any) -> R:
            """``await execute(fn, *args, **kwargs)`` runs ``fn`` under the schedule; see :func:`stoic.retry`."""
    else:  # compiled with the first attempt inline (stoic._retry._FIRST_ATTEMPT)
        execute = _retrying_execute
        execute.__qualname__ = "Retrying.execute"
        execute.__module__ = __name__  # (found here by pickle, inspect and docs, as the other methods)
        execute.__name__ = "execute"
        execute.__doc__ = ("``await execute(fn, *args, **kwargs)`` runs ``fn`` under the schedule; see "
                           ":func:`stoic.retry`.")

    def call(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """Run plain ``fn(*args, **kwargs)`` under the schedule; see :func:`stoic.retry_sync`."""
        r = self._retrier
        bucket = r.bucket  # resolved at construction (and again by reset_budgets())
        op = r.op
        wants = (op[1] if getattr(fn, "__code__", None) is op[0] else _learn_op(r, fn)) and "attempt" not in kwargs
        return _run_sync(r.schedule, fn, args, kwargs, r.site, bucket, r.classify, r.nesting, r.label, self._clock,
                         wants)

    def _execute_releasing(self, fn: Callable[[], Awaitable[R]], release: Callable[[], Awaitable[object]]) -> \
            Coroutine[Any, Any, R]:
        """:meth:`execute` of an operation taking no argument, awaiting ``release()`` whenever a
        failed attempt is to be retried, before the backoff sleep (stoic._http: a failed
        response's connection is given back then, not held through the sleep). ``release``
        must not raise."""
        r = self._retrier
        return _run_async(r.schedule, fn, (), {}, r.site, r.bucket, r.classify, r.nesting, r.label, None,
                          self._clock, False, release)

    def _call_releasing(self, fn: Callable[[], R], release: Callable[[], object]) -> R:
        """:meth:`_execute_releasing` for a plain operation (``release`` called, not awaited)."""
        r = self._retrier
        return _run_sync(r.schedule, fn, (), {}, r.site, r.bucket, r.classify, r.nesting, r.label, self._clock,
                         False, release)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate a coroutine function or a plain function."""
        return self._retrier.decorate(fn)

    def __repr__(self) -> str:
        r = self._retrier
        return (f"Retrying({r.schedule!r}, label={r.label!r}, budget={r.budget!r}, classify={r.classify!r}, "
                f"nesting={r.nesting})")


_NOT_GIVEN: Any = object()
"""The decorated wrapper's ``attempt`` default: told apart from an explicit ``attempt=None``."""


class _Rest:
    """The rest of a pipeline from run ``index`` on: what run ``index - 1`` runs as its
    operation. Forwards an ``attempt`` keyword to the user's operation when it wants one."""

    __slots__ = ("args", "fn", "index", "kwargs", "runs", "wants_attempt")

    def __init__(self, runs: tuple[Callable[..., Any], ...], index: int, fn: Callable[..., Awaitable[Any]],
                 args: tuple[Any, ...], kwargs: dict[str, Any], wants: bool) -> None:
        self.runs = runs
        self.index = index
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.wants_attempt = wants

    @property
    def stoic_label(self) -> str:
        """The user's operation's name (what a Retrying stage labels its events with)."""
        return str(getattr(self.fn, "__qualname__", None) or type(self.fn).__qualname__)

    def __call__(self, **attempt: Any) -> Any:
        if not attempt:
            return _enter(self.runs, self.index, self.fn, self.args, self.kwargs, self.wants_attempt)
        # Handed an Attempt (by a Retrying stage): it goes down to the operation as it is, so a
        # Retrying stage further in (collapsed to one attempt inside this one's) passes it on, as
        # a retry given attempt= does, rather than telling every try it is a fresh first attempt.
        return _enter(self.runs, self.index, self.fn, self.args, {**self.kwargs, **attempt},
                      self.wants_attempt and "attempt" not in attempt)


def _enter(runs: tuple[Callable[..., Any], ...], index: int, fn: Callable[..., Awaitable[Any]],
           args: tuple[Any, ...], kwargs: dict[str, Any], wants: bool) -> Any:
    """Run ``index`` running the rest; the last run runs ``fn`` itself unless an Attempt must
    be forwarded (one object and one coroutine fewer per stage-free hop)."""
    if index == len(runs):
        if wants and "attempt" not in kwargs:
            # No Retrying stage handed one down: the operation still declared it, and this is
            # its first and only attempt (as retry() would say).
            kwargs = {**kwargs, "attempt": Attempt(1)}
        return fn(*args, **kwargs)
    if index == len(runs) - 1 and not wants:
        return runs[index](fn, *args, **kwargs)
    return runs[index](_Rest(runs, index + 1, fn, args, kwargs, wants))


# --- fusing: adjacent stages whose admission is a synchronous check, run in one coroutine ------

@functools.cache
def _parts() -> dict[type, Callable[[str, str, str], str]]:
    """The stage kinds that can be fused, each with its part of a call as source (stoic._source):
    exactly these types (a subclass may change what execute does, so it runs its own)."""
    from . import bulkhead, ratelimiter
    from .breaker import CircuitBreaker, _decorate

    return {
        CircuitBreaker: lambda b, p, body: _decorate.stage(b, p, body, True),
        ratelimiter.RateLimiter: ratelimiter.stage,
        bulkhead.Bulkhead: bulkhead.stage,
    }


@functools.lru_cache(maxsize=64)
def _fused_factory(kinds: tuple[type, ...]) -> Callable[..., Callable[..., Any]]:
    """``stoic_make(stage, ..., *shared)`` returning one coroutine function that runs the stages of
    ``kinds``, outermost first, nested in one frame: ``run(fn, *args, **kwargs)`` does what
    ``stages[0].execute(stages[1].execute, ..., fn, *args, **kwargs)`` does, with the same
    checks, events and errors, one coroutine instead of one per stage."""
    from .breaker import CircuitBreaker, _decorate

    parts = _parts()
    body = ("stoic_awaitable = (stoic_fn(*stoic_args, **stoic_kwargs) if stoic_kwargs\n"
            "                   else (stoic_fn(*stoic_args) if stoic_args else stoic_fn()))\n"
            "stoic_result = await stoic_awaitable")
    for index in reversed(range(len(kinds))):
        body = parts[kinds[index]](f"stoic_s{index}", f"s{index}_", body).rstrip("\n")
    stages = ", ".join(f"stoic_s{index}" for index in range(len(kinds)))
    clocks = "".join(f"    stoic_s{index}_now = stoic_s{index}._now\n"
                     for index, kind in enumerate(kinds) if kind is CircuitBreaker)
    source = (f"def stoic_make({stages}, {_decorate.SHARED_PARAMS}):\n{clocks}"
              "    async def stoic_run(stoic_fn, /, *stoic_args, **stoic_kwargs):\n"
              "        stoic_awaitable = None\n"
              f"{_source.indent(_source.indent(body))}\n"
              "        return stoic_result\n"
              "    return stoic_run\n")
    filename = f"<stoic pipeline: {', '.join(kind.__name__ for kind in kinds)}>"
    make: Callable[..., Callable[..., Any]] = _source.compile_source(source, filename, __name__)["stoic_make"]
    return make


def _runs(stages: tuple[Policy, ...]) -> tuple[Callable[..., Any], ...]:
    """The pipeline's runs: each stage's execute, except that two or more adjacent stages of the
    kinds in :func:`_parts` become one fused run (:func:`_fused_factory`)."""
    from .breaker import _decorate

    parts = _parts()
    runs: list[Callable[..., Any]] = []
    group: list[Policy] = []
    for stage in (*stages, None):
        if stage is not None and type(stage) in parts:
            group.append(stage)
            continue
        if len(group) >= 2:
            runs.append(_fused_factory(tuple(type(member) for member in group))(*group, *_decorate.shared()))
        else:
            runs.extend(member.execute for member in group)
        group = []
        if stage is not None:
            runs.append(stage.execute)
    return tuple(runs)


def _flatten(stages: Sequence[object], flat: list[Policy]) -> None:
    """Append ``stages`` to ``flat``, pipelines and lists or tuples of stages flattened;
    ``TypeError`` for anything that is not a Policy (see :class:`Pipeline`)."""
    for stage in stages:
        if isinstance(stage, Pipeline):
            flat.extend(stage._stages)
        elif isinstance(stage, (list, tuple)):
            _flatten(stage, flat)
        elif (refused := not_a_policy(stage, "put the pipeline inside the hedge, hedge.execute(stoic.IDEMPOTENT, "
                                             "pipeline.execute, fn), or hedge.execute(stoic.IDEMPOTENT, "
                                             "pipeline(fn)) when fn declares attempt (pipeline.execute "
                                             "takes none: fn would get Attempt(1) on every hedge)")) is not None:
            raise TypeError(refused)
        elif callable(getattr(stage, "execute", None)):
            flat.append(stage)  # type: ignore[arg-type]
        else:
            raise TypeError(f"a pipeline stage must be a Policy (with an execute method), got {stage!r}")


def _repeated(stages: list[Policy]) -> str:
    """The ``ValueError`` message for flat ``stages`` holding one object more than once."""
    positions: dict[int, list[int]] = {}
    for index, stage in enumerate(stages):
        positions.setdefault(id(stage), []).append(index)
    repeated = []
    for indices in positions.values():
        if len(indices) > 1:
            where = f"{', '.join(map(str, indices[:-1]))} and {indices[-1]}"
            repeated.append(f"{stages[indices[0]]!r} at positions {where}")
    return (f"stages: each stage must be a distinct object, got more than once {'; '.join(repeated)} "
            "(positions from 0, outermost first, nested pipelines and lists flattened): a stage given twice "
            "applies twice to every call (a breaker counts it twice, a bulkhead holds two of its slots); "
            "construct one policy per position, or drop the repeat")


class Pipeline:
    """Policies composed outermost first; itself a :class:`stoic.Policy` (seed 000, "Pipeline").

    ``Pipeline(a, b, c).execute(fn)`` runs ``a.execute(lambda: b.execute(lambda: c.execute(fn)))``.
    A nested ``Pipeline`` is flattened into its stages. Errors stay flat: the caller sees the
    operation's own exception or the refusing stage's :class:`stoic.Rejected`, never a wrapper,
    and each stage sees an inner stage's refusal as its operation's error (so a breaker can
    decline to count it and ``Retrying`` can honour its ``retry_after``). An operation that
    declares ``attempt`` receives the outermost ``Retrying``'s :class:`stoic.Attempt` (with no
    ``Retrying`` stage, ``Attempt(1)``): a ``Retrying`` stage further in passes that one on, as
    a retry given ``attempt=`` does, so every try of one call shares its ``call_id``.

    Raises ``TypeError`` for a stage without an ``execute`` method, for a :class:`stoic.Hedge`
    (not a Policy: it wraps a pipeline from the outside), for a :class:`stoic.Keyed` family (its
    ``execute`` takes a key first: use ``family.get(key)``) and for a policy class in place of an
    instance. Raises ``ValueError`` (naming ``stages``, each repeated stage and its positions,
    0-based, outermost first, after flattening) when one object is a stage more than once: it
    would apply twice to every call (a breaker counting each call twice, a one-slot bulkhead
    refusing every call with its own slot, a ``Retrying`` collapsing inside itself). Stages are
    compared by identity, so distinct policies alike in every setting are distinct stages, and
    one policy may be a stage of several pipelines.
    """

    __slots__ = ("_first", "_runs", "_stages", "op")
    _stages: tuple[Policy, ...]

    def __init__(self, *stages: Policy | Sequence[Policy]) -> None:
        flat: list[Policy] = []
        _flatten(stages, flat)
        if len({id(stage) for stage in flat}) != len(flat):
            raise ValueError(_repeated(flat))
        self._stages = tuple(flat)
        self._runs = runs = _runs(self._stages)
        # The chain, bound once: the outer run gets the next runs as leading positional
        # arguments, each passing the rest on (a Policy's execute runs ``fn(*args, **kwargs)``),
        # so a call allocates nothing per stage.
        # functools.partial prepends them in C: cheaper than building (*inner, fn) per call.
        self._first: Callable[..., Any] | None = (
            None if not runs else runs[0] if len(runs) == 1 else functools.partial(runs[0], *runs[1:]))
        self.op: tuple[object, bool] = _NO_OP  # (code, wants) of the last operation (see _learn_op)

    @property
    def stages(self) -> tuple[Policy, ...]:
        """The stages, outermost first (nested pipelines flattened)."""
        return self._stages

    def execute(self, fn: Callable[..., Awaitable[R]], /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, R]:
        """``await execute(fn, *args, **kwargs)`` runs ``fn`` through every stage, outermost first.

        (A plain method returning the outermost stage's awaitable: no coroutine of its own.)"""
        # Every stage's execute and every operation we are given returns a coroutine in practice;
        # any other awaitable still works at run time.
        op = self.op
        wants = op[1] if getattr(fn, "__code__", None) is op[0] else _learn_op(self, fn)
        first = self._first
        if first is not None and not kwargs and not wants:
            chained: Coroutine[Any, Any, R] = first(fn, *args) if args else first(fn)
            return chained
        # Keywords (which a stage's own keyword parameters could catch on the way down) and an
        # operation wanting its Attempt go through _Rest, one small object per stage.
        run: Coroutine[Any, Any, R] = _enter(self._runs, 0, fn, args, kwargs, "attempt" not in kwargs and wants)
        return run

    @through_method_decorators
    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """Decorate a coroutine function: each call runs through the pipeline.

        When ``fn`` declares ``attempt``, so does the wrapper: a retry or hedge around the
        decorated function hands it its :class:`stoic.Attempt`, which reaches ``fn`` (as one
        passed by the caller would); called without one, ``fn`` gets the pipeline's own."""
        if not is_async_callable(fn):
            raise TypeError("Pipeline decorates coroutine functions (its stages are asynchronous)")
        execute = self.execute

        if wants_attempt(fn):
            @functools.wraps(fn)
            async def attempted(*args: Any, attempt: Any = _NOT_GIVEN, **kwargs: Any) -> R:
                if attempt is not _NOT_GIVEN:  # (an explicit None reaches fn, as through execute)
                    kwargs["attempt"] = attempt
                result: R = await execute(fn, *args, **kwargs)
                return result

            return attempted

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            result: R = await execute(fn, *args, **kwargs)
            return result

        return wrapper

    def __len__(self) -> int:
        return len(self._stages)

    def __repr__(self) -> str:
        return f"Pipeline({', '.join(repr(s) for s in self._stages)})"


if TYPE_CHECKING:  # both are Policies, so a Pipeline can hold them and with_fallback take them

    def _are_policies(retrying: Retrying, pipeline: Pipeline) -> tuple[Policy, Policy]:
        return retrying, pipeline


def retrying_in(policy: object) -> Retrying | None:
    """The :class:`Retrying` that ``policy`` is, or holds as a stage of a :class:`Pipeline` (the
    first), or None: asked by the integrations that must not repeat what a retry would (an HTTP
    stage, an ASGI admission)."""
    for stage in policy._stages if isinstance(policy, Pipeline) else (policy,):
        if isinstance(stage, Retrying):
            return stage
    return None
