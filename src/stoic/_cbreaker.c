/* The circuit breaker's success paths in C (docs/design.md, "Compiled fast paths").
 *
 * This module repeats exactly the closed-state fast path of CircuitBreaker.call, .execute and
 * the @breaker wrapper of a plain function (src/stoic/breaker/_breaker.py, _decorate.py):
 *
 *     deadline check -> closed epoch (else _admit) -> clock -> fn(...) -> clock ->
 *     quick success: epoch.append(None)
 *
 * Everything else (a deadline in scope, admission outside the closed state, a failure, a slow
 * call, a sink wanting DEBUG, a coroutine returned by a plain function) calls back into the
 * Python methods, which stay the single source of the rules.
 *
 * Sections: module state and configure(); helpers shared by the paths; Core (the base type of
 * CircuitBreaker: the hot fields and call()); Execution (the awaitable execute() returns);
 * Wrapper (@breaker on a plain function); the module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <time.h>

#include "_ccompat.h"

/* ------------------------------------------------------------------ module state */

/* Handed over once by _breaker.py through configure(); strong references for the process. */
static PyObject *g_monotonic_ns;   /* time.monotonic_ns: read with clock_gettime instead */
static PyObject *g_deadline_dict;  /* stoic._deadline.__dict__ (its ever_set flag) */
static PyObject *g_deadline_var;   /* the ambient deadline ContextVar */
static PyObject *g_registry;       /* events._sinks._process */
static Py_ssize_t g_floor_offset;  /* where the registry keeps its `floor` slot */
static PyObject *g_min_level;      /* events.min_level */
static PyObject *g_refuse_coroutine;
static PyObject *g_async_results; /* _native.ASYNC_RESULTS: types a plain operation must not return */
static PyObject *g_debug;          /* int(Level.DEBUG) */
static long g_debug_value;
static PyObject *g_zero;

static PyObject *s_ever_set, *s_admit, *s_refuse_if_late, *s_settle, *s_settle_error, *s_close,
    *s_throw, *s_cr_await;

static int
configured(void)
{
    if (g_registry == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "stoic._cbreaker is not configured");
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ helpers */

/* A clock reading: `ns` is valid when `exact` (an int within int64); `obj` holds what a
 * custom clock returned (NULL for the system clock, read in C). */
typedef struct {
    long long ns;
    PyObject *obj;
    int exact;
} Stamp;

/* self._now(): clock_gettime(CLOCK_MONOTONIC) when it is time.monotonic_ns, which reads
 * exactly that on Linux; otherwise the call. -1 with an exception set when the clock raised. */
static int
read_clock(PyObject *now, Stamp *out)
{
    if (now == g_monotonic_ns) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        out->ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        out->obj = NULL;
        out->exact = 1;
        return 0;
    }
    PyObject *value = PyObject_CallNoArgs(now);
    if (value == NULL) {
        return -1;
    }
    out->obj = value;
    out->exact = 0;
    if (PyLong_CheckExact(value)) {
        int overflow;
        out->ns = PyLong_AsLongLongAndOverflow(value, &overflow);
        out->exact = overflow == 0;
    }
    return 0;
}

/* The reading as a Python object (a new reference), for the Python methods. */
static PyObject *
stamp_object(Stamp *stamp)
{
    if (stamp->obj != NULL) {
        return Py_NewRef(stamp->obj);
    }
    return PyLong_FromLongLong(stamp->ns);
}

/* `_deadline.ever_set and _deadline_get() is not None`: 1, 0, or -1 with an exception. */
static int
deadline_in_scope(void)
{
    PyObject *flag = PyDict_GetItemWithError(g_deadline_dict, s_ever_set);
    if (flag == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_AttributeError, "stoic._deadline has no ever_set");
        }
        return -1;
    }
    if (flag == Py_False) {
        return 0;
    }
    if (flag != Py_True) {
        int truth = PyObject_IsTrue(flag);
        if (truth <= 0) {
            return truth;
        }
    }
    PyObject *scope;
    if (PyContextVar_Get(g_deadline_var, NULL, &scope) < 0) {
        return -1;
    }
    int set = scope != NULL && scope != Py_None;
    Py_XDECREF(scope);
    return set;
}

/* `_sinks_registry.floor > DEBUG or min_level() > DEBUG`: 1, 0, or -1 with an exception. */
static int
no_debug_sink(void)
{
    PyObject *floor = *(PyObject **)((char *)g_registry + g_floor_offset);
    if (floor != NULL && PyLong_CheckExact(floor)) {
        int overflow;
        long value = PyLong_AsLongAndOverflow(floor, &overflow);
        if (overflow > 0 || (overflow == 0 && value > g_debug_value)) {
            return 1;
        }
    }
    else {
        if (floor == NULL) {
            PyErr_SetString(PyExc_AttributeError, "floor");
            return -1;
        }
        int above = PyObject_RichCompareBool(floor, g_debug, Py_GT);
        if (above != 0) {
            return above;
        }
    }
    PyObject *level = PyObject_CallNoArgs(g_min_level);
    if (level == NULL) {
        return -1;
    }
    int above = PyObject_RichCompareBool(level, g_debug, Py_GT);
    Py_DECREF(level);
    return above;
}

/* The running operation raised (the exception is set): as the Python `except BaseException as
 * exc: self._settle_error(exc, epoch, probe, start, in_task); raise`. On return an exception is
 * set: the operation's own, unchanged, or one _settle_error raised (its __context__ the
 * operation's, as in Python: the operation's exception is the one being handled meanwhile). */
