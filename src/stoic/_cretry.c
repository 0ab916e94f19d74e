/* The success path of stoic's retry, compiled (see stoic/_retry.py and stoic/_native.py).
 *
 * What is here is exactly the FIRST attempt of stoic._retry's paths: the budget deposit, the
 * deadline check, the start instant when something needs it, the in-attempt mark around the
 * call, the check that a plain operation did not return a coroutine. An attempt that raises an
 * Exception is handed, with exactly the arguments the Python code passes, to the Python loop
 * (_loop_sync, or the _loop_async coroutine for retry()/Retrying.execute), which stays the
 * single source of the rules; anything unusual (an operation that wants an Attempt, retry's own
 * keywords, attempt_timeout, a missing argument) goes to the Python code itself. A
 * BaseException propagates untouched once the mark is reset.
 *
 * Sections: what _configure() hands over; helpers; the sync first attempt; the compiled
 * functions (@retrying wrapper, Retrying.call, retry_sync); the async first attempt (an
 * awaitable, for @retrying on a coroutine function, retry() and Retrying.execute); the
 * Function type; the module.
 *
 * The Python objects this needs (context variables, module globals, the Python functions, the
 * slot descriptors of the private classes) are handed over once by _configure().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_ccompat.h"

/* On 3.11 the calling frame's code and offset are read from the interpreter's frame, without
 * making the frame object PyEval_GetFrame() would (an allocation per calling frame: a third of
 * retry_sync's cost). Other versions, and a Python installed without its internal headers, use
 * PyEval_GetFrame(). */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && defined(__has_include)
#if __has_include(<internal/pycore_frame.h>)
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#define STOIC_READ_INTERPRETER_FRAME 1
#endif
#endif

/* ---- what _configure() hands over ------------------------------------------------------ */

static PyObject *in_attempt;       /* ContextVar: set while an attempt runs */
static PyObject *deadline_scope;   /* ContextVar: the ambient deadline scope */
static PyObject *ambient_clock;    /* ContextVar: the ambient clock */
static PyObject *deadline_globals; /* stoic._deadline.__dict__ (for ever_set) */
static PyObject *clock_globals;    /* stoic._clock.__dict__ (for ever_set) */
static PyObject *system_clock;
static PyObject *loop_sync;        /* _retry._loop_sync */
static PyObject *loop_async;       /* _retry._loop_async */
static PyObject *run_async;        /* _retry._run_async */
static PyObject *run_sync;         /* _retry._run_sync */
static PyObject *not_a_coroutine;  /* _retry._not_a_coroutine */
static PyObject *async_results;    /* _native.ASYNC_RESULTS: types a plain operation must not return */
static PyObject *learn_op;         /* _retry._learn_op */
static PyObject *check_schedule;   /* _retry._check_schedule */
static PyObject *site_of_frame;    /* _budget.site_of_frame */
static PyObject *bounded_schedule; /* schedule.BoundedSchedule */
static PyObject *frames;           /* _registry.frames: cleared in place, never replaced */
static PyObject *per_call_site;    /* RetryBudget.PER_CALL_SITE */
static PyObject *standard;         /* RetryClassifier.standard */
static PyObject *single_attempt;   /* RetryNesting.SINGLE_ATTEMPT */

/* Slot descriptors (member_descriptor) of the private classes: read like `obj.name`. */
static PyObject *d_retrier_bucket, *d_retrier_op, *d_retrier_schedule, *d_retrier_site,
    *d_retrier_classify, *d_retrier_nesting, *d_retrier_label;
static PyObject *d_budget_deposits, *d_schedule_timed;
static PyObject *d_site_code, *d_site_bucket, *d_site_op, *d_site_name;
static PyObject *d_retrying_clock, *d_retrying_retrier;

static PyObject *s_ever_set, *s_now_ns, *s_old_value, *s_attempt, *s_code, *s_budget, *s_classify,
    *s_nesting, *s_label, *s_qualname, *s_name, *s_attempt_timeout, *s_throw, *s_close, *s_cr_await;
static PyObject *minus_one;

typedef struct {
    const char *name;
    PyObject **target;
    int is_slot; /* must be a member descriptor of an object slot */
} Handed;

static Handed handed[] = {
    {"in_attempt", &in_attempt, 0},
    {"deadline_scope", &deadline_scope, 0},
    {"ambient_clock", &ambient_clock, 0},
    {"deadline_globals", &deadline_globals, 0},
    {"clock_globals", &clock_globals, 0},
    {"system_clock", &system_clock, 0},
    {"loop_sync", &loop_sync, 0},
    {"loop_async", &loop_async, 0},
    {"run_async", &run_async, 0},
    {"run_sync", &run_sync, 0},
    {"not_a_coroutine", &not_a_coroutine, 0},
    {"async_results", &async_results, 0},
    {"learn_op", &learn_op, 0},
    {"check_schedule", &check_schedule, 0},
    {"site_of_frame", &site_of_frame, 0},
    {"bounded_schedule", &bounded_schedule, 0},
    {"frames", &frames, 0},
    {"per_call_site", &per_call_site, 0},
    {"standard", &standard, 0},
    {"single_attempt", &single_attempt, 0},
    {"retrier_bucket", &d_retrier_bucket, 1},
    {"retrier_op", &d_retrier_op, 1},
    {"retrier_schedule", &d_retrier_schedule, 1},
    {"retrier_site", &d_retrier_site, 1},
    {"retrier_classify", &d_retrier_classify, 1},
    {"retrier_nesting", &d_retrier_nesting, 1},
    {"retrier_label", &d_retrier_label, 1},
    {"budget_deposits", &d_budget_deposits, 1},
    {"schedule_timed", &d_schedule_timed, 1},
    {"site_code", &d_site_code, 1},
    {"site_bucket", &d_site_bucket, 1},
    {"site_op", &d_site_op, 1},
    {"site_name", &d_site_name, 1},
    {"retrying_clock", &d_retrying_clock, 1},
    {"retrying_retrier", &d_retrying_retrier, 1},
    {NULL, NULL, 0},
};

static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    if (PyTuple_GET_SIZE(args) != 0 || kwargs == NULL) {
        PyErr_SetString(PyExc_TypeError, "_configure takes keyword arguments only");
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
        const char *name = PyUnicode_AsUTF8(key);
        if (name == NULL) {
            return NULL;
        }
        Handed *h = handed;
        while (h->name != NULL && strcmp(h->name, name) != 0) {
            h++;
        }
        if (h->name == NULL) {
            PyErr_Format(PyExc_TypeError, "_configure: unknown name %R", key);
            return NULL;
        }
        if (h->is_slot && !(Py_IS_TYPE(value, &PyMemberDescr_Type)
                            && ((PyMemberDescrObject *)value)->d_member->type == T_OBJECT_EX)) {
            PyErr_Format(PyExc_TypeError, "_configure: %s must be a slot descriptor", name);
            return NULL;
        }
        Py_INCREF(value);
        Py_XSETREF(*h->target, value);
    }
    Py_RETURN_NONE;
}

/* ---- small helpers ----------------------------------------------------------------------- */

/* `obj.<slot>`: the slot itself for an instance of exactly the slot's class, else the ordinary
 * attribute lookup (a subclass may shadow the name). New reference. */
static PyObject *
slot(PyObject *obj, PyObject *descr)
{
    PyMemberDescrObject *d = (PyMemberDescrObject *)descr;
    if (Py_IS_TYPE(obj, PyDescr_TYPE(d))) {
        return PyMember_GetOne((const char *)obj, d->d_member);
    }
    return PyObject_GetAttr(obj, PyDescr_NAME(d));
}

