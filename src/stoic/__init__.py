"""stoic: resilience policies whose every decision is a named event.

The public surface is re-exported here; the work lives in private modules.
"""

from ._attempt import Attempt
from ._budget import RetryBudget
from ._classify import Retryable, RetryClassifier, RetryDecision, RetryNesting
from ._clock import SYSTEM_CLOCK, Clock, SystemClock, current_clock, use_clock
from ._criticality import Criticality, bind_criticality, current_criticality
from ._deadline import ClockMismatch, Timeout, cancelled_by_deadline, deadline, time_remaining, timeout
from ._durations import Seconds
from ._errors import (
    BudgetExhausted,
    BulkheadFull,
    CircuitOpen,
    DeadlineExceeded,
    Defect,
    RateLimited,
    Rejected,
    RejectionReason,
    Shed,
    Throttled,
    is_defect,
)
from ._policy import Policy
from ._retry import recur, retry, retry_sync, retrying
from .adaptive import AdaptiveBulkhead, GradientBulkhead
from .breaker import BreakerSnapshot, BreakerState, CircuitBreaker, CountWindow, OpenDuration, TimeWindow
from .bulkhead import BlockingBulkhead, Bulkhead
from .control import ControlPlane, PolicyState, UnknownPolicy
from .events import CATALOG, Event, Level, LoggingSink, Sink, add_sink, remove_sink, use_sinks
from .fallback import with_fallback
from .hedge import IDEMPOTENT, Hedge, Idempotency, hedge
from .keyed import Keyed
from .pipeline import Pipeline, Retrying
from .ratelimiter import BlockingRateLimiter, RateLimiter
from .schedule import BoundedSchedule, Schedule
from .throttle import AdaptiveThrottle

__version__ = "0.1.0"

__all__ = [
    "CATALOG",
    "IDEMPOTENT",
    "SYSTEM_CLOCK",
    "AdaptiveBulkhead",
    "AdaptiveThrottle",
    "Attempt",
    "BlockingBulkhead",
    "BlockingRateLimiter",
    "BoundedSchedule",
    "BreakerSnapshot",
    "BreakerState",
    "BudgetExhausted",
    "Bulkhead",
    "BulkheadFull",
    "CircuitBreaker",
    "CircuitOpen",
    "Clock",
    "ClockMismatch",
    "ControlPlane",
    "CountWindow",
    "Criticality",
    "DeadlineExceeded",
    "Defect",
    "Event",
    "GradientBulkhead",
    "Hedge",
    "Idempotency",
    "Keyed",
    "Level",
    "LoggingSink",
    "OpenDuration",
    "Pipeline",
    "Policy",
    "PolicyState",
    "RateLimited",
    "RateLimiter",
    "Rejected",
    "RejectionReason",
    "RetryBudget",
    "RetryClassifier",
    "RetryDecision",
    "RetryNesting",
    "Retryable",
    "Retrying",
    "Schedule",
    "Seconds",
    "Shed",
    "Sink",
    "SystemClock",
    "Throttled",
    "TimeWindow",
    "Timeout",
    "UnknownPolicy",
    "__version__",
    "add_sink",
    "bind_criticality",
    "cancelled_by_deadline",
    "current_clock",
    "current_criticality",
    "deadline",
    "hedge",
    "is_defect",
    "recur",
    "remove_sink",
    "retry",
    "retry_sync",
    "retrying",
    "time_remaining",
    "timeout",
    "use_clock",
    "use_sinks",
    "with_fallback",
]