static void
settle_error(PyObject *breaker, PyObject *epoch, PyObject *probe, Stamp *start, int in_task)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *start_obj = stamp_object(start);
    if (start_obj == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return;
    }
    /* As an except clause: the handled exception is the operation's meanwhile, and afterwards
     * the current slot holds exactly what it held before. (PyErr_GetHandledException would return
     * an enclosing generator's exception, and setting that back would plant it in this one.) */
    _PyErr_StackItem *exc_info = PyThreadState_Get()->exc_info;
    PyObject *handled = exc_info->exc_value;
    exc_info->exc_value = Py_NewRef(value);
    PyObject *argv[6] = {breaker, value, epoch, probe != NULL ? probe : g_zero, start_obj,
                         in_task ? Py_True : Py_False};
    PyObject *r = PyObject_VectorcallMethod(s_settle_error, argv, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                            NULL);
    Py_XSETREF(exc_info->exc_value, handled);
    Py_DECREF(start_obj);
    if (r == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, tb);
}

/* After the operation returned: the quick-success gate, else self._settle(...). 0 or -1. */
static int
settle_success(PyObject *breaker, long long defer_until, long long slow_ns, PyObject *epoch,
               PyObject *probe, Stamp *start, Stamp *end)
{
    long long duration;
    if (start->exact && end->exact && end->ns < defer_until
        && !__builtin_sub_overflow(end->ns, start->ns, &duration) && duration <= slow_ns) {
        int quiet = no_debug_sink();
        if (quiet < 0) {
            return -1;
        }
        if (quiet) {
            /* Counted without the lock (the GIL makes the append atomic), folded later. */
            return PyList_Append(epoch, Py_None);
        }
    }
    /* Not exact int64 readings (a custom clock) take the general path too: same verdict. */
    PyObject *start_obj = stamp_object(start);
    if (start_obj == NULL) {
        return -1;
    }
    PyObject *end_obj = stamp_object(end);
    if (end_obj == NULL) {
        Py_DECREF(start_obj);
        return -1;
    }
    PyObject *argv[6] = {breaker, epoch, probe != NULL ? probe : g_zero, start_obj, end_obj, Py_False};
    PyObject *r = PyObject_VectorcallMethod(s_settle, argv, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(start_obj);
    Py_DECREF(end_obj);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* ------------------------------------------------------------------ Core */

typedef struct {
    PyObject_HEAD
    PyObject *closed_epoch; /* _closed_epoch: the epoch list while closed, else None */
    PyObject *now;          /* _now: the clock's now_ns (or time.monotonic_ns) */
    long long defer_until;  /* _defer_until */
    long long slow_ns;      /* _slow_ns */
} CoreObject;

static PyTypeObject Core_Type;
static PyTypeObject Execution_Type;

/* Admission up to the call: the deadline check, then the closed epoch or self._admit().
 * Sets *epoch (new reference) and *probe (new reference, NULL for 0). 0 or -1. */
static int
admit(CoreObject *self, PyObject **epoch, PyObject **probe)
{
    int late = deadline_in_scope();
    if (late < 0) {
        return -1;
    }
    if (late) {
        PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self, s_refuse_if_late);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    PyObject *closed = self->closed_epoch;
    if (closed == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_closed_epoch");
        return -1;
    }
    if (closed != Py_None) {
        *epoch = Py_NewRef(closed);
        *probe = NULL;
        return 0;
    }
    PyObject *admitted = PyObject_CallMethodNoArgs((PyObject *)self, s_admit);
    if (admitted == NULL) {
        return -1;
    }
    if (!PyTuple_CheckExact(admitted)) {
        /* `epoch, probe = self._admit()` unpacks any iterable (a subclass may return a list). */
        Py_SETREF(admitted, PySequence_Tuple(admitted));
        if (admitted == NULL) {
            return -1;
        }
    }
    if (PyTuple_GET_SIZE(admitted) != 2) {
        if (PyTuple_GET_SIZE(admitted) > 2) {
            PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
        }
        else {
            PyErr_Format(PyExc_ValueError, "not enough values to unpack (expected 2, got %zd)",
                         PyTuple_GET_SIZE(admitted));
        }
        Py_DECREF(admitted);
        return -1;
    }
    *epoch = Py_NewRef(PyTuple_GET_ITEM(admitted, 0));
    *probe = Py_NewRef(PyTuple_GET_ITEM(admitted, 1));
    Py_DECREF(admitted);
    return 0;
}

/* The whole sync path: CircuitBreaker.call and the @breaker wrapper of a plain function. */
static PyObject *
run_sync(CoreObject *self, PyObject *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!configured()) {
        return NULL;
    }
    PyObject *epoch, *probe;
    if (admit(self, &epoch, &probe) < 0) {
        return NULL;
    }
    PyObject *now = self->now;
    if (now == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_now");
        goto fail;
    }
    Py_INCREF(now);
    Stamp start, end;
    if (read_clock(now, &start) < 0) {
        Py_DECREF(now);
        goto fail;
    }
    PyObject *result = PyObject_Vectorcall(fn, args, nargsf, kwnames);
    if (result != NULL && is_async_result(result, g_async_results)) {
        /* An async function given to the sync path (execute() and an async @breaker wrapper
         * return an Execution where Python returns a coroutine): _refuse_coroutine closes it
         * and raises. */
        PyObject *r = PyObject_CallFunctionObjArgs(g_refuse_coroutine, fn, result, NULL);
        Py_XDECREF(r);
        Py_CLEAR(result);
        if (r != NULL) {
            PyErr_SetString(PyExc_SystemError, "_refuse_coroutine returned");
        }
    }
    if (result == NULL) {
        settle_error((PyObject *)self, epoch, probe, &start, 0);
        Py_XDECREF(start.obj);
        Py_DECREF(now);
        goto fail;
    }
    if (read_clock(now, &end) < 0) {
        Py_XDECREF(start.obj);
        Py_DECREF(now);
        Py_DECREF(result);
        goto fail;
    }
    Py_DECREF(now);
    int settled = settle_success((PyObject *)self, self->defer_until, self->slow_ns, epoch, probe, &start,
                                 &end);
    Py_XDECREF(start.obj);
    Py_XDECREF(end.obj);
    Py_DECREF(epoch);
    Py_XDECREF(probe);
    if (settled < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
fail:
    Py_DECREF(epoch);
    Py_XDECREF(probe);
    return NULL;
}

PyDoc_STRVAR(core_call_doc,
"call($self, fn, /, *args, **kwargs)\n--\n\n"
"Run the plain function ``fn(*args, **kwargs)`` through the breaker (thread-safe).\n"
"\n"
"The same decisions and exceptions as :meth:`execute`; the lock is never held while\n"
"``fn`` runs, so calls from many threads run concurrently. Raises ``TypeError`` (never\n"
"counted: it is a bug, not the dependency's health) when ``fn`` returns a coroutine: an\n"
"async function goes through :meth:`execute`.");

static PyObject *
core_call(CoreObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "call() missing 1 required positional argument: 'fn'");
        return NULL;
    }
    /* No PY_VECTORCALL_ARGUMENTS_OFFSET: args[0] belongs to our caller (it may be a tuple's). */
    return run_sync(self, args[0], args + 1, (size_t)(nargs - 1), kwnames);
}

