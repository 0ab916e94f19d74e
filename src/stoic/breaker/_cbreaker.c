#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cbreaker", "stub", -1, NULL,
};

PyMODINIT_FUNC PyInit__cbreaker(void) { return PyModule_Create(&module); }