static int
is_true_global(PyObject *globals, PyObject *name)
{
    PyObject *flag = PyDict_GetItemWithError(globals, name);
    if (flag == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetObject(PyExc_AttributeError, name);
        }
        return -1;
    }
    return PyObject_IsTrue(flag);
}

/* `_deadline.ever_set and _deadline_scope.get() is not None` */
static int
under_deadline(void)
{
    int set = is_true_global(deadline_globals, s_ever_set);
    if (set <= 0) {
        return set;
    }
    PyObject *scope;
    if (PyContextVar_Get(deadline_scope, Py_None, &scope) < 0) {
        return -1;
    }
    int under = scope != Py_None;
    Py_DECREF(scope);
    return under;
}

/* `_ambient_clock.get() if _clock.ever_set else SYSTEM_CLOCK` (current_clock()). New reference. */
static PyObject *
current_clock(void)
{
    int set = is_true_global(clock_globals, s_ever_set);
    if (set < 0) {
        return NULL;
    }
    if (!set) {
        return Py_NewRef(system_clock);
    }
    PyObject *clock;
    if (PyContextVar_Get(ambient_clock, NULL, &clock) < 0) {
        return NULL;
    }
    if (clock == NULL) {
        PyErr_SetObject(PyExc_LookupError, ambient_clock);
    }
    return clock;
}

/* `next(bucket._deposits)`: a first attempt's deposit (RetryBudget.deposit). */
static int
deposit(PyObject *bucket)
{
    PyObject *counter = slot(bucket, d_budget_deposits);
    if (counter == NULL) {
        return -1;
    }
    if (!PyIter_Check(counter)) {
        PyErr_Format(PyExc_TypeError, "'%.200s' object is not an iterator", Py_TYPE(counter)->tp_name);
        Py_DECREF(counter);
        return -1;
    }
    PyObject *taken = (*Py_TYPE(counter)->tp_iternext)(counter);
    Py_DECREF(counter);
    if (taken == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetNone(PyExc_StopIteration);
        }
        return -1;
    }
    Py_DECREF(taken);
    return 0;
}

static int
kwnames_has(PyObject *kwnames, PyObject *name)
{
    if (kwnames == NULL) {
        return 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == name || PyUnicode_Compare(k, name) == 0) {
            return 1;
        }
    }
    return 0;
}

/* `getattr(fn, "__code__", None)`, without the lookup for functions and bound methods. New ref. */
static PyObject *
code_of(PyObject *fn)
{
    if (PyFunction_Check(fn)) {
        return Py_NewRef(PyFunction_GET_CODE(fn));
    }
    if (PyMethod_Check(fn) && PyFunction_Check(PyMethod_GET_FUNCTION(fn))) {
        return Py_NewRef(PyFunction_GET_CODE(PyMethod_GET_FUNCTION(fn)));
    }
    PyObject *code = PyObject_GetAttr(fn, s_code);
    if (code == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        code = Py_NewRef(Py_None);
    }
    return code;
}

/* `(op[1] if getattr(fn, "__code__", None) is op[0] else _learn_op(holder, fn))
 *  and "attempt" not in kwargs`, with `op = holder.op` (read through `d_op`). */
static int
op_wants(PyObject *holder, PyObject *d_op, PyObject *fn, PyObject *kwnames)
{
    PyObject *op = slot(holder, d_op);
    if (op == NULL) {
        return -1;
    }
    PyObject *code = code_of(fn);
    if (code == NULL) {
        Py_DECREF(op);
        return -1;
    }
    int wants;
    if (PyTuple_CheckExact(op) && PyTuple_GET_SIZE(op) == 2 && code == PyTuple_GET_ITEM(op, 0)) {
        wants = PyObject_IsTrue(PyTuple_GET_ITEM(op, 1));
    }
    else {
        PyObject *learned = PyObject_CallFunctionObjArgs(learn_op, holder, fn, NULL);
        wants = learned == NULL ? -1 : PyObject_IsTrue(learned);
        Py_XDECREF(learned);
    }
    Py_DECREF(code);
    Py_DECREF(op);
    if (wants == 1 && kwnames_has(kwnames, s_attempt)) {
        wants = 0;
    }
    return wants;
}

/* The positional arguments as a tuple and the keyword arguments as a dict (the *args and
 * **kwargs the Python code would hold). */
static int
pack(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **tuple, PyObject **dict)
{
    *tuple = PyTuple_New(nargs);
    *dict = PyDict_New();
    if (*tuple == NULL || *dict == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyTuple_SET_ITEM(*tuple, i, Py_NewRef(args[i]));
    }
    if (kwnames != NULL) {
        Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (PyDict_SetItem(*dict, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                goto error;
            }
        }
    }
    return 0;
error:
    Py_CLEAR(*tuple);
    Py_CLEAR(*dict);
    return -1;
}

/* Call `target(*before, args, kwargs, *after)`: how the Python paths hand a call over. */
static PyObject *
hand_to(PyObject *target, PyObject **before, Py_ssize_t nbefore, PyObject *const *args, Py_ssize_t nargs,
        PyObject *kwnames, PyObject **after, Py_ssize_t nafter)
{
    PyObject *tuple, *dict;
    if (pack(args, nargs, kwnames, &tuple, &dict) < 0) {
        return NULL;
    }
    PyObject *stack[16];
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < nbefore; i++) {
        stack[n++] = before[i];
    }
    stack[n++] = tuple;
    stack[n++] = dict;
    for (Py_ssize_t i = 0; i < nafter; i++) {
        stack[n++] = after[i];
    }
    PyObject *result = PyObject_Vectorcall(target, stack, n, NULL);
    Py_DECREF(tuple);
    Py_DECREF(dict);
    return result;
}

static PyTypeObject Run_Type; /* what the compiled retry() returns (below) */

/* ---- the first attempt (sync) ------------------------------------------------------------ */

/* What the first attempt hands to _loop_sync when it raised an Exception. */
typedef struct {
    PyObject *error;   /* the operation's exception, its traceback attached */
    PyObject *started; /* int: the attempt's start (ns) or -1 */
    int nested;        /* `token.old_value is True` */
} Failure;

/* The first attempt of _run_sync: deposit, start instant, mark, call, coroutine check.
 * Returns the result; or NULL with an exception set (to propagate); or NULL with no exception
 * set and `failure->error` set (an Exception from the operation: the loop decides). */