static PyObject *execution_new(CoreObject *breaker, PyObject *fn, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames, PyObject *origin);

PyDoc_STRVAR(core_execute_doc,
"execute($self, fn, /, *args, **kwargs)\n--\n\n"
"Run ``await fn(*args, **kwargs)`` through the breaker and return its result.\n"
"\n"
"Raises :class:`stoic.CircuitOpen` without running ``fn`` when the breaker is open\n"
"(``retry_after`` = seconds left, ``None`` when forced open) or half-open with every\n"
"probe permit taken (``retry_after`` ``None``); :class:`stoic.DeadlineExceeded` when the\n"
"ambient deadline has already passed. Otherwise ``fn``'s own result or exception,\n"
"unchanged. A cancelled caller, a :class:`stoic.Defect` and an inner rejection are\n"
"never counted; ``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit`` and\n"
"``asyncio.CancelledError`` pass through uncounted.");

static PyObject *
core_execute(CoreObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "execute() missing 1 required positional argument: 'fn'");
        return NULL;
    }
    return execution_new(self, args[0], args + 1, nargs - 1, kwnames, NULL);
}

static int
core_traverse(CoreObject *self, visitproc visit, void *arg)
{
    /* (A heap subclass's traverse visits its type before calling this one.) */
    Py_VISIT(self->closed_epoch);
    Py_VISIT(self->now);
    return 0;
}

static int
core_clear(CoreObject *self)
{
    Py_CLEAR(self->closed_epoch);
    Py_CLEAR(self->now);
    return 0;
}

static void
core_dealloc(CoreObject *self)
{
    /* (A heap subclass's dealloc releases its type after calling this one.) */
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
core_get_defer_until(CoreObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->defer_until);
}

/* Instants beyond int64 are clamped: for any int64 clock reading `end`, `end < value` keeps
 * its truth (readings outside int64 never take the quick path anyway). */
static int
core_set_defer_until(CoreObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete _defer_until");
        return -1;
    }
    if (PyFloat_Check(value) && isnan(PyFloat_AS_DOUBLE(value))) {
        self->defer_until = LLONG_MIN;  /* `end < nan` is never true */
        return 0;
    }
    if (PyFloat_Check(value) && isinf(PyFloat_AS_DOUBLE(value))) {
        self->defer_until = PyFloat_AS_DOUBLE(value) > 0 ? LLONG_MAX : LLONG_MIN;
        return 0;
    }
    /* A clock reading nanoseconds as floats (or another real) makes a non-int instant: for an
     * int `end`, `end < value` is `end < ceil(value)`. */
    PyObject *whole = PyLong_Check(value) ? Py_NewRef(value) : PyObject_CallMethod(value, "__ceil__", NULL);
    if (whole == NULL) {
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(whole, &overflow);
    Py_DECREF(whole);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    self->defer_until = overflow > 0 ? LLONG_MAX : overflow < 0 ? LLONG_MIN : v;
    return 0;
}

