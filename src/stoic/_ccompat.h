/* What both compiled modules (_cbreaker.c, _cretry.c) need from CPython beyond its stable
 * surface, kept building on 3.11, 3.12 and 3.13: stand-ins for private helpers that moved or
 * went away, and the pieces of the coroutine protocol (`await`, `throw`, `close` as CPython's
 * own coroutines do them) that both compiled awaitables follow, written with public calls only.
 * Included once by each module. */
#ifndef STOIC_CCOMPAT_H
#define STOIC_CCOMPAT_H


/* Written against 3.11; these keep it building where private helpers moved (3.12, 3.13). */
#if PY_VERSION_HEX >= 0x030D0000
#define lookup_attr PyObject_GetOptionalAttr
#define CORO_CREATED (-3) /* the frame state of a coroutine that has not started */
#else
#define lookup_attr _PyObject_LookupAttr
#define CORO_CREATED (-2)
#endif

/* Raise StopIteration(value) (a tuple or an exception as the value must be wrapped). */
static inline void
set_stop_iteration(PyObject *value)
{
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, value);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
}

/* 0 and the value (a new reference) when the pending error is StopIteration or there is none;
 * -1 with the error left in place otherwise. */
static inline int
fetch_stop_iteration(PyObject **value)
{
    if (!PyErr_Occurred()) {
        *value = Py_NewRef(Py_None);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) {
        return -1;
    }
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    *value = Py_NewRef(((PyStopIterationObject *)exc)->value);
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    return 0;
}

/* Replace the pending StopIteration by RuntimeError(message) caused by it, as a coroutine does. */
static inline void
replace_stop_iteration(const char *message)
{
    PyObject *type, *cause, *tb;
    PyErr_Fetch(&type, &cause, &tb);
    PyErr_NormalizeException(&type, &cause, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(cause, tb);
    }
    PyErr_SetString(PyExc_RuntimeError, message);
    PyObject *type2, *error, *tb2;
    PyErr_Fetch(&type2, &error, &tb2);
    PyErr_NormalizeException(&type2, &error, &tb2);
    PyException_SetContext(error, Py_NewRef(cause));
    PyException_SetCause(error, cause); /* steals */
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyErr_Restore(type2, error, tb2);
}

/* With a new exception set, make the fetched (type, value, tb) its __context__, as raising inside
 * an `except`/`finally` block does (for the private _PyErr_ChainExceptions, deprecated in 3.12
 * and gone in 3.13). Steals the three references. */
static inline void
chain_exception(PyObject *type, PyObject *value, PyObject *tb)
{
    if (type == NULL) {
        return;
    }
    if (!PyErr_Occurred()) {
        PyErr_Restore(type, value, tb);
        return;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
        Py_DECREF(tb);
    }
    Py_DECREF(type);
    PyObject *new_type, *new_value, *new_tb;
    PyErr_Fetch(&new_type, &new_value, &new_tb);
    PyErr_NormalizeException(&new_type, &new_value, &new_tb);
    if (new_tb != NULL) {
        PyException_SetTraceback(new_value, new_tb);
    }
    PyException_SetContext(new_value, value); /* steals value */
    PyErr_Restore(new_type, new_value, new_tb);
}

/* Whether a generator is an iterable coroutine (decorated with types.coroutine). */
static inline int
is_iterable_coroutine(PyObject *o)
{
    if (!PyGen_CheckExact(o)) {
        return 0;
    }
    PyObject *code = PyObject_GetAttrString(o, "gi_code");
    if (code == NULL) {
        PyErr_Clear();
        return 0;
    }
    int flag = PyCode_Check(code) && (((PyCodeObject *)code)->co_flags & CO_ITERABLE_COROUTINE);
    Py_DECREF(code);
    return flag;
}


/* `await o`: the iterator to delegate to, as the interpreter finds it (GET_AWAITABLE): a coroutine
 * or an iterable coroutine itself, else o.__await__(), checked as CPython checks it.
 * `name_cr_await` is the interned "cr_await". */