static PyObject *
first_attempt(int timed, PyObject *bucket, PyObject *clock, PyObject *fn, PyObject *const *args, size_t nargsf,
              PyObject *kwnames, Failure *failure)
{
    failure->error = NULL;
    if (deposit(bucket) < 0) {
        return NULL;
    }
    int deadline = under_deadline();
    if (deadline < 0) {
        return NULL;
    }
    /* Only the deadline check and up_to use the start: without them, success reads no time. */
    PyObject *started = timed || deadline ? PyObject_CallMethodNoArgs(clock, s_now_ns) : Py_NewRef(minus_one);
    if (started == NULL) {
        return NULL;
    }
    PyObject *token = PyContextVar_Set(in_attempt, Py_True);
    if (token == NULL) {
        Py_DECREF(started);
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(fn, args, nargsf, kwnames);
    int raised = result == NULL;
    if (result != NULL && is_async_result(result, async_results)) {
        /* A coroutine (or a compiled execute()/retry()'s awaitable): _not_a_coroutine closes it and
         * raises TypeError, which propagates (it is not the operation's error). */
        PyObject *none = PyObject_CallFunctionObjArgs(not_a_coroutine, fn, result, NULL);
        if (none == NULL) {
            Py_CLEAR(result);
        }
        Py_XDECREF(none);
    }
    /* finally: reset the mark, keeping whatever is propagating. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyContextVar_Reset(in_attempt, token) < 0) {
        chain_exception(type, value, tb);
        Py_XDECREF(result);
        Py_DECREF(token);
        Py_DECREF(started);
        return NULL;
    }
    if (result != NULL) {
        Py_DECREF(token);
        Py_DECREF(started);
        return result;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (!raised || !PyErr_GivenExceptionMatches(value, PyExc_Exception)) {
        PyErr_Restore(type, value, tb);  /* a BaseException (or our own TypeError): untouched */
        Py_DECREF(token);
        Py_DECREF(started);
        return NULL;
    }
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);  /* what `except Exception as caught` does */
    }
    Py_DECREF(type);
    Py_XDECREF(tb);
    PyObject *old = PyObject_GetAttr(token, s_old_value);
    Py_DECREF(token);
    if (old == NULL) {
        Py_DECREF(value);
        Py_DECREF(started);
        return NULL;
    }
    failure->nested = old == Py_True;
    Py_DECREF(old);
    failure->error = value;
    failure->started = started;
    return NULL;
}

/* `_loop_sync(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, clock,
 *             nested, error, started)`; consumes the failure. */
static PyObject *
to_loop_sync(PyObject *schedule, PyObject *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
             PyObject *site, PyObject *bucket, PyObject *classify, PyObject *nesting, PyObject *label,
             PyObject *clock, Failure *failure)
{
    PyObject *before[] = {schedule, fn};
    PyObject *after[] = {site, bucket, classify, nesting, label, clock, failure->nested ? Py_True : Py_False,
                         failure->error, failure->started};
    PyObject *result = hand_to(loop_sync, before, 2, args, nargs, kwnames, after, 9);
    Py_CLEAR(failure->error);
    Py_CLEAR(failure->started);
    return result;
}

/* `_run_sync(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, clock, wants)` */
static PyObject *
to_run_sync(PyObject *schedule, PyObject *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
            PyObject *site, PyObject *bucket, PyObject *classify, PyObject *nesting, PyObject *label,
            PyObject *clock, int wants)
{
    PyObject *before[] = {schedule, fn};
    PyObject *after[] = {site, bucket, classify, nesting, label, clock, wants ? Py_True : Py_False};
    return hand_to(run_sync, before, 2, args, nargs, kwnames, after, 7);
}

static int
is_timed(PyObject *schedule)
{
    PyObject *timed = slot(schedule, d_schedule_timed);
    if (timed == NULL) {
        return -1;
    }
    int result = PyObject_IsTrue(timed);
    Py_DECREF(timed);
    return result;
}

/* ---- the compiled functions: one type, a vectorcall per kind ----------------------------- */

/* A callable that behaves like a Python function where it is seen from Python: it binds as a
 * method, has a __dict__ (functools.update_wrapper fills __name__, __doc__, __wrapped__, so
 * inspect.signature follows __wrapped__), and can be weakly referenced.
 *
 * Kinds: a @retrying wrapper of a plain function or of a coroutine function (every field
 * used; the async one returns a Run, and _retry.py gives it the __code__ of the async def it
 * replaces, so inspect sees a coroutine function); `retry_sync`, `retry`,
 * `Retrying.call` and `Retrying.execute` (only `fn`: the pure-Python function they stand for,
 * called for anything unusual). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn;
    PyObject *retrier; /* read for its bucket on every call (reset_budgets() replaces it) */
    PyObject *schedule, *classify, *nesting, *label, *site;
    PyObject *clock;   /* the fixed clock, or None for the ambient one at each call */
    int general;       /* the operation wants an Attempt: always the Python path */
    int timed;         /* schedule._timed (a schedule is immutable) */
    PyObject *dict;
    PyObject *weakrefs;
} Function;

static PyTypeObject Function_Type;

/* A call of a function decorated with @retrying (_Retrier._decorate_sync's sync_wrapper). */
static PyObject *
decorated_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Function *w = (Function *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *bucket = slot(w->retrier, d_retrier_bucket);
    if (bucket == NULL) {
        return NULL;
    }
    PyObject *clock = w->clock != Py_None ? Py_NewRef(w->clock) : current_clock();
    if (clock == NULL) {
        Py_DECREF(bucket);
        return NULL;
    }
    PyObject *result;
    if (w->general) {
        result = to_run_sync(w->schedule, w->fn, args, nargs, kwnames, w->site, bucket, w->classify, w->nesting,
                             w->label, clock, !kwnames_has(kwnames, s_attempt));
    }
    else {
        Failure failure;
        result = first_attempt(w->timed, bucket, clock, w->fn, args, nargsf, kwnames, &failure);
        if (failure.error != NULL) {
            result = to_loop_sync(w->schedule, w->fn, args, nargs, kwnames, w->site, bucket, w->classify,
                                  w->nesting, w->label, clock, &failure);
        }
    }
    Py_DECREF(bucket);
    Py_DECREF(clock);
    return result;
}

/* Retrying.call(self, fn, /, *args, **kwargs) (stoic/pipeline.py). */
static PyObject *
retrying_call_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Function *f = (Function *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2) {
        return PyObject_Vectorcall(f->fn, args, nargsf, kwnames);  /* the Python error */
    }
    PyObject *policy = args[0], *fn = args[1];
    PyObject *const *rest = args + 2;
    Py_ssize_t nrest = nargs - 2;
    PyObject *result = NULL, *schedule = NULL, *clock = NULL, *site = NULL, *classify = NULL, *nesting = NULL,
             *label = NULL;
    PyObject *retrier = slot(policy, d_retrying_retrier);
    if (retrier == NULL) {
        return NULL;
    }
    PyObject *bucket = slot(retrier, d_retrier_bucket);  /* resolved at construction and by resets */
    if (bucket == NULL) {
        goto done;
    }
    int wants = op_wants(retrier, d_retrier_op, fn, kwnames);
    if (wants < 0) {
        goto done;
    }
    schedule = slot(retrier, d_retrier_schedule);
    if (schedule == NULL) {
        goto done;
    }
    clock = slot(policy, d_retrying_clock);
    if (clock == NULL) {
        goto done;
    }
    Failure failure = {NULL, NULL, 0};
    if (!wants) {
        int timed = is_timed(schedule);
        if (timed < 0) {
            goto done;
        }
        result = first_attempt(timed, bucket, clock, fn, rest, nrest, kwnames, &failure);
        if (failure.error == NULL) {
            goto done;
        }
    }
    /* The Python code reads these after the first attempt: so does this. */
    if ((site = slot(retrier, d_retrier_site)) == NULL || (classify = slot(retrier, d_retrier_classify)) == NULL
        || (nesting = slot(retrier, d_retrier_nesting)) == NULL || (label = slot(retrier, d_retrier_label)) == NULL) {
        Py_CLEAR(failure.error);
        Py_CLEAR(failure.started);
        goto done;
    }
    if (wants) {
        result = to_run_sync(schedule, fn, rest, nrest, kwnames, site, bucket, classify, nesting, label, clock, 1);
    }
    else {
        result = to_loop_sync(schedule, fn, rest, nrest, kwnames, site, bucket, classify, nesting, label, clock,
                              &failure);
    }