static PyMethodDef core_methods[] = {
    {"call", (PyCFunction)(void (*)(void))core_call, METH_FASTCALL | METH_KEYWORDS, core_call_doc},
    {"execute", (PyCFunction)(void (*)(void))core_execute, METH_FASTCALL | METH_KEYWORDS, core_execute_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef core_members[] = {
    {"_closed_epoch", T_OBJECT_EX, offsetof(CoreObject, closed_epoch), 0, NULL},
    {"_now", T_OBJECT_EX, offsetof(CoreObject, now), 0, NULL},
    {"_slow_ns", T_LONGLONG, offsetof(CoreObject, slow_ns), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"_defer_until", (getter)core_get_defer_until, (setter)core_set_defer_until, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Core_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stoic._cbreaker.Core",
    .tp_doc = "The breaker's hot fields and its compiled call()/execute() success paths.",
    .tp_basicsize = sizeof(CoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_methods = core_methods,
    .tp_members = core_members,
    .tp_getset = core_getset,
};

/* ------------------------------------------------------------------ Execution: execute()'s awaitable */

/* The coroutine `CircuitBreaker.execute(fn, *args, **kwargs)` would be, as an object: nothing
 * happens until the first send; then it admits, calls fn, and delegates to fn's awaitable as
 * `await` does; send/throw/close behave as on that coroutine. The arguments are kept inline
 * (items[0] is a spare slot for PY_VECTORCALL_ARGUMENTS_OFFSET). */

enum { EX_NEW, EX_RUNNING, EX_DONE };

typedef struct {
    PyObject_VAR_HEAD
    CoreObject *breaker;
    PyObject *fn;
    PyObject *origin; /* the @breaker wrapper that made it (its name), or NULL for execute() */
    PyObject *kwnames;
    PyObject *inner;  /* the awaited iterator while in flight */
    PyObject *epoch;
    PyObject *probe;  /* NULL for 0 */
    PyObject *now;
    Stamp start;
    Py_ssize_t nargs;
    char state;
    char executing;   /* inside send/throw/close: re-entry is an error, as for a coroutine */
    PyObject *items[1];
} ExecutionObject;

static PyObject *
execution_new(CoreObject *breaker, PyObject *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
              PyObject *origin)
{
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    ExecutionObject *self = PyObject_GC_NewVar(ExecutionObject, &Execution_Type, 1 + nargs + nkw);
    if (self == NULL) {
        return NULL;
    }
    self->breaker = (CoreObject *)Py_NewRef(breaker);
    self->fn = Py_NewRef(fn);
    self->origin = Py_XNewRef(origin);
    self->kwnames = Py_XNewRef(kwnames);
    self->inner = NULL;
    self->epoch = NULL;
    self->probe = NULL;
    self->now = NULL;
    self->start.obj = NULL;
    self->start.ns = 0;
    self->start.exact = 0;
    self->nargs = nargs;
    self->state = EX_NEW;
    self->executing = 0;
    self->items[0] = NULL;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        self->items[1 + i] = Py_NewRef(args[i]);
    }
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* Drop everything the finished coroutine's frame held. */
static void
execution_finish(ExecutionObject *self)
{
    self->state = EX_DONE;
    Py_CLEAR(self->inner);
    Py_CLEAR(self->epoch);
    Py_CLEAR(self->probe);
    Py_CLEAR(self->now);
    Py_CLEAR(self->start.obj);
    Py_CLEAR(self->fn);
    Py_CLEAR(self->kwnames);
    for (Py_ssize_t i = 1; i < Py_SIZE(self); i++) {
        Py_CLEAR(self->items[i]);
    }
}

/* An exception leaves the coroutine: as for any coroutine, a StopIteration becomes a
 * RuntimeError. Always returns PYGEN_ERROR. */
static PySendResult
execution_raise(ExecutionObject *self)
{
    execution_finish(self);
    if (PyErr_ExceptionMatches(PyExc_StopIteration)) {
        replace_stop_iteration("coroutine raised StopIteration");
    }
    return PYGEN_ERROR;
}

/* An exception raised at the `await` (or by fn(...)): the except clause settles, re-raises. */
static PySendResult
execution_fail(ExecutionObject *self)
{
    settle_error((PyObject *)self->breaker, self->epoch, self->probe, &self->start, 1);
    return execution_raise(self);
}

/* The awaited operation returned `value` (a new reference). */
static PySendResult
execution_return(ExecutionObject *self, PyObject *value, PyObject **result)
{
    Py_CLEAR(self->inner);
    Stamp end;
    if (read_clock(self->now, &end) < 0) {
        Py_DECREF(value);
        return execution_raise(self);
    }
    CoreObject *b = self->breaker;
    int settled = settle_success((PyObject *)b, b->defer_until, b->slow_ns, self->epoch, self->probe,
                                 &self->start, &end);
    Py_XDECREF(end.obj);
    if (settled < 0) {
        Py_DECREF(value);
        return execution_raise(self);
    }
    execution_finish(self);
    *result = value;
    return PYGEN_RETURN;
}

static PySendResult
execution_resume(ExecutionObject *self, PyObject *value, PyObject **result)
{
    PyObject *out;
    PySendResult status = PyIter_Send(self->inner, value, &out);
    if (status == PYGEN_NEXT) {
        *result = out;
        return PYGEN_NEXT;
    }
    Py_CLEAR(self->inner);
    if (status == PYGEN_RETURN) {
        return execution_return(self, out, result);
    }
    return execution_fail(self);
}

/* The first send: everything execute()'s body does up to its `await`, then the first step. */
static PySendResult
execution_start(ExecutionObject *self, PyObject *value, PyObject **result)
{
    if (value != Py_None) {
        PyErr_SetString(PyExc_TypeError, "can't send non-None value to a just-started coroutine");
        return PYGEN_ERROR;
    }
    self->state = EX_RUNNING;
    if (!configured()) {
        return execution_raise(self);
    }
    CoreObject *b = self->breaker;
    if (admit(b, &self->epoch, &self->probe) < 0) {
        return execution_raise(self);
    }
    if (b->now == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_now");
        return execution_raise(self);
    }
    self->now = Py_NewRef(b->now);
    if (read_clock(self->now, &self->start) < 0) {
        return execution_raise(self);
    }
    PyObject *awaitable = PyObject_Vectorcall(self->fn, self->items + 1,
                                              (size_t)self->nargs | PY_VECTORCALL_ARGUMENTS_OFFSET, self->kwnames);
    if (awaitable == NULL) {
        return execution_fail(self);
    }
    self->inner = awaitable_iter(awaitable, s_cr_await);
    Py_DECREF(awaitable);
    if (self->inner == NULL) {
        return execution_fail(self);
    }
    return execution_resume(self, Py_None, result);
}

static PySendResult
execution_am_send(ExecutionObject *self, PyObject *value, PyObject **result)
{
    if (self->executing) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return PYGEN_ERROR;
    }
    if (self->state == EX_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return PYGEN_ERROR;
    }
    self->executing = 1;
    Py_INCREF(self);
    PySendResult status = self->state == EX_NEW ? execution_start(self, value, result)
                                                : execution_resume(self, value, result);
    self->executing = 0;
    Py_DECREF(self);
    return status;
}

/* A send's outcome as a method returns it: the yielded value, or StopIteration(result). */
static PyObject *
as_method_result(PySendResult status, PyObject *result)
{
    if (status == PYGEN_NEXT) {
        return result;
    }
    if (status == PYGEN_RETURN) {
        if (result == Py_None) {
            PyErr_SetNone(PyExc_StopIteration);
        }
        else {
            set_stop_iteration(result);
        }
        Py_DECREF(result);
    }
    return NULL;
}

static PyObject *
execution_send(ExecutionObject *self, PyObject *value)
{
    PyObject *result = NULL;
    PySendResult status = execution_am_send(self, value, &result);
    return as_method_result(status, result);
}

static PyObject *
execution_iternext(ExecutionObject *self)
{
    PyObject *result = NULL;
    PySendResult status = execution_am_send(self, Py_None, &result);
    if (status == PYGEN_NEXT) {
        return result;
    }
    if (status == PYGEN_RETURN) {
        if (result != Py_None) {
            set_stop_iteration(result);
        }
        Py_DECREF(result);
    }
    return NULL;
}

static int
is_generator_exit(PyObject *typ)
{
    if (PyExceptionInstance_Check(typ)) {
        typ = PyExceptionInstance_Class(typ);
    }
    return PyExceptionClass_Check(typ) && PyErr_GivenExceptionMatches(typ, PyExc_GeneratorExit);
}

static PyObject *
execution_throw(ExecutionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "throw expected %s %d argument%s, got %zd", nargs < 1 ? "at least" : "at most",
                     nargs < 1 ? 1 : 3, nargs < 1 ? "" : "s", nargs);
        return NULL;
    }
    PyObject *typ = args[0], *val = nargs > 1 ? args[1] : NULL, *tb = nargs > 2 ? args[2] : NULL;
    if (self->executing) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return NULL;
    }
    if (self->state == EX_DONE) {
        if (set_thrown(typ, val, tb) == 0) {
            PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        }
        return NULL;
    }
    if (self->state == EX_NEW) {
        /* Raised before the body runs: nothing was admitted, nothing to settle. */
        if (set_thrown(typ, val, tb) < 0) {
            return NULL;
        }
        execution_raise(self);
        return NULL;
    }
    self->executing = 1;
    Py_INCREF(self);
    PyObject *result = NULL;
    PySendResult status;
    if (is_generator_exit(typ)) {
        /* As a coroutine does: close what it awaits, then raise at its await (GeneratorExit, or
         * what closing raised). */
        PyObject *inner = Py_NewRef(self->inner);
        int closed = close_iter(inner, s_close);
        Py_DECREF(inner);
        if (closed == 0 && set_thrown(typ, val, tb) < 0) {
            /* Arguments throw() refuses: the error leaves throw() and the coroutine stays
             * suspended at its (now closed) await, as a coroutine does. */
            self->executing = 0;
            Py_DECREF(self);
            return NULL;
        }
        Py_CLEAR(self->inner);
        status = execution_fail(self);
    }
    else {
        PyObject *meth;
        if (lookup_attr(self->inner, s_throw, &meth) < 0) {
            /* As a coroutine: the error leaves throw() and the coroutine stays suspended. */
            self->executing = 0;
            Py_DECREF(self);
            return NULL;
        }
        if (meth == NULL) {
            if (set_thrown(typ, val, tb) < 0) {
                /* As a coroutine: throw() refuses the arguments before raising anything at the
                 * await, so the call stays suspended (and its probe permit in flight). */
                self->executing = 0;
                Py_DECREF(self);
                return NULL;
            }
            Py_CLEAR(self->inner);
            status = execution_fail(self);
        }
        else {
            PyObject *out = PyObject_Vectorcall(meth, args, (size_t)nargs, NULL);
            Py_DECREF(meth);
            if (out != NULL) {
                result = out;
                status = PYGEN_NEXT;
            }
            else {
                Py_CLEAR(self->inner);
                PyObject *value;
                if (fetch_stop_iteration(&value) == 0) {
                    status = execution_return(self, value, &result);
                }
                else {
                    status = execution_fail(self);
                }
            }
        }
    }
    self->executing = 0;
    Py_DECREF(self);
    return as_method_result(status, result);
}

