"""stoic: resilience policies whose every decision is a named event.

The public surface is re-exported here; the work lives in private modules.
"""

from ._attempt import Attempt
from ._budget import RetryBudget
from ._clock import SYSTEM_CLOCK, Clock, SystemClock, current_clock, use_clock
from ._deadline import Timeout, cancelled_by_deadline, deadline, time_remaining, timeout
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
    is_defect,
)
from ._policy import Policy
from .bulkhead import BlockingBulkhead, Bulkhead
from .events import CATALOG, Event, Level, LoggingSink, Sink, add_sink, remove_sink, use_sinks
from .ratelimiter import BlockingRateLimiter, RateLimiter

__version__ = "0.1.0"

__all__ = [
    "CATALOG",
    "SYSTEM_CLOCK",
    "Attempt",
    "BlockingBulkhead",
    "BlockingRateLimiter",
    "BudgetExhausted",
    "Bulkhead",
    "BulkheadFull",
    "CircuitOpen",
    "Clock",
    "DeadlineExceeded",
    "Defect",
    "Event",
    "Level",
    "LoggingSink",
    "Policy",
    "RateLimited",
    "RateLimiter",
    "Rejected",
    "RejectionReason",
    "RetryBudget",
    "Seconds",
    "Sink",
    "SystemClock",
    "Timeout",
    "__version__",
    "add_sink",
    "cancelled_by_deadline",
    "current_clock",
    "deadline",
    "is_defect",
    "remove_sink",
    "time_remaining",
    "timeout",
    "use_clock",
    "use_sinks",
]