done:
    Py_DECREF(retrier);
    Py_XDECREF(bucket);
    Py_XDECREF(schedule);
    Py_XDECREF(clock);
    Py_XDECREF(site);
    Py_XDECREF(classify);
    Py_XDECREF(nesting);
    Py_XDECREF(label);
    return result;
}

/* Whether a Python frame is calling (the frame sys._getframe(1) gives the Python function). */
static int
has_caller(void)
{
#ifdef STOIC_READ_INTERPRETER_FRAME
    return PyThreadState_GET()->cframe->current_frame != NULL;
#else
    return PyEval_GetFrame() != NULL;
#endif
}

/* The calling frame's code object (borrowed: the running frame holds it) and its f_lasti. */
static void
caller_position(PyObject **code, int *lasti)
{
#ifdef STOIC_READ_INTERPRETER_FRAME
    _PyInterpreterFrame *frame = PyThreadState_GET()->cframe->current_frame;
    int offset = _PyInterpreterFrame_LASTI(frame);
    *code = (PyObject *)frame->f_code;
    *lasti = offset < 0 ? -1 : offset * (int)sizeof(_Py_CODEUNIT);  /* (PyFrame_GetLasti) */
#else
    PyFrameObject *frame = PyEval_GetFrame();
    PyCodeObject *frame_code = PyFrame_GetCode(frame);
    Py_DECREF(frame_code);
    *code = (PyObject *)frame_code;
    *lasti = PyFrame_GetLasti(frame);
#endif
}

/* retry's and retry_sync's first steps (has_caller() is true): the schedule's check, then the
 * call site's _Site (site_of_frame's lookup, inlined for the head of the chain, as the Python
 * code does; only a site met for the first time needs the frame object). */
static PyObject *
schedule_and_site(PyObject *schedule)
{
    if (!Py_IS_TYPE(schedule, (PyTypeObject *)bounded_schedule)) {
        PyObject *checked = PyObject_CallOneArg(check_schedule, schedule);
        if (checked == NULL) {
            return NULL;
        }
        Py_DECREF(checked);
    }
    PyObject *code;
    int offset;
    caller_position(&code, &offset);
    PyObject *lasti = PyLong_FromLong(offset);
    if (lasti == NULL) {
        return NULL;
    }
    PyObject *site = PyDict_GetItemWithError(frames, lasti);
    Py_DECREF(lasti);
    Py_XINCREF(site);
    if (site == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (site != NULL) {
        PyObject *site_code = slot(site, d_site_code);
        if (site_code == NULL) {
            Py_DECREF(site);
            return NULL;
        }
        Py_DECREF(site_code);  /* (only its identity is compared: the site keeps it alive) */
        if (site_code != code) {
            Py_CLEAR(site);
        }
    }
    if (site == NULL) {
        PyObject *frame = (PyObject *)PyEval_GetFrame();
        if (frame == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "retry: no calling frame");
            return NULL;
        }
        site = PyObject_CallOneArg(site_of_frame, frame);
    }
    return site;
}

/* Whether a keyword is one of retry_sync's own (then the Python function sorts them out). */
static int
has_own_keyword(PyObject *kwnames)
{
    return kwnames != NULL && (kwnames_has(kwnames, s_budget) || kwnames_has(kwnames, s_classify)
                               || kwnames_has(kwnames, s_nesting) || kwnames_has(kwnames, s_label));
}