static PyObject *
execution_close(ExecutionObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->executing) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return NULL;
    }
    if (self->state == EX_NEW) {
        execution_finish(self);  /* never started: nothing was admitted */
        Py_RETURN_NONE;
    }
    if (self->state == EX_DONE) {
        Py_RETURN_NONE;
    }
    self->executing = 1;
    Py_INCREF(self);
    PyObject *inner = self->inner;
    self->inner = NULL;
    if (close_iter(inner, s_close) == 0) {
        PyErr_SetNone(PyExc_GeneratorExit);
    }
    Py_DECREF(inner);
    execution_fail(self);
    self->executing = 0;
    Py_DECREF(self);
    if (PyErr_ExceptionMatches(PyExc_StopIteration) || PyErr_ExceptionMatches(PyExc_GeneratorExit)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return NULL;
}

static PyObject *
execution_await(ExecutionObject *self)
{
    /* As `await` on a coroutine suspended at its own await (a second awaiter, say another task). */
    if (self->state == EX_RUNNING && !self->executing) {
        PyErr_SetString(PyExc_RuntimeError, "coroutine is being awaited already");
        return NULL;
    }
    return Py_NewRef(self);
}

/* __qualname__ / __name__, as a coroutine has them (the task repr shows them). */
static PyObject *
execution_name(ExecutionObject *self, const char *attribute, const char *fallback)
{
    if (self->origin != NULL) {
        PyObject *name = PyObject_GetAttrString(self->origin, attribute);
        if (name != NULL && PyUnicode_Check(name)) {
            return name;
        }
        Py_XDECREF(name);
        PyErr_Clear();
    }
    return PyUnicode_FromString(fallback);
}

