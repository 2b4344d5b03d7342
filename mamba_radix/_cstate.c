/* One state slot copied into another in C: the compiled fast path of the trusted single-slot copy in
 * mamba_radix.pools.mamba_pool.MambaPool.copy_from (a copy-on-write at admission, a hand-over's copy).
 *
 * One function, copy_row(views, src, dst) -> bool. `views` is a list of byte buffers of the pool's CPU
 * state tensors: the pool passes memoryviews of its numpy uint8 views (MambaPool._byte_buffers, beside
 * _host_byte_views), each C-contiguous and writable, [rows, bytes] for one layer or [layers, rows, bytes]. It copies row `src` over row `dst` in every view (per layer)
 * and returns True. Anything outside that contract (`views` not an exact list, an item without a
 * C-contiguous writable byte buffer of 2 or 3 dimensions, a slot that is not an exact int, a slot outside
 * [0, rows) of some view) returns False before anything is written: "not handled", and the caller runs
 * the pure-Python reference (mamba_radix_kernels.naive.copy_slot_ints), which copies or raises as it
 * always did. So this file never writes an error message (property_tests/test_state_copy_c.py checks the
 * two agree byte for byte, and that a refusal writes nothing).
 *
 * Why C: the reference is one numpy __setitem__ per view (~1 us each with its index parsing), and the
 * Python layers above it (state_ops.copy_slots's dispatch) cost a few more; here a view is one buffer
 * export and one memcpy per layer. On the conversation replay this is the copy-on-write of every
 * admission that hits.
 *
 * Why nothing can change between the check and the copy: every buffer is exported (and so pinned) before
 * the first byte is written, and no Python code runs meanwhile (a memoryview's or a numpy array's buffer
 * export is C). src == dst copies nothing (the row already holds itself). Side effects: writes row dst of every view. Errors:
 * none of its own (MemoryError only if more than MAX_VIEWS views would need a heap array: then False).
 * O(views * layers + bytes copied).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#define MAX_VIEWS 64 /* a pool has one view per state tensor: conv tensors plus the temporal one */

/* An exact int's value as a Py_ssize_t into *out: 1; anything else (not an exact int, out of range): 0,
 * with no error set. */
static int
slot_value(PyObject *obj, Py_ssize_t *out)
{
    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v < 0 || v > PY_SSIZE_T_MAX) {
        return 0;
    }
    *out = (Py_ssize_t)v;
    return 1;
}

/* Export `obj`'s buffer into *buf if it is a writable C-contiguous byte buffer of 2 or 3 dimensions
 * whose row axis (the second to last) holds both slots: 1 (the caller releases it); else 0, nothing
 * held, no error set. */
static int
export_view(PyObject *obj, Py_buffer *buf, Py_ssize_t src, Py_ssize_t dst)
{
    if (PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 0;
    }
    int ok = (buf->ndim == 2 || buf->ndim == 3) && buf->itemsize == 1 && buf->format != NULL &&
             (strcmp(buf->format, "B") == 0 || strcmp(buf->format, "b") == 0);
    if (ok) {
        Py_ssize_t rows = buf->shape[buf->ndim - 2];
        ok = src < rows && dst < rows;
    }
    if (!ok) {
        PyBuffer_Release(buf);
    }
    return ok;
}

static PyObject *
copy_row(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "copy_row(views, src, dst) takes exactly 3 arguments");
        return NULL;
    }
    PyObject *views = args[0];
    Py_ssize_t src, dst;
    if (!PyList_CheckExact(views) || !slot_value(args[1], &src) || !slot_value(args[2], &dst)) {
        Py_RETURN_FALSE;
    }
    Py_ssize_t n = PyList_GET_SIZE(views);
    if (n > MAX_VIEWS) {
        Py_RETURN_FALSE;
    }
    Py_buffer bufs[MAX_VIEWS];
    Py_ssize_t held = 0;
    for (; held < n; held++) { /* no Python code runs here: the list cannot change under the loop */
        if (!export_view(PyList_GET_ITEM(views, held), &bufs[held], src, dst)) {
            break;
        }
    }
    if (held == n && src != dst) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_buffer *b = &bufs[i];
            Py_ssize_t rows = b->shape[b->ndim - 2], row_bytes = b->shape[b->ndim - 1];
            Py_ssize_t layers = b->ndim == 3 ? b->shape[0] : 1;
            char *base = (char *)b->buf;
            for (Py_ssize_t layer = 0; layer < layers; layer++) {
                char *rows_of_layer = base + layer * rows * row_bytes;
                memcpy(rows_of_layer + dst * row_bytes, rows_of_layer + src * row_bytes, (size_t)row_bytes);
            }
        }
    }
    for (Py_ssize_t i = 0; i < held; i++) {
        PyBuffer_Release(&bufs[i]);
    }
    if (held != n) {
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"copy_row", (PyCFunction)(void (*)(void))copy_row, METH_FASTCALL,
     "copy_row(views, src, dst) -> bool: row src copied over row dst in every byte view (True), or "
     "nothing written (False: outside the contract; run the Python reference)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_cstate", "A state slot copied in C (see _cstate.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__cstate(void)
{
    return PyModule_Create(&module_def);
}