/* retry_sync(schedule, fn, /, *args, **kwargs) with retry's own keywords at their defaults. */
static PyObject *
retry_sync_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Function *f = (Function *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* With no Python frame to find the call site in, the Python function decides too: it
     * looks one frame up, which is the frame calling this (a C call adds none). */
    if (nargs < 2 || has_own_keyword(kwnames) || !has_caller()) {
        return PyObject_Vectorcall(f->fn, args, nargsf, kwnames);
    }
    PyObject *schedule = args[0], *fn = args[1];
    PyObject *const *rest = args + 2;
    Py_ssize_t nrest = nargs - 2;
    PyObject *site = schedule_and_site(schedule);
    if (site == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *clock = NULL, *name = NULL;
    PyObject *bucket = slot(site, d_site_bucket);
    if (bucket == NULL) {
        goto done;
    }
    clock = current_clock();
    if (clock == NULL) {
        goto done;
    }
    int wants = op_wants(site, d_site_op, fn, kwnames);
    if (wants < 0) {
        goto done;
    }
    Failure failure = {NULL, NULL, 0};
    if (!wants) {
        int timed = is_timed(schedule);
        if (timed < 0) {
            goto done;
        }
        result = first_attempt(timed, bucket, clock, fn, rest, nrest, kwnames, &failure);
        if (failure.error == NULL) {
            goto done;
        }
    }
    name = slot(site, d_site_name);
    if (name == NULL) {
        Py_CLEAR(failure.error);
        Py_CLEAR(failure.started);
        goto done;
    }
    if (wants) {
        result = to_run_sync(schedule, fn, rest, nrest, kwnames, name, bucket, standard, single_attempt, Py_None,
                             clock, 1);
    }
    else {
        result = to_loop_sync(schedule, fn, rest, nrest, kwnames, name, bucket, standard, single_attempt, Py_None,
                              clock, &failure);
    }
done:
    Py_DECREF(site);
    Py_XDECREF(bucket);
    Py_XDECREF(clock);
    Py_XDECREF(name);
    return result;
}

/* ---- the async first attempt: an awaitable ------------------------------------------------- */

/* What retry() and Retrying.execute() return when the operation wants no Attempt: the
 * coroutine _run_async would be, as a small state machine. Nothing runs until the first send;
 * then the first attempt runs inline (deposit, start instant, mark, `await fn(...)`), and an
 * Exception from it switches to awaiting the Python _loop_async(...) coroutine, exactly as
 * `return await _loop_async(...)` does. send/throw/close follow a coroutine's `await`
 * (yield from) rules, so tasks, cancellation and close() behave as with the Python coroutine. */

enum { RUN_FRESH, RUN_FIRST, RUN_LOOP, RUN_DONE };

typedef struct {
    PyObject_HEAD
    int state;
    int running; /* inside send/throw/close: a reentrant call is refused, as a coroutine's */
    int timed;
    PyObject *schedule, *fn, *args, *kwargs; /* kwargs: a dict, or NULL for none */
    PyObject *site, *bucket, *classify, *nesting, *label, *clock;
    PyObject *token;   /* RUN_FIRST: the in-attempt mark's token */
    PyObject *started; /* RUN_FIRST: the attempt's start, or -1 */
    PyObject *inner;   /* RUN_FIRST: the operation's awaitable; RUN_LOOP: the _loop_async coroutine */
    /* The @retrying wrapper that made it, or NULL (retry(), execute()): then the bucket and the
     * clock are read at the first send, as the Python wrapper's body reads them, and the
     * wrapper's names are the coroutine's. Kept after the run finishes (a coroutine keeps its name). */
    PyObject *owner;
} Run;

/* Drop everything but the name (the owner), as a finished coroutine's frame does. */
static void
run_drop(Run *r)
{
    r->state = RUN_DONE;
    Py_CLEAR(r->schedule);
    Py_CLEAR(r->fn);
    Py_CLEAR(r->args);
    Py_CLEAR(r->kwargs);
    Py_CLEAR(r->site);
    Py_CLEAR(r->bucket);
    Py_CLEAR(r->classify);
    Py_CLEAR(r->nesting);
    Py_CLEAR(r->label);
    Py_CLEAR(r->clock);
    Py_CLEAR(r->token);
    Py_CLEAR(r->started);
    Py_CLEAR(r->inner);
}

static int
run_clear(Run *r)
{
    run_drop(r);
    Py_CLEAR(r->owner);
    return 0;
}

/* Finished (returned or raised). */
static void
run_finish(Run *r)
{
    run_drop(r);
    /* As a coroutine's: a StopIteration leaving the body would read as a return to the awaiter. */
    if (PyErr_ExceptionMatches(PyExc_StopIteration)) {
        replace_stop_iteration("coroutine raised StopIteration");
    }
}

/* `bucket` and `clock` are NULL when `owner` (a @retrying wrapper) is given: read at the first send. */
static PyObject *
run_new(int timed, PyObject *schedule, PyObject *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
        PyObject *site, PyObject *bucket, PyObject *classify, PyObject *nesting, PyObject *label, PyObject *clock,
        PyObject *owner)
{
    Run *r = PyObject_GC_New(Run, &Run_Type);
    if (r == NULL) {
        return NULL;
    }
    r->state = RUN_DONE;  /* (until complete: a failed construction warns of nothing) */
    r->running = 0;
    r->timed = timed;
    r->schedule = Py_NewRef(schedule);
    r->fn = Py_NewRef(fn);
    r->site = Py_NewRef(site);
    r->bucket = Py_XNewRef(bucket);
    r->classify = Py_NewRef(classify);
    r->nesting = Py_NewRef(nesting);
    r->label = Py_NewRef(label);
    r->clock = Py_XNewRef(clock);
    r->owner = Py_XNewRef(owner);
    r->token = r->started = r->inner = r->kwargs = NULL;
    r->args = PyTuple_New(nargs);
    if (r->args == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyTuple_SET_ITEM(r->args, i, Py_NewRef(args[i]));
    }
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        r->kwargs = PyDict_New();
        if (r->kwargs == NULL) {
            Py_DECREF(r);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            if (PyDict_SetItem(r->kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                Py_DECREF(r);
                return NULL;
            }
        }
    }
    r->state = RUN_FRESH;
    PyObject_GC_Track(r);
    return (PyObject *)r;
}

static PySendResult run_loop_sent(Run *r, PySendResult status);

/* The first attempt raised (the exception is set): what `except Exception` / `finally` do,
 * then `await _loop_async(...)` for an Exception. */
static PySendResult
run_first_failed(Run *r, PyObject **out)
{
    Py_CLEAR(r->inner);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyContextVar_Reset(in_attempt, r->token) < 0) {
        chain_exception(type, value, tb);
        run_finish(r);
        return PYGEN_ERROR;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (type == NULL || !PyErr_GivenExceptionMatches(value, PyExc_Exception)) {
        PyErr_Restore(type, value, tb);  /* a BaseException (CancelledError...): untouched */
        run_finish(r);
        return PYGEN_ERROR;
    }
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_DECREF(type);
    Py_XDECREF(tb);
    PyObject *old = PyObject_GetAttr(r->token, s_old_value);
    PyObject *kwargs = r->kwargs != NULL ? Py_NewRef(r->kwargs) : PyDict_New();
    if (old == NULL || kwargs == NULL) {
        Py_XDECREF(old);
        Py_XDECREF(kwargs);
        Py_DECREF(value);
        run_finish(r);
        return PYGEN_ERROR;
    }
    PyObject *stack[] = {r->schedule, r->fn, r->args, kwargs, r->site, r->bucket, r->classify, r->nesting,
                         r->label, Py_None, r->clock, old == Py_True ? Py_True : Py_False, value, r->started};
    PyObject *loop = PyObject_Vectorcall(loop_async, stack, 14, NULL);
    Py_DECREF(old);
    Py_DECREF(kwargs);
    Py_DECREF(value);
    if (loop == NULL) {
        run_finish(r);
        return PYGEN_ERROR;
    }
    Py_CLEAR(r->token);
    Py_CLEAR(r->started);
    r->inner = loop;
    r->state = RUN_LOOP;
    PySendResult status = PyIter_Send(loop, Py_None, out);
    return run_loop_sent(r, status);
}

/* The operation's awaitable yielded, returned or raised. */
static PySendResult
run_first_sent(Run *r, PySendResult status, PyObject **out)
{
    if (status == PYGEN_NEXT) {
        return PYGEN_NEXT;
    }
    if (status == PYGEN_ERROR) {
        return run_first_failed(r, out);
    }
    Py_CLEAR(r->inner);
    if (PyContextVar_Reset(in_attempt, r->token) < 0) {
        Py_CLEAR(*out);
        run_finish(r);
        return PYGEN_ERROR;
    }
    run_finish(r);
    return PYGEN_RETURN;
}

/* The loop coroutine yielded, returned or raised. */
static PySendResult
run_loop_sent(Run *r, PySendResult status)
{
    if (status != PYGEN_NEXT) {
        run_finish(r);
    }
    return status;
}

/* The first send: _run_async's body up to its first suspension. */
static PySendResult
run_start(Run *r, PyObject **out)
{
    if (r->owner != NULL) {
        /* A @retrying wrapper's call: `bucket = retrier.bucket`, then the fixed or ambient clock. */
        Function *w = (Function *)r->owner;
        if (w->retrier == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "this compiled stoic function was cleared by the garbage collector");
            run_finish(r);
            return PYGEN_ERROR;
        }
        if ((r->bucket = slot(w->retrier, d_retrier_bucket)) == NULL
            || (r->clock = w->clock != Py_None ? Py_NewRef(w->clock) : current_clock()) == NULL) {
            run_finish(r);
            return PYGEN_ERROR;
        }
    }
    if (deposit(r->bucket) < 0) {
        run_finish(r);
        return PYGEN_ERROR;
    }
    int deadline = under_deadline();
    if (deadline < 0) {
        run_finish(r);
        return PYGEN_ERROR;
    }
    r->started = r->timed || deadline ? PyObject_CallMethodNoArgs(r->clock, s_now_ns) : Py_NewRef(minus_one);
    if (r->started == NULL) {
        run_finish(r);
        return PYGEN_ERROR;
    }
    r->token = PyContextVar_Set(in_attempt, Py_True);
    if (r->token == NULL) {
        run_finish(r);
        return PYGEN_ERROR;
    }
    r->state = RUN_FIRST;
    PyObject *x = r->kwargs == NULL
        ? PyObject_Vectorcall(r->fn, &PyTuple_GET_ITEM(r->args, 0), PyTuple_GET_SIZE(r->args), NULL)
        : PyObject_Call(r->fn, r->args, r->kwargs);
    if (x == NULL) {
        return run_first_failed(r, out);
    }
    r->inner = awaitable_iter(x, s_cr_await);
    Py_DECREF(x);
    if (r->inner == NULL) {
        return run_first_failed(r, out);
    }
    return run_first_sent(r, PyIter_Send(r->inner, Py_None, out), out);
}

static PySendResult
run_send_status(Run *r, PyObject *value, PyObject **out)
{
    *out = NULL;
    if (r->running) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return PYGEN_ERROR;
    }
    PySendResult status;
    r->running = 1;
    switch (r->state) {
    case RUN_FRESH:
        if (value != Py_None) {
            PyErr_SetString(PyExc_TypeError, "can't send non-None value to a just-started coroutine");
            status = PYGEN_ERROR;
        }
        else {
            status = run_start(r, out);
        }
        break;
    case RUN_FIRST:
        status = run_first_sent(r, PyIter_Send(r->inner, value, out), out);
        break;
    case RUN_LOOP:
        status = run_loop_sent(r, PyIter_Send(r->inner, value, out));
        break;
    default:
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        status = PYGEN_ERROR;
    }
    r->running = 0;
    return status;
}