static PyObject *
execution_get_qualname(ExecutionObject *self, void *Py_UNUSED(closure))
{
    return execution_name(self, "__qualname__", "CircuitBreaker.execute");
}

static PyObject *
execution_get_name(ExecutionObject *self, void *Py_UNUSED(closure))
{
    return execution_name(self, "__name__", "execute");
}

/* As for a coroutine object: one dropped in flight is closed (its call settles as cancelled);
 * one never started warns that it was never awaited. */
static void
execution_finalize(ExecutionObject *self)
{
    if (self->state == EX_DONE) {
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (self->state == EX_NEW) {
        execution_finish(self);
        PyObject *name = execution_get_qualname(self, NULL);
        if (name == NULL || PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "coroutine '%U' was never awaited", name) < 0) {
            PyErr_WriteUnraisable((PyObject *)self);
        }
        Py_XDECREF(name);
    }
    else {
        PyObject *r = execution_close(self, NULL);
        if (r == NULL) {
            PyErr_WriteUnraisable((PyObject *)self);
        }
        else {
            Py_DECREF(r);
        }
    }
    PyErr_Restore(type, value, tb);
}

static int
execution_traverse(ExecutionObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->breaker);
    Py_VISIT(self->fn);
    Py_VISIT(self->origin);
    Py_VISIT(self->kwnames);
    Py_VISIT(self->inner);
    Py_VISIT(self->epoch);
    Py_VISIT(self->probe);
    Py_VISIT(self->now);
    Py_VISIT(self->start.obj);
    for (Py_ssize_t i = 1; i < Py_SIZE(self); i++) {
        Py_VISIT(self->items[i]);
    }
    return 0;
}

static int
execution_clear(ExecutionObject *self)
{
    execution_finish(self);
    Py_CLEAR(self->breaker);
    Py_CLEAR(self->origin);
    return 0;
}

static void
execution_dealloc(ExecutionObject *self)
{
    /* A finished one (nearly all) has nothing to finalize. */
    if (self->state != EX_DONE && PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) {
        return;  /* resurrected */
    }
    PyObject_GC_UnTrack(self);
    execution_finish(self);
    Py_CLEAR(self->breaker);
    Py_CLEAR(self->origin);
    PyObject_GC_Del(self);
}

