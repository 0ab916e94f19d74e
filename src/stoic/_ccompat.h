/* What both compiled modules (_cbreaker.c, _cretry.c) need from CPython beyond its stable
 * surface, kept building on 3.11, 3.12 and 3.13: stand-ins for private helpers that moved or
 * went away, written with public calls only. Included once by each module. */
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

#endif /* STOIC_CCOMPAT_H */
