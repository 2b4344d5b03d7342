/* A trusted free of several chunks of ids in C: the compiled fast path of
 * mamba_radix.pools.host_free_list.HostFreeList.free_chunks (an eviction returning its victims' KV
 * indices, one chunk per removed node).
 *
 * One function, release_ids(bits, pending, chunks) -> bool. `bits` is the free list's allocation bitmap
 * (a writable C-contiguous 1-D byte buffer of num_ids + 2 entries: 0 is padding, num_ids + 1 a sentinel),
 * `pending` its pending marks (the same shape) or None, `chunks` a list of C-contiguous 1-D int64 buffers
 * (numpy views of the victims' index tensors). For every id of every chunk it clears bits[id] and, with
 * `pending`, sets pending[id], and returns True. Anything outside that contract (`chunks` not an exact
 * list, a buffer of another shape, item size or format, a read-only bitmap, an id outside 1..num_ids)
 * returns False before anything is written: "not handled", and the caller runs the pure-Python reference
 * (numpy scatters), which frees or raises as it always did. So this file writes no error message of its
 * own (TypeError for a wrong argument count and MemoryError aside; property_tests/test_free_chunks.py
 * checks the two agree, and that a refusal writes nothing).
 *
 * Why C: the reference is two numpy fancy-index scatters per chunk (bitmap, pending marks), ~1.3 ns per id
 * each on this machine, after a torch.cat and a copy of all the ids; an eviction of a long conversation's
 * leaves frees 50-120k ids in one call. Here the ids are walked as runs of ascending consecutive ids (a
 * node's KV comes from allocations of a sorted free list: ~90% of an eviction's chunks are one run, the
 * rest a few), each checked by its ends and written with two memsets; reading the ids is then the cost
 * (~0.5 ns each here). Scattered ids still work, one-id runs, at a few ns each.
 *
 * Why nothing can change between the check and the writes: every buffer is exported (and so pinned)
 * before the first byte is written, and no Python code runs meanwhile. Repeated ids are not checked (the
 * caller's contract, as a trusted free's): writing the same two bytes twice is harmless here. Side
 * effects: writes bits and pending at the chunks' ids. O(ids): one read of each id, and a second only for a
 * chunk of more than one run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define STACK_CHUNKS 64 /* an eviction frees one chunk per removed node: more than this go on the heap */

/* Export a writable C-contiguous 1-D byte buffer (numpy bool or uint8) of exactly `len` entries into
 * *buf: 1 (the caller releases it); else 0, nothing held, no error set. */
static int
export_flags(PyObject *obj, Py_buffer *buf, Py_ssize_t len)
{
    if (PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 0;
    }
    int ok = buf->ndim == 1 && buf->itemsize == 1 && buf->format != NULL &&
             (strcmp(buf->format, "?") == 0 || strcmp(buf->format, "B") == 0) &&
             (len < 0 || buf->shape[0] == len);
    if (!ok) {
        PyBuffer_Release(buf);
    }
    return ok;
}

/* Export a C-contiguous 1-D int64 buffer into *buf: 1 (the caller releases it); else 0, nothing held, no
 * error set. */
static int
export_ids(PyObject *obj, Py_buffer *buf)
{
    if (PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 0;
    }
    int ok = buf->ndim == 1 && buf->itemsize == 8 && buf->format != NULL &&
             (strcmp(buf->format, "q") == 0 || (strcmp(buf->format, "l") == 0 && sizeof(long) == 8));
    if (!ok) {
        PyBuffer_Release(buf);
    }
    return ok;
}

/* The end (exclusive) of the run of ascending consecutive ids starting at p[i], i < k. */
static Py_ssize_t
next_run(const int64_t *p, Py_ssize_t i, Py_ssize_t k)
{
    const int64_t first = p[i] - i; /* p[j] == first + j along the run */
    Py_ssize_t j = i + 1;
    while (j < k && p[j] == first + j) {
        j++;
    }
    return j;
}