static PyMethodDef execution_methods[] = {
    {"send", (PyCFunction)execution_send, METH_O, "send(value) -> the next value the awaitable yields"},
    {"throw", (PyCFunction)(void (*)(void))execution_throw, METH_FASTCALL,
     "throw(typ[,val[,tb]]) -> raise the exception where the call is waiting"},
    {"close", (PyCFunction)execution_close, METH_NOARGS, "close() -> raise GeneratorExit where the call is waiting"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef execution_getset[] = {
    {"__qualname__", (getter)execution_get_qualname, NULL, NULL, NULL},
    {"__name__", (getter)execution_get_name, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyAsyncMethods execution_as_async = {
    .am_await = (unaryfunc)execution_await,
    .am_send = (sendfunc)execution_am_send,
};

static PyTypeObject Execution_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stoic._cbreaker.Execution",
    .tp_doc = "The awaitable CircuitBreaker.execute returns (a coroutine: nothing runs before it is awaited).",
    .tp_basicsize = offsetof(ExecutionObject, items),
    .tp_itemsize = sizeof(PyObject *),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)execution_dealloc,
    .tp_finalize = (destructor)execution_finalize,
    .tp_traverse = (traverseproc)execution_traverse,
    .tp_clear = (inquiry)execution_clear,
    .tp_as_async = &execution_as_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)execution_iternext,
    .tp_methods = execution_methods,
    .tp_getset = execution_getset,
};

/* ------------------------------------------------------------------ Wrapper: @breaker on a plain function */

/* Calls fn through the breaker like CircuitBreaker.call(fn, ...), or for a coroutine function
 * returns the awaitable CircuitBreaker.execute(fn, ...) would. When fn's parameters are
 * simple, the generated Python wrapper binds them itself, so arguments fn cannot take raise
 * TypeError before admission; this wrapper keeps that: a call whose arguments it cannot
 * cheaply prove to bind goes to that Python wrapper (`python`), which then decides. */
typedef struct {
    PyObject_HEAD
    CoreObject *breaker;
    PyObject *fn;
    PyObject *python;     /* the generated Python wrapper for the same call */
    PyObject *names;      /* fn's positional and keyword-only parameter names, or NULL: no check */
    PyObject *code;       /* fn's code, defaults and kw-defaults at decoration */
    PyObject *defaults;
    PyObject *kwdefaults;
    char *required;       /* per name: no default */
    Py_ssize_t argcount;
    Py_ssize_t required_positional;
    Py_ssize_t required_total;
    PyObject *dict;
    PyObject *weakrefs;
    vectorcallfunc vectorcall;
} WrapperObject;

/* On this path fn fills its keyword-only defaults from its own dict; the Python wrapper passes
 * those of its copy, taken at decoration. Whether they still agree (a change made in fn's dict
 * since, or in the copy, sends the call to the Python wrapper). */
static int
kwdefaults_agree(WrapperObject *self)
{
    PyObject *copy = PyFunction_Check(self->python) ? PyFunction_GET_KW_DEFAULTS(self->python) : NULL;
    PyObject *own = self->kwdefaults;
    if (copy == NULL || !PyDict_Check(copy) || !PyDict_Check(own) || PyDict_GET_SIZE(copy) != PyDict_GET_SIZE(own)) {
        return 0;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(copy, &pos, &key, &value)) {
        PyObject *current = PyDict_GetItemWithError(own, key);
        if (current != value) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Whether the arguments certainly bind to fn's parameters as the Python wrapper's would. */
static int
binds(WrapperObject *self, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->names == NULL) {
        return 1;
    }
    PyObject *fn = self->fn;
    if (PyFunction_GET_CODE(fn) != self->code || PyFunction_GET_DEFAULTS(fn) != self->defaults
        || PyFunction_GET_KW_DEFAULTS(fn) != self->kwdefaults || nargs > self->argcount
        || (self->kwdefaults != NULL && !kwdefaults_agree(self))) {
        return 0;
    }
    Py_ssize_t covered = nargs < self->required_positional ? nargs : self->required_positional;
    if (kwnames != NULL) {
        Py_ssize_t count = PyTuple_GET_SIZE(self->names);
        PyObject *const *names = &PyTuple_GET_ITEM(self->names, 0);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            Py_ssize_t i = nargs;  /* a name among the first nargs would be given twice */
            while (i < count && names[i] != key) {
                i++;
            }
            if (i == count) {
                return 0;  /* unknown, given twice, or not the interned name: let Python judge */
            }
            covered += self->required[i];
        }
    }
    return covered == self->required_total;
}

static PyObject *
wrapper_vectorcall(WrapperObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (self->breaker == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "breaker wrapper was cleared");
        return NULL;
    }
    if (!binds(self, PyVectorcall_NARGS(nargsf), kwnames)) {
        return PyObject_Vectorcall(self->python, args, nargsf, kwnames);
    }
    return run_sync(self->breaker, self->fn, args, nargsf, kwnames);
}

static PyObject *
wrapper_vectorcall_async(WrapperObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (self->breaker == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "breaker wrapper was cleared");
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!binds(self, nargs, kwnames)) {
        return PyObject_Vectorcall(self->python, args, nargsf, kwnames);
    }
    return execution_new(self->breaker, self->fn, args, nargs, kwnames, (PyObject *)self);
}

static PyObject *
wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *breaker, *fn, *python, *names = Py_None, *required = Py_None;
    Py_ssize_t argcount = 0;
    int is_async = 0;
    static char *kwlist[] = {"breaker", "fn", "python", "names", "argcount", "required", "is_async", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO|OnOp:Wrapper", kwlist, &Core_Type, &breaker, &fn, &python,
                                     &names, &argcount, &required, &is_async)) {
        return NULL;
    }
    int checked = names != Py_None;
    if (checked) {
        if (!PyFunction_Check(fn) || !PyTuple_CheckExact(names) || !PyTuple_CheckExact(required)
            || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(required) || argcount < 0
            || argcount > PyTuple_GET_SIZE(names)) {
            PyErr_SetString(PyExc_TypeError, "Wrapper: names and required must describe fn's parameters");
            return NULL;
        }
    }
    WrapperObject *self = (WrapperObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->breaker = (CoreObject *)Py_NewRef(breaker);
    self->fn = Py_NewRef(fn);
    self->python = Py_NewRef(python);
    self->vectorcall = (vectorcallfunc)(is_async ? wrapper_vectorcall_async : wrapper_vectorcall);
    if (checked) {
        Py_ssize_t count = PyTuple_GET_SIZE(names);
        self->required = PyMem_Malloc(count > 0 ? (size_t)count : 1);
        if (self->required == NULL) {
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
        self->names = Py_NewRef(names);
        self->code = Py_NewRef(PyFunction_GET_CODE(fn));
        self->defaults = Py_XNewRef(PyFunction_GET_DEFAULTS(fn));
        self->kwdefaults = Py_XNewRef(PyFunction_GET_KW_DEFAULTS(fn));
        self->argcount = argcount;
        for (Py_ssize_t i = 0; i < count; i++) {
            int needed = PyObject_IsTrue(PyTuple_GET_ITEM(required, i));
            if (needed < 0) {
                Py_DECREF(self);
                return NULL;
            }
            self->required[i] = (char)needed;
            self->required_total += needed;
            if (needed && i < argcount) {
                self->required_positional = i + 1;
            }
        }
        /* Required positional parameters are a prefix (a default makes every later one optional). */
        for (Py_ssize_t i = 0; i < self->required_positional; i++) {
            if (!self->required[i]) {
                PyErr_SetString(PyExc_ValueError, "Wrapper: required positional parameters must come first");
                Py_DECREF(self);
                return NULL;
            }
        }
    }
    return (PyObject *)self;
}

static PyObject *
wrapper_descr_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
wrapper_repr(WrapperObject *self)
{
    return PyUnicode_FromFormat("<breaker wrapper of %R>", self->fn);
}

static int
wrapper_traverse(WrapperObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->breaker);
    Py_VISIT(self->fn);
    Py_VISIT(self->python);
    Py_VISIT(self->defaults);
    Py_VISIT(self->kwdefaults);
    Py_VISIT(self->dict);
    return 0;
}