/* The pending exception raised where the coroutine is suspended (at its `await`). */
static PySendResult
run_raise_here(Run *r, int closing, PyObject **out)
{
    switch (r->state) {
    case RUN_FIRST:
        return run_first_failed(r, out);  /* inside the try: an Exception goes to the loop */
    case RUN_FRESH:
    case RUN_LOOP:
        run_finish(r);
        return PYGEN_ERROR;
    default:
        if (!closing) {
            PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        }
        return PYGEN_ERROR;
    }
}

static PySendResult
run_throw_status(Run *r, PyObject *typ, PyObject *val, PyObject *tb, int closing, PyObject **out)
{
    *out = NULL;
    if (r->running) {
        PyErr_SetString(PyExc_ValueError, "coroutine already executing");
        return PYGEN_ERROR;
    }
    PySendResult status;
    r->running = 1;
    if (r->state == RUN_FIRST || r->state == RUN_LOOP) {
        PyObject *inner = Py_NewRef(r->inner);
        if (PyErr_GivenExceptionMatches(typ, PyExc_GeneratorExit)) {
            /* yield from: close the awaited iterator, then raise here (its close()'s error, if any) */
            int closed = close_iter(inner, s_close);
            Py_DECREF(inner);
            if (closed < 0) {
                status = run_raise_here(r, closing, out);
                goto done;
            }
            goto throw_here;
        }
        PyObject *throw;
        if (lookup_attr(inner, s_throw, &throw) < 0) {
            Py_DECREF(inner);  /* (as yield from: the lookup's error goes to the caller, nothing moves) */
            status = PYGEN_ERROR;
            goto done;
        }
        if (throw == NULL) {
            Py_DECREF(inner);
            goto throw_here;
        }
        PyObject *yielded = PyObject_CallFunctionObjArgs(throw, typ, val, tb, NULL);
        Py_DECREF(throw);
        Py_DECREF(inner);
        if (yielded != NULL) {
            *out = yielded;
            status = PYGEN_NEXT;
            goto done;
        }
        /* The awaited iterator finished: StopIteration carries its return value. */
        PySendResult inner_status = fetch_stop_iteration(out) == 0 ? PYGEN_RETURN : PYGEN_ERROR;
        status = r->state == RUN_FIRST ? run_first_sent(r, inner_status, out) : run_loop_sent(r, inner_status);
        goto done;
    }
throw_here:
    if (set_thrown(typ, val, tb) < 0) {
        status = PYGEN_ERROR;
        goto done;
    }
    status = run_raise_here(r, closing, out);
done:
    r->running = 0;
    return status;
}

static PyObject *
run_close(Run *r, PyObject *unused)
{
    (void)unused;
    if (r->state == RUN_FRESH || r->state == RUN_DONE) {
        if (r->running) {
            PyErr_SetString(PyExc_ValueError, "coroutine already executing");
            return NULL;
        }
        run_finish(r);
        Py_RETURN_NONE;
    }
    PyObject *out;
    PySendResult status = run_throw_status(r, PyExc_GeneratorExit, NULL, NULL, 1, &out);
    if (status == PYGEN_NEXT) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "coroutine ignored GeneratorExit");
        return NULL;
    }
    if (status == PYGEN_RETURN) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (PyErr_ExceptionMatches(PyExc_StopIteration) || PyErr_ExceptionMatches(PyExc_GeneratorExit)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return NULL;
}

/* send()/throw() as methods: a return is StopIteration(value). */
static PyObject *
run_result(PySendResult status, PyObject *out)
{
    if (status == PYGEN_NEXT) {
        return out;
    }
    if (status == PYGEN_RETURN) {
        set_stop_iteration(out);
        Py_DECREF(out);
    }
    return NULL;
}

static PyObject *
run_send(Run *r, PyObject *value)
{
    PyObject *out;
    PySendResult status = run_send_status(r, value, &out);
    return run_result(status, out);
}

static PyObject *
run_throw(Run *r, PyObject *args)
{
    PyObject *typ, *val = NULL, *tb = NULL;
    if (!PyArg_UnpackTuple(args, "throw", 1, 3, &typ, &val, &tb)) {
        return NULL;
    }
    PyObject *out;
    PySendResult status = run_throw_status(r, typ, val, tb, 0, &out);
    return run_result(status, out);
}

static PyObject *
run_iternext(Run *r)
{
    PyObject *out;
    PySendResult status = run_send_status(r, Py_None, &out);
    if (status == PYGEN_RETURN && out == Py_None) {
        Py_DECREF(out);
        return NULL;  /* exhausted, no StopIteration needed (as a generator's __next__) */
    }
    return run_result(status, out);
}

static PySendResult
run_am_send(PyObject *self, PyObject *value, PyObject **out)
{
    return run_send_status((Run *)self, value, out);
}

static PyObject *
run_await(PyObject *self)
{
    /* As `await` on a coroutine suspended at its own await (a second awaiter, say another task). */
    if ((((Run *)self)->state == RUN_FIRST || ((Run *)self)->state == RUN_LOOP) && !((Run *)self)->running) {
        PyErr_SetString(PyExc_RuntimeError, "coroutine is being awaited already");
        return NULL;
    }
    return Py_NewRef(self);
}

static PyObject *run_get_name(Run *r, void *closure);

/* A coroutine dropped unfinished is closed; one never started warns, as Python's do. */
static void
run_finalize(PyObject *self)
{
    Run *r = (Run *)self;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (r->state == RUN_FRESH) {
        run_finish(r);
        PyObject *name = run_get_name(r, (void *)1);
        if (name == NULL
            || PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "coroutine '%S' was never awaited", name) < 0) {
            PyErr_WriteUnraisable(self);
        }
        Py_XDECREF(name);
    }
    else if (r->state != RUN_DONE) {
        PyObject *closed = run_close(r, NULL);
        if (closed == NULL) {
            PyErr_WriteUnraisable(self);
        }
        Py_XDECREF(closed);
    }
    PyErr_Restore(type, value, tb);
}

static int
run_traverse(Run *r, visitproc visit, void *arg)
{
    Py_VISIT(r->schedule);
    Py_VISIT(r->fn);
    Py_VISIT(r->args);
    Py_VISIT(r->kwargs);
    Py_VISIT(r->site);
    Py_VISIT(r->bucket);
    Py_VISIT(r->classify);
    Py_VISIT(r->nesting);
    Py_VISIT(r->label);
    Py_VISIT(r->clock);
    Py_VISIT(r->token);
    Py_VISIT(r->started);
    Py_VISIT(r->inner);
    Py_VISIT(r->owner);
    return 0;
}

static void
run_dealloc(Run *r)
{
    /* A finished one has nothing to finalize: skip the finalizer's resurrection dance. */
    if (r->state != RUN_DONE && PyObject_CallFinalizerFromDealloc((PyObject *)r) < 0) {
        return;  /* resurrected */
    }
    PyObject_GC_UnTrack(r);
    run_clear(r);
    PyObject_GC_Del(r);
}

static PyObject *
run_get_running(Run *r, void *closure)
{
    (void)closure;
    return PyBool_FromLong(r->running);
}