static inline PyObject *
awaitable_iter(PyObject *o, PyObject *name_cr_await)
{
    if (PyCoro_CheckExact(o)) {
        /* A suspended coroutine may be awaited by someone else already. */
        if (((PyCoroObject *)o)->cr_frame_state != CORO_CREATED) {
            PyObject *awaiting = PyObject_GetAttr(o, name_cr_await);
            if (awaiting == NULL) {
                return NULL;
            }
            int busy = awaiting != Py_None;
            Py_DECREF(awaiting);
            if (busy) {
                PyErr_SetString(PyExc_RuntimeError, "coroutine is being awaited already");
                return NULL;
            }
        }
        return Py_NewRef(o);
    }
    if (is_iterable_coroutine(o)) {
        return Py_NewRef(o);
    }
    PyTypeObject *type = Py_TYPE(o);
    unaryfunc getter = type->tp_as_async != NULL ? type->tp_as_async->am_await : NULL;
    if (getter == NULL) {
        PyErr_Format(PyExc_TypeError, "object %.100s can't be used in 'await' expression", type->tp_name);
        return NULL;
    }
    PyObject *res = getter(o);
    if (res == NULL) {
        return NULL;
    }
    if (PyCoro_CheckExact(res) || is_iterable_coroutine(res)) {
        PyErr_SetString(PyExc_TypeError, "__await__() returned a coroutine");
        Py_DECREF(res);
        return NULL;
    }
    if (!PyIter_Check(res)) {
        PyErr_Format(PyExc_TypeError, "__await__() returned non-iterator of type '%.100s'", Py_TYPE(res)->tp_name);
        Py_DECREF(res);
        return NULL;
    }
    return res;
}


/* Close the awaited iterator, as `yield from` does on GeneratorExit: 0, or -1 when close()
 * raised. `name_close` is the interned "close". */
static inline int
close_iter(PyObject *inner, PyObject *name_close)
{
    PyObject *meth;
    if (lookup_attr(inner, name_close, &meth) < 0) {
        PyErr_WriteUnraisable(inner);
        return 0;
    }
    if (meth == NULL) {
        return 0;
    }
    PyObject *r = PyObject_CallNoArgs(meth);
    Py_DECREF(meth);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}


/* Set the exception throw(typ[, val[, tb]]) describes, checked as coroutine.throw checks it. */
static inline int
set_thrown(PyObject *typ, PyObject *val, PyObject *tb)
{
    if (tb == Py_None) {
        tb = NULL;
    }
    else if (tb != NULL && !PyTraceBack_Check(tb)) {
        PyErr_SetString(PyExc_TypeError, "throw() third argument must be a traceback object");
        return -1;
    }
    Py_INCREF(typ);
    Py_XINCREF(val);
    Py_XINCREF(tb);
    if (PyExceptionClass_Check(typ)) {
        PyErr_NormalizeException(&typ, &val, &tb);
    }
    else if (PyExceptionInstance_Check(typ)) {
        if (val != NULL && val != Py_None) {
            PyErr_SetString(PyExc_TypeError, "instance exception may not have a separate value");
            goto failed;
        }
        Py_XDECREF(val);
        val = typ;
        typ = Py_NewRef(PyExceptionInstance_Class(typ));
        if (tb == NULL) {
            tb = PyException_GetTraceback(val);
        }
    }
    else {
        PyErr_Format(PyExc_TypeError, "exceptions must be classes or instances deriving from BaseException, not %s",
                     Py_TYPE(typ)->tp_name);
        goto failed;
    }
    PyErr_Restore(typ, val, tb);
    return 0;
failed:
    Py_DECREF(typ);
    Py_XDECREF(val);
    Py_XDECREF(tb);
    return -1;
}


/* Whether a plain operation returned something to await (a coroutine, or the awaitable of a
 * compiled execute()/retry()): a coroutine or one of `types` (_native.ASYNC_RESULTS, a tuple). Types without async slots (ints,
 * dicts, ... nearly every result) are answered without looking at the tuple. */
static inline int
is_async_result(PyObject *result, PyObject *types)
{
    PyTypeObject *type = Py_TYPE(result);
    if (type->tp_as_async == NULL) {
        return 0;
    }
    if (type == &PyCoro_Type) {
        return 1;
    }
    if (types == NULL || !PyTuple_Check(types)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); i++) {
        if ((PyObject *)type == PyTuple_GET_ITEM(types, i)) {
            return 1;
        }
    }
    return 0;
}

#endif /* STOIC_CCOMPAT_H */
