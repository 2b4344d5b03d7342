/* A request's token list checked and packed in C: the compiled fast path of
 * mamba_radix.lifecycle._check_token_list.
 *
 * One function, pack_int64(tokens) -> array('q') | None. It returns the list's values as a new int64
 * array('q') only when every item is one it can take without running any Python code and without any
 * doubt about the answer: `tokens` an exact list, each item an exact int in int64 range, True or False
 * (1 and 0: the Python path, struct.pack's 'q', takes bools as the ints they are). Anything else (not an
 * exact list, an int subclass, a numpy integer or any other object with __index__, a float, None, a str,
 * an int outside int64, the list resized while the array was allocated) returns None, "not handled": the
 * caller then runs the pure-Python reference, which accepts or refuses the same list exactly as it always
 * did (the same typed error, the same message). So this file never writes an error message, and the
 * reference decides every case it does not take (property_tests/test_token_check_c.py checks that the two
 * agree on random mixed lists).
 *
 * Why C: the reference costs ~6 ns a token (struct.pack over the unpacked list, then a copy), about 78 us
 * of a 12k-token prompt's admission; here a token is one type check and one read of the int's digits
 * (about 1.6 ns on a list in cache; past the cache both are bound by loading the int objects). Measured on
 * the Mooncake conversation replay: the admission check's median 75-80 us -> 17 us.
 *
 * Why the list cannot change under the loop: no Python code runs while items are read (exact ints and the
 * two bools are read without calls into Python, and nothing is allocated, so no garbage collection and no
 * finaliser can run), and the list's size is re-read after the one allocation that might collect.
 * Free-threaded builds (no GIL) always return None: another thread could resize the list mid-loop.
 *
 * Side effects: none (the list is only read). Errors: MemoryError when the array cannot be allocated.
 * O(len(tokens)).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* array('q', [0]): repeated n times it is an array of n int64 items (one allocation, one fill), whose
 * buffer the loop then writes; the array module has no C API to allocate one directly. */
static PyObject *zero_array;

/* The value of an exact int in int64 range into *out: 1; out of range: 0. Never raises (an exact int
 * has no __index__ to call). */
static inline int
exact_int_value(PyObject *item, int64_t *out)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item)) { /* one digit: the common token id */
        *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)item);
        return 1;
    }
#else
    /* CPython <= 3.11: the sign is the sign of ob_size, |ob_size| 30-bit digits */
    Py_ssize_t size = Py_SIZE(item);
    if (size == 1 || size == -1 || size == 0) {
        int64_t digit = size ? (int64_t)((PyLongObject *)item)->ob_digit[0] : 0;
        *out = size < 0 ? -digit : digit;
        return 1;
    }
#endif
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow != 0) {
        return 0;
    }
    if (value == -1 && PyErr_Occurred()) { /* not reachable for an exact int; refuse, never guess */
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)value;
    return 1;
}

PyDoc_STRVAR(pack_int64_doc,
             "pack_int64(tokens, /) -> array('q') | None\n\n"
             "A new int64 array('q') of the values of `tokens` when it is an exact list of exact ints in\n"
             "int64 range and bools; None for anything else (the caller then runs its Python check).");

static PyObject *
pack_int64(PyObject *Py_UNUSED(module), PyObject *tokens)
{
#ifdef Py_GIL_DISABLED
    (void)tokens;
    Py_RETURN_NONE;
#else
    if (!PyList_CheckExact(tokens)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t num_tokens = PyList_GET_SIZE(tokens);
    PyObject *out = PySequence_Repeat(zero_array, num_tokens);
    if (out == NULL) {
        return NULL;
    }
    /* the allocation may have collected garbage, and a finaliser may have resized the list */
    if (PyList_GET_SIZE(tokens) != num_tokens) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    if (view.len != num_tokens * (Py_ssize_t)sizeof(int64_t)) { /* not an 8-byte 'q' on this build */
        PyBuffer_Release(&view);
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    int64_t *dst = (int64_t *)view.buf;
    PyObject **items = ((PyListObject *)tokens)->ob_item;
    Py_ssize_t i = 0;
    for (; i < num_tokens; i++) {
        PyObject *item = items[i];
        if (Py_IS_TYPE(item, &PyLong_Type)) {
            if (!exact_int_value(item, &dst[i])) {
                break;
            }
        }
        else if (item == Py_True) {
            dst[i] = 1;
        }
        else if (item == Py_False) {
            dst[i] = 0;
        }
        else {
            break; /* an int subclass, __index__, float, None, str...: the reference decides */
        }
    }
    PyBuffer_Release(&view);
    if (i < num_tokens) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
#endif
}

static PyMethodDef ctokens_methods[] = {
    {"pack_int64", (PyCFunction)pack_int64, METH_O, pack_int64_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ctokens_module = {
    PyModuleDef_HEAD_INIT,
    "mamba_radix._ctokens",
    "A request's token list checked and packed in C (optional: mamba_radix.lifecycle falls back to its "
    "Python check).",
    -1,
    ctokens_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__ctokens(void)
{
    if (sizeof(long long) != sizeof(int64_t)) {
        PyErr_SetString(PyExc_ImportError, "mamba_radix._ctokens needs a 64-bit long long");
        return NULL;
    }
    PyObject *array_module = PyImport_ImportModule("array");
    if (array_module == NULL) {
        return NULL;
    }
    zero_array = PyObject_CallMethod(array_module, "array", "s[i]", "q", 0);
    Py_DECREF(array_module);
    if (zero_array == NULL) {
        return NULL;
    }
    return PyModule_Create(&ctokens_module);
}