static PyMethodDef run_methods[] = {
    {"send", (PyCFunction)run_send, METH_O, "send(value) -> the next value yielded, or StopIteration."},
    {"throw", (PyCFunction)run_throw, METH_VARARGS, "throw(exception) -> raise it where the retry is suspended."},
    {"close", (PyCFunction)run_close, METH_NOARGS, "close() -> raise GeneratorExit where the retry is suspended."},
    {NULL, NULL, 0, NULL},
};

/* The Python coroutine's names, so a task's repr reads the same in both modes: _run_async's,
 * or those of the @retrying wrapper that made it (functools.wraps gave it the function's). */
static PyObject *
run_get_name(Run *r, void *closure)
{
    if (r->owner != NULL) {
        return PyObject_GetAttr(r->owner, closure == NULL ? s_name : s_qualname);
    }
    return PyUnicode_FromString("_run_async");
}

static PyGetSetDef run_getset[] = {
    {"cr_running", (getter)run_get_running, NULL, "Whether a send/throw/close is running now.", NULL},
    {"__name__", (getter)run_get_name, NULL, "The name of the Python coroutine it stands for.", NULL},
    {"__qualname__", (getter)run_get_name, NULL, "The qualified name of the Python coroutine it stands for.",
     (void *)1},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyAsyncMethods run_as_async = {
    .am_await = run_await,
    .am_send = run_am_send,
};

static PyTypeObject Run_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stoic._cretry.Run",
    .tp_basicsize = sizeof(Run),
    .tp_dealloc = (destructor)run_dealloc,
    .tp_as_async = &run_as_async,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A retried call of a coroutine function: await it (a collections.abc.Coroutine).",
    .tp_traverse = (traverseproc)run_traverse,
    .tp_clear = (inquiry)run_clear,
    .tp_iternext = (iternextfunc)run_iternext,
    .tp_methods = run_methods,
    .tp_getset = run_getset,
    .tp_finalize = run_finalize,
};

/* `_run_async(schedule, fn, args, kwargs, site, bucket, classify, nesting, label, None, clock, True)`:
 * an operation that wants an Attempt runs the Python coroutine. */
static PyObject *
to_run_async(PyObject *schedule, PyObject *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
             PyObject *site, PyObject *bucket, PyObject *classify, PyObject *nesting, PyObject *label,
             PyObject *clock)
{
    PyObject *before[] = {schedule, fn};
    PyObject *after[] = {site, bucket, classify, nesting, label, Py_None, clock, Py_True};
    return hand_to(run_async, before, 2, args, nargs, kwnames, after, 8);
}

/* A call of a coroutine function decorated with @retrying (_Retrier._decorate_async's
 * async_wrapper, when the operation wants no Attempt and there is no attempt_timeout): the
 * coroutine the wrapper would return. Nothing is read until its first send, as in the wrapper. */
static PyObject *
decorated_async_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Function *w = (Function *)self;
    return run_new(w->timed, w->schedule, w->fn, args, PyVectorcall_NARGS(nargsf), kwnames, w->site, NULL,
                   w->classify, w->nesting, w->label, NULL, self);
}

/* Retrying.execute(self, fn, /, *args, **kwargs) (stoic/pipeline.py): every argument of
 * _run_async is read at the call, as the Python method does. */
static PyObject *
retrying_execute_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Function *f = (Function *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2) {
        return PyObject_Vectorcall(f->fn, args, nargsf, kwnames);  /* the Python error */
    }
    PyObject *policy = args[0], *fn = args[1];
    PyObject *result = NULL, *schedule = NULL, *site = NULL, *bucket = NULL, *classify = NULL, *nesting = NULL,
             *label = NULL, *clock = NULL;
    PyObject *retrier = slot(policy, d_retrying_retrier);
    if (retrier == NULL) {
        return NULL;
    }
    if ((schedule = slot(retrier, d_retrier_schedule)) == NULL || (site = slot(retrier, d_retrier_site)) == NULL
        || (bucket = slot(retrier, d_retrier_bucket)) == NULL
        || (classify = slot(retrier, d_retrier_classify)) == NULL
        || (nesting = slot(retrier, d_retrier_nesting)) == NULL || (label = slot(retrier, d_retrier_label)) == NULL
        || (clock = slot(policy, d_retrying_clock)) == NULL) {
        goto done;
    }
    int wants = op_wants(retrier, d_retrier_op, fn, kwnames);
    if (wants < 0) {
        goto done;
    }
    if (wants) {
        result = to_run_async(schedule, fn, args + 2, nargs - 2, kwnames, site, bucket, classify, nesting, label,
                              clock);
    }
    else {
        int timed = is_timed(schedule);
        if (timed >= 0) {
            result = run_new(timed, schedule, fn, args + 2, nargs - 2, kwnames, site, bucket, classify, nesting, label,
                             clock, NULL);
        }
    }
done:
    Py_DECREF(retrier);
    Py_XDECREF(schedule);
    Py_XDECREF(site);
    Py_XDECREF(bucket);
    Py_XDECREF(classify);
    Py_XDECREF(nesting);
    Py_XDECREF(label);
    Py_XDECREF(clock);
    return result;
}

/* retry(schedule, fn, /, *args, **kwargs) with retry's own keywords at their defaults:
 * validated and its call site found at the call; the operation runs from the first send. */
static PyObject *
retry_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Function *f = (Function *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2 || has_own_keyword(kwnames) || kwnames_has(kwnames, s_attempt_timeout) || !has_caller()) {
        return PyObject_Vectorcall(f->fn, args, nargsf, kwnames);
    }
    PyObject *schedule = args[0], *fn = args[1];
    PyObject *site = schedule_and_site(schedule);
    if (site == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *clock = NULL, *name = NULL;
    PyObject *bucket = slot(site, d_site_bucket);
    if (bucket == NULL || (name = slot(site, d_site_name)) == NULL || (clock = current_clock()) == NULL) {
        goto done;
    }
    int wants = op_wants(site, d_site_op, fn, kwnames);
    if (wants < 0) {
        goto done;
    }
    if (wants) {
        result = to_run_async(schedule, fn, args + 2, nargs - 2, kwnames, name, bucket, standard, single_attempt,
                              Py_None, clock);
    }
    else {
        int timed = is_timed(schedule);
        if (timed >= 0) {
            result = run_new(timed, schedule, fn, args + 2, nargs - 2, kwnames, name, bucket, standard,
                             single_attempt, Py_None, clock, NULL);
        }
    }
done:
    Py_DECREF(site);
    Py_XDECREF(bucket);
    Py_XDECREF(name);
    Py_XDECREF(clock);
    return result;
}

/* ---- the Function type -------------------------------------------------------------------- */

static Function *
function_alloc(vectorcallfunc vectorcall, PyObject *fn)
{
    Function *f = PyObject_GC_New(Function, &Function_Type);
    if (f == NULL) {
        return NULL;
    }
    f->vectorcall = vectorcall;
    f->fn = Py_NewRef(fn);
    f->retrier = f->schedule = f->classify = f->nesting = f->label = f->site = f->clock = NULL;
    f->general = f->timed = 0;
    f->dict = NULL;
    f->weakrefs = NULL;
    return f;
}

/* _decorated(fn, retrier, schedule, classify, nesting, label, site, clock, general, is_async):
 * is_async for a coroutine function whose calls all take the compiled path (general false). */