static int
wrapper_clear(WrapperObject *self)
{
    Py_CLEAR(self->breaker);
    Py_CLEAR(self->fn);
    Py_CLEAR(self->python);
    Py_CLEAR(self->names);
    Py_CLEAR(self->code);
    Py_CLEAR(self->defaults);
    Py_CLEAR(self->kwdefaults);
    Py_CLEAR(self->dict);
    return 0;
}

static void
wrapper_dealloc(WrapperObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    wrapper_clear(self);
    PyMem_Free(self->required);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Pickled (and copied) by reference, by its qualified name, as the function it replaces is. */
static PyObject *
wrapper_reduce(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef wrapper_methods[] = {
    {"__reduce__", wrapper_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef wrapper_members[] = {
    {"_python_wrapper", T_OBJECT, offsetof(WrapperObject, python), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject Wrapper_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stoic._cbreaker.Wrapper",
    .tp_doc = "The @breaker wrapper: each call runs as breaker.call(fn, ...) or breaker.execute(fn, ...) would.",
    .tp_basicsize = sizeof(WrapperObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = wrapper_new,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(WrapperObject, vectorcall),
    .tp_descr_get = wrapper_descr_get,
    .tp_repr = (reprfunc)wrapper_repr,
    .tp_dictoffset = offsetof(WrapperObject, dict),
    .tp_weaklistoffset = offsetof(WrapperObject, weakrefs),
    .tp_getset = wrapper_getset,
    .tp_members = wrapper_members,
    .tp_methods = wrapper_methods,
};

/* ------------------------------------------------------------------ the module */

PyDoc_STRVAR(configure_doc,
"configure(monotonic_ns, deadline_module, deadline_var, registry, floor_descriptor, debug, min_level,\n"
"          refuse_coroutine, async_results)\n--\n\n"
"Hand the objects the fast paths read to the module (once, from stoic.breaker._breaker).");

static PyObject *
configure(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *monotonic_ns, *deadline_module, *deadline_var, *registry, *floor, *debug, *min_level, *refuse;
    PyObject *async_results;
    if (!PyArg_ParseTuple(args, "OO!O!OOO!OOO!:configure", &monotonic_ns, &PyModule_Type, &deadline_module,
                          &PyContextVar_Type, &deadline_var, &registry, &floor, &PyLong_Type, &debug, &min_level,
                          &refuse, &PyTuple_Type, &async_results)) {
        return NULL;
    }
    /* `floor` is a __slots__ member of the registry's class: read at its offset, no lookup. */
    if (!Py_IS_TYPE(floor, &PyMemberDescr_Type)
        || ((PyMemberDescrObject *)floor)->d_member->type != T_OBJECT_EX
        || !PyObject_TypeCheck(registry, PyDescr_TYPE(floor))) {
        PyErr_SetString(PyExc_TypeError, "configure: floor must be the registry class's slot descriptor");
        return NULL;
    }
    long debug_value = PyLong_AsLong(debug);
    if (debug_value == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_XSETREF(g_monotonic_ns, Py_NewRef(monotonic_ns));
    Py_XSETREF(g_deadline_dict, Py_NewRef(PyModule_GetDict(deadline_module)));
    Py_XSETREF(g_deadline_var, Py_NewRef(deadline_var));
    g_floor_offset = ((PyMemberDescrObject *)floor)->d_member->offset;
    Py_XSETREF(g_registry, Py_NewRef(registry));
    Py_XSETREF(g_debug, Py_NewRef(debug));
    g_debug_value = debug_value;
    Py_XSETREF(g_min_level, Py_NewRef(min_level));
    Py_XSETREF(g_refuse_coroutine, Py_NewRef(refuse));
    Py_XSETREF(g_async_results, Py_NewRef(async_results));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, configure_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stoic._cbreaker",
    .m_doc = "The circuit breaker's compiled success paths (see stoic._native).",
    .m_size = -1,
    .m_methods = module_methods,
};

static int
intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC
PyInit__cbreaker(void)
{
    if (intern(&s_ever_set, "ever_set") < 0 || intern(&s_admit, "_admit") < 0
        || intern(&s_refuse_if_late, "_refuse_if_late") < 0 || intern(&s_settle, "_settle") < 0
        || intern(&s_settle_error, "_settle_error") < 0 || intern(&s_close, "close") < 0
        || intern(&s_throw, "throw") < 0 || intern(&s_cr_await, "cr_await") < 0) {
        return NULL;
    }
    if (g_zero == NULL && (g_zero = PyLong_FromLong(0)) == NULL) {
        return NULL;
    }
    if (PyType_Ready(&Core_Type) < 0 || PyType_Ready(&Execution_Type) < 0 || PyType_Ready(&Wrapper_Type) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Core", (PyObject *)&Core_Type) < 0
        || PyModule_AddObjectRef(m, "Execution", (PyObject *)&Execution_Type) < 0
        || PyModule_AddObjectRef(m, "Wrapper", (PyObject *)&Wrapper_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