static PyObject *
release_ids(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "release_ids(bits, pending, chunks) takes exactly 3 arguments");
        return NULL;
    }
    PyObject *chunks = args[2];
    if (!PyList_CheckExact(chunks)) {
        Py_RETURN_FALSE;
    }
    Py_ssize_t n = PyList_GET_SIZE(chunks), held = 0;
    Py_buffer bits, pending, stack_ids[STACK_CHUNKS], *ids = stack_ids;
    unsigned char stack_one_run[STACK_CHUNKS], *one_run = stack_one_run; /* 1: one ascending run */
    if (n > STACK_CHUNKS) {
        ids = PyMem_Malloc((size_t)n * sizeof(Py_buffer));
        one_run = PyMem_Malloc((size_t)n);
        if (ids == NULL || one_run == NULL) {
            PyMem_Free(ids);
            PyMem_Free(one_run);
            return PyErr_NoMemory();
        }
    }
    if (!export_flags(args[0], &bits, -1)) {
        if (ids != stack_ids) {
            PyMem_Free(ids);
            PyMem_Free(one_run);
        }
        Py_RETURN_FALSE;
    }
    Py_ssize_t len = bits.shape[0];
    int has_pending = args[1] != Py_None;
    int ok = !has_pending || export_flags(args[1], &pending, len);
    if (!ok) {
        has_pending = 0; /* nothing exported to release */
    }
    const uint64_t high = (uint64_t)(len - 2); /* ids 1..num_ids: id - 1 < num_ids, unsigned */
    ok = ok && len >= 2;
    /* the first pass: export every chunk and check every id, writing nothing, run by run (a run is a
     * stretch of ascending consecutive ids: first, first + 1, ...; in range iff both its ends are) */
    for (; ok && held < n; held++) {
        if (!export_ids(PyList_GET_ITEM(chunks, held), &ids[held])) {
            ok = 0;
            break;
        }
        const int64_t *p = (const int64_t *)ids[held].buf;
        Py_ssize_t k = ids[held].shape[0], runs = 0;
        for (Py_ssize_t i = 0; ok && i < k; runs++) {
            Py_ssize_t j = next_run(p, i, k);
            ok = (uint64_t)p[i] - 1u < high && (uint64_t)p[j - 1] - 1u < high; /* 0, negatives wrap */
            i = j;
        }
        one_run[held] = runs == 1;
    }
    if (ok) { /* the second pass: two memsets per run (a single-run chunk's ids are not read again) */
        unsigned char *b = (unsigned char *)bits.buf;
        unsigned char *pend = has_pending ? (unsigned char *)pending.buf : NULL;
        for (Py_ssize_t c = 0; c < n; c++) {
            const int64_t *p = (const int64_t *)ids[c].buf;
            Py_ssize_t k = ids[c].shape[0];
            for (Py_ssize_t i = 0; i < k;) {
                Py_ssize_t j = one_run[c] ? k : next_run(p, i, k);
                memset(b + p[i], 0, (size_t)(j - i));
                if (pend != NULL) {
                    memset(pend + p[i], 1, (size_t)(j - i));
                }
                i = j;
            }
        }
    }
    for (Py_ssize_t c = 0; c < held && c < n; c++) {
        PyBuffer_Release(&ids[c]);
    }
    if (has_pending) {
        PyBuffer_Release(&pending);
    }
    PyBuffer_Release(&bits);
    if (ids != stack_ids) {
        PyMem_Free(ids);
        PyMem_Free(one_run);
    }
    if (ok) {
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"release_ids", (PyCFunction)(void (*)(void))release_ids, METH_FASTCALL,
     "release_ids(bits, pending, chunks) -> bool: clear bits[id] (and set pending[id]) for every int64 id "
     "of every chunk; False, nothing written, for anything outside the contract."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cfree", "A trusted multi-chunk free of a host free list's ids, compiled.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__cfree(void)
{
    return PyModule_Create(&module);
}