static PyObject *
decorated(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *fn, *retrier, *schedule, *classify, *nesting, *label, *site, *clock;
    int general, is_async = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOOp|p:_decorated", &fn, &retrier, &schedule, &classify, &nesting, &label,
                          &site, &clock, &general, &is_async)) {
        return NULL;
    }
    if (is_async && general) {
        PyErr_SetString(PyExc_ValueError, "_decorated: the general async path is the Python wrapper's");
        return NULL;
    }
    int timed = is_timed(schedule);
    if (timed < 0) {
        return NULL;
    }
    Function *f = function_alloc(is_async ? decorated_async_vectorcall : decorated_vectorcall, fn);
    if (f == NULL) {
        return NULL;
    }
    f->retrier = Py_NewRef(retrier);
    f->schedule = Py_NewRef(schedule);
    f->classify = Py_NewRef(classify);
    f->nesting = Py_NewRef(nesting);
    f->label = Py_NewRef(label);
    f->site = Py_NewRef(site);
    f->clock = Py_NewRef(clock);
    f->general = general;
    f->timed = timed;
    PyObject_GC_Track(f);
    return (PyObject *)f;
}

/* _compiled(kind, pure): the compiled `retry_sync` or `Retrying.call`; `pure` is the Python
 * function it stands for (called for anything unusual). */
static PyObject *
compiled(PyObject *module, PyObject *args)
{
    (void)module;
    const char *kind;
    PyObject *pure;
    if (!PyArg_ParseTuple(args, "sO:_compiled", &kind, &pure)) {
        return NULL;
    }
    vectorcallfunc vectorcall;
    if (strcmp(kind, "retry_sync") == 0) {
        vectorcall = retry_sync_vectorcall;
    }
    else if (strcmp(kind, "Retrying.call") == 0) {
        vectorcall = retrying_call_vectorcall;
    }
    else if (strcmp(kind, "retry") == 0) {
        vectorcall = retry_vectorcall;
    }
    else if (strcmp(kind, "Retrying.execute") == 0) {
        vectorcall = retrying_execute_vectorcall;
    }
    else {
        PyErr_Format(PyExc_ValueError, "_compiled: unknown kind %s", kind);
        return NULL;
    }
    Function *f = function_alloc(vectorcall, pure);
    if (f == NULL) {
        return NULL;
    }
    PyObject_GC_Track(f);
    return (PyObject *)f;
}

static int
function_traverse(Function *f, visitproc visit, void *arg)
{
    Py_VISIT(f->fn);
    Py_VISIT(f->retrier);
    Py_VISIT(f->schedule);
    Py_VISIT(f->classify);
    Py_VISIT(f->nesting);
    Py_VISIT(f->label);
    Py_VISIT(f->site);
    Py_VISIT(f->clock);
    Py_VISIT(f->dict);
    return 0;
}

/* What a cleared object (reachable only from a finalizer of its cycle) does when called. */
static PyObject *
cleared_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    (void)self;
    (void)args;
    (void)nargsf;
    (void)kwnames;
    PyErr_SetString(PyExc_RuntimeError, "this compiled stoic function was cleared by the garbage collector");
    return NULL;
}

static int
function_clear(Function *f)
{
    f->vectorcall = cleared_vectorcall;
    Py_CLEAR(f->fn);
    Py_CLEAR(f->retrier);
    Py_CLEAR(f->schedule);
    Py_CLEAR(f->classify);
    Py_CLEAR(f->nesting);
    Py_CLEAR(f->label);
    Py_CLEAR(f->site);
    Py_CLEAR(f->clock);
    Py_CLEAR(f->dict);
    return 0;
}

static void
function_dealloc(Function *f)
{
    PyObject_GC_UnTrack(f);
    if (f->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)f);
    }
    function_clear(f);
    PyObject_GC_Del(f);
}

/* Binds like a Python function: looked up on an instance, it is a bound method. */
static PyObject *
function_get(PyObject *self, PyObject *obj, PyObject *type)
{
    (void)type;
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
function_repr(Function *f)
{
    PyObject *name = f->dict == NULL ? NULL : PyDict_GetItemWithError(f->dict, s_qualname);
    if (name == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (name == NULL) {
        return PyUnicode_FromFormat("<compiled stoic function at %p>", f);
    }
    return PyUnicode_FromFormat("<compiled stoic function %S at %p>", name, f);
}

static PyObject *
function_wants_attempt(PyObject *self, void *closure)
{
    (void)self;
    (void)closure;
    /* As the Python wrappers (which take *args, **kwargs): callers never pass an Attempt. */
    Py_RETURN_FALSE;
}

/* Pickled (and copied) by reference to its qualified name in its module, as a function is. */
static PyObject *
function_reduce(Function *f, PyObject *unused)
{
    (void)unused;
    PyObject *name = f->dict == NULL ? NULL : PyDict_GetItemWithError(f->dict, s_qualname);
    if (name == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "cannot pickle a compiled stoic function without a __qualname__");
        }
        return NULL;
    }
    return Py_NewRef(name);
}

static PyMethodDef function_methods[] = {
    {"__reduce__", (PyCFunction)function_reduce, METH_NOARGS, "Pickled by qualified name, as a function."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef function_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"wants_attempt", function_wants_attempt, NULL, "False: callers never hand this an Attempt.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Function_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stoic._cretry.Function",
    .tp_basicsize = sizeof(Function),
    .tp_dealloc = (destructor)function_dealloc,
    .tp_vectorcall_offset = offsetof(Function, vectorcall),
    .tp_repr = (reprfunc)function_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A compiled stoic retry path that behaves like a Python function.",
    .tp_traverse = (traverseproc)function_traverse,
    .tp_clear = (inquiry)function_clear,
    .tp_weaklistoffset = offsetof(Function, weakrefs),
    .tp_methods = function_methods,
    .tp_getset = function_getset,
    .tp_descr_get = function_get,
    .tp_dictoffset = offsetof(Function, dict),
};

/* ---- module ------------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"_configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Hand over the Python objects the compiled paths use (stoic._retry, stoic.pipeline)."},
    {"_decorated", decorated, METH_VARARGS, "The compiled wrapper of a function decorated with @retrying."},
    {"_compiled", compiled, METH_VARARGS, "The compiled retry_sync, Retrying.call, retry or Retrying.execute."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cretry", "Compiled success paths of stoic's retry.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

static int
intern(PyObject **target, const char *text)
{
    *target = PyUnicode_InternFromString(text);
    return *target == NULL ? -1 : 0;
}

PyMODINIT_FUNC
PyInit__cretry(void)
{
    if (intern(&s_ever_set, "ever_set") < 0 || intern(&s_now_ns, "now_ns") < 0
        || intern(&s_old_value, "old_value") < 0 || intern(&s_attempt, "attempt") < 0
        || intern(&s_code, "__code__") < 0 || intern(&s_budget, "budget") < 0
        || intern(&s_classify, "classify") < 0 || intern(&s_nesting, "nesting") < 0
        || intern(&s_label, "label") < 0 || intern(&s_qualname, "__qualname__") < 0
        || intern(&s_name, "__name__") < 0
        || intern(&s_attempt_timeout, "attempt_timeout") < 0 || intern(&s_throw, "throw") < 0
        || intern(&s_close, "close") < 0 || intern(&s_cr_await, "cr_await") < 0) {
        return NULL;
    }
    minus_one = PyLong_FromLong(-1);
    if (minus_one == NULL || PyType_Ready(&Function_Type) < 0 || PyType_Ready(&Run_Type) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Function", (PyObject *)&Function_Type) < 0
        || PyModule_AddObjectRef(m, "Run", (PyObject *)&Run_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
