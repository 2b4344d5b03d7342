/* The radix tree's page-1 walk in C: the compiled core of mamba_radix.tree._walk_in_scratch.
 *
 * One function, walk_in_scratch(scratch, tokens, child, num_tokens, path) -> (path, pos, partial), with
 * exactly the contract and result of the pure-Python _walk_in_scratch in mamba_radix/tree.py, which stays
 * the reference (property_tests/test_tree_walk_c.py checks that the two agree). Why C: the Python loop
 * costs a few hundred ns of interpreter work per node (attribute loads, a bound startswith, a dict.get
 * keyed by a fresh Python int); here a node costs two slot reads, one buffer export, one memcmp and one
 * dict lookup (on a 100k-node tree the walk is then bound by cache misses, not instructions).
 *
 * Node fields: TreeNode's `key` and `children` are __slots__ members, read at their offsets (what the
 * member descriptor does; cached per type and type version, see direct_slots); any other node type goes
 * through PyObject_GetAttr. node.key is read through the buffer protocol (a C-contiguous 1-D int64
 * buffer: TokenIds, array('q')); node.children must be an exact dict keyed by the edge's first token as
 * a Python int. Anything outside that contract (a key that is not an int64 buffer, children that are not a dict,
 * a path that is not a list, num_tokens outside [0, len(tokens)] or beyond the scratch buffer) raises
 * TypeError with `path` restored to its length on entry, so the caller can run the Python reference
 * instead. Any other error (MemoryError, an AttributeError from a node without `key`) propagates, `path`
 * restored likewise.
 *
 * Side effects: appends the matched nodes to `path` (new references held by the list). Buffers exported
 * by `scratch`, `tokens` and each edge key are released before returning. O(len(tokens) + path).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include <structmember.h>

static PyObject *str_key;      /* interned "key" */
static PyObject *str_children; /* interned "children" */

/* Where a node type keeps `key` and `children` when both are plain __slots__ members (T_OBJECT_EX) and
 * attribute access is the generic one: the walk then reads the two slots directly (what the member
 * descriptor does, without the lookup). One entry, keyed by the type and its version tag, which CPython
 * changes whenever the type or a base is modified (a class attribute replaced by a property, say), so a
 * stale entry is never used; version tags are never reused, so a freed type cannot alias. Any other
 * type takes PyObject_GetAttr. */
static PyTypeObject *slots_type;
static unsigned int slots_version;
static Py_ssize_t key_offset, children_offset;

static int
member_offset(PyTypeObject *tp, PyObject *name, Py_ssize_t *offset)
{
    PyObject *descr = _PyType_Lookup(tp, name); /* borrowed; sets no error */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        return 0;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & PY_AUDIT_READ)) {
        return 0;
    }
    *offset = member->offset;
    return 1;
}

/* Whether nodes of type tp may be read through the slot offsets (refreshing the entry when needed). */
static int
direct_slots(PyTypeObject *tp)
{
    if (tp == slots_type && PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) &&
        tp->tp_version_tag == slots_version) {
        return 1;
    }
    Py_ssize_t k, c;
    if (tp->tp_getattro != PyObject_GenericGetAttr || !member_offset(tp, str_key, &k) ||
        !member_offset(tp, str_children, &c) || !PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) {
        return 0; /* _PyType_Lookup assigns a version tag where it can; without one nothing is cached */
    }
    slots_type = tp;
    slots_version = tp->tp_version_tag;
    key_offset = k;
    children_offset = c;
    return 1;
}

/* node.<name> as a new reference: the slot read directly when `direct`, else the attribute protocol. An
 * empty slot goes through the protocol too, which raises the AttributeError. */
static inline PyObject *
node_field(PyObject *node, int direct, Py_ssize_t offset, PyObject *name)
{
    if (direct) {
        PyObject *value = *(PyObject **)((char *)node + offset);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
    }
    return PyObject_GetAttr(node, name);
}

/* A 1-D C-contiguous buffer of 8-byte signed ints ("q", or "l" where long is 8 bytes), or TypeError. */
static int
get_int64_buffer(PyObject *obj, Py_buffer *view, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous int64 buffer (array('q')), got %.100s",
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *fmt = view->format != NULL ? view->format : "B";
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<') {
        /* native or little-endian standard size: the same bytes as 'q' on the machines we build for */
        if (fmt[0] != '@') {
            const uint16_t one = 1;
            if (*(const uint8_t *)&one != 1) {
                goto bad;
            }
        }
        fmt++;
    }
    if (view->ndim != 1 || view->itemsize != 8 || fmt[1] != '\0' ||
        !(fmt[0] == 'q' || (fmt[0] == 'l' && sizeof(long) == 8))) {
        goto bad;
    }
    return 0;
bad:
    PyErr_Format(PyExc_TypeError, "%s must be a 1-D int64 buffer (format 'q'), got format %.20s, ndim %d",
                 what, view->format != NULL ? view->format : "B", view->ndim);
    PyBuffer_Release(view);
    return -1;
}

/* Index of the first differing int64 among the first n of a and b (n when all n agree). */
static Py_ssize_t
first_mismatch(const char *a, const char *b, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        int64_t x, y; /* memcpy: no alignment assumption on either buffer */
        memcpy(&x, a + i * 8, 8);
        memcpy(&y, b + i * 8, 8);
        if (x != y) {
            break;
        }
    }
    return i;
}

PyDoc_STRVAR(walk_in_scratch_doc,
             "walk_in_scratch(scratch, tokens, child, num_tokens, path) -> (path, pos, partial)\n"
             "\n"
             "The compiled page-1 walk: the same result as mamba_radix.tree._walk_in_scratch for every\n"
             "input within its contract (scratch holds the first num_tokens tokens of tokens as int64;\n"
             "child is the first edge's node). Appends the matched nodes to path. Raises TypeError,\n"
             "path unchanged, for an input outside the contract (the caller then runs the Python loop).\n"
             "O(len(tokens) + path).");

static PyObject *
walk_in_scratch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "walk_in_scratch expects 5 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *scratch_obj = args[0], *tokens_obj = args[1], *child = args[2], *path = args[4];
    if (!PyList_CheckExact(path)) {
        PyErr_Format(PyExc_TypeError, "path must be a list, got %.100s", Py_TYPE(path)->tp_name);
        return NULL;
    }
    if (!PyLong_Check(args[3])) {
        PyErr_Format(PyExc_TypeError, "num_tokens must be an int, got %.100s", Py_TYPE(args[3])->tp_name);
        return NULL;
    }
    Py_ssize_t num_tokens = PyLong_AsSsize_t(args[3]);
    if (num_tokens == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "num_tokens does not fit a Py_ssize_t");
        return NULL;
    }

    Py_buffer scratch, tokens, edge;
    if (PyObject_GetBuffer(scratch_obj, &scratch, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "scratch must be a bytes-like buffer, got %.100s",
                     Py_TYPE(scratch_obj)->tp_name);
        return NULL;
    }
    if (get_int64_buffer(tokens_obj, &tokens, "tokens") < 0) {
        PyBuffer_Release(&scratch);
        return NULL;
    }
    if (num_tokens < 0 || num_tokens > tokens.len / 8 || num_tokens > scratch.len / 8) {
        PyErr_Format(PyExc_TypeError,
                     "num_tokens=%zd must lie in [0, len(tokens)=%zd] and fit the scratch buffer "
                     "(%zd tokens)",
                     num_tokens, tokens.len / 8, scratch.len / 8);
        PyBuffer_Release(&tokens);
        PyBuffer_Release(&scratch);
        return NULL;
    }
    const char *haystack = (const char *)scratch.buf;
    const char *ids = (const char *)tokens.buf;
    const Py_ssize_t path_len_on_entry = PyList_GET_SIZE(path);

    Py_ssize_t pos = 0, partial = 0;
    PyObject *children = NULL;
    Py_INCREF(child); /* our own reference: the loop outlives the borrowed argument's guarantees */
    for (;;) {
        const int direct = direct_slots(Py_TYPE(child));
        PyObject *key = node_field(child, direct, key_offset, str_key);
        if (key == NULL) {
            goto error;
        }
        int got = get_int64_buffer(key, &edge, "node.key");
        Py_DECREF(key); /* the buffer view holds its own reference to the exporter */
        if (got < 0) {
            goto error;
        }
        const Py_ssize_t edge_len = edge.len / 8;
        const Py_ssize_t end = pos + edge_len;
        if (PyList_Append(path, child) < 0) {
            PyBuffer_Release(&edge);
            goto error;
        }
        if (end > num_tokens || memcmp(edge.buf, haystack + pos * 8, (size_t)edge_len * 8) != 0) {
            /* the first mismatch is inside this edge (or the key ends there): always a partial match */
            Py_ssize_t n = edge_len < num_tokens - pos ? edge_len : num_tokens - pos;
            partial = first_mismatch((const char *)edge.buf, haystack + pos * 8, n);
            PyBuffer_Release(&edge);
            goto done;
        }
        PyBuffer_Release(&edge);
        if (end == num_tokens) {
            pos = end;
            goto done;
        }
        children = node_field(child, direct, children_offset, str_children);
        if (children == NULL) {
            goto error;
        }
        if (!PyDict_CheckExact(children)) {
            PyErr_Format(PyExc_TypeError, "node.children must be a dict, got %.100s",
                         Py_TYPE(children)->tp_name);
            goto error;
        }
        pos = end;
        if (PyDict_GET_SIZE(children) == 0) {
            goto done;
        }
        int64_t first;
        memcpy(&first, ids + end * 8, 8);
        PyObject *first_obj = PyLong_FromLongLong((long long)first);
        if (first_obj == NULL) {
            goto error;
        }
        PyObject *next = PyDict_GetItemWithError(children, first_obj); /* borrowed from children */
        Py_DECREF(first_obj);
        if (next == NULL) {
            if (PyErr_Occurred()) {
                goto error;
            }
            goto done;
        }
        Py_INCREF(next);
        Py_CLEAR(children);
        Py_SETREF(child, next);
    }

done:
    Py_XDECREF(children);
    Py_DECREF(child);
    PyBuffer_Release(&tokens);
    PyBuffer_Release(&scratch);
    return Py_BuildValue("(Onn)", path, pos, partial);

error:
    Py_XDECREF(children);
    Py_DECREF(child);
    PyBuffer_Release(&tokens);
    PyBuffer_Release(&scratch);
    {
        /* leave the caller's list as it was: a fallback to the Python loop starts from the same path */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        if (PyList_GET_SIZE(path) > path_len_on_entry &&
            PyList_SetSlice(path, path_len_on_entry, PyList_GET_SIZE(path), NULL) < 0) {
            Py_XDECREF(exc_type);
            Py_XDECREF(exc_value);
            Py_XDECREF(exc_tb);
            return NULL; /* the slice's own error replaces the first */
        }
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    return NULL;
}

static PyMethodDef cwalk_methods[] = {
    {"walk_in_scratch", (PyCFunction)(void (*)(void))walk_in_scratch, METH_FASTCALL, walk_in_scratch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cwalk_module = {
    PyModuleDef_HEAD_INIT,
    "mamba_radix._cwalk",
    "The radix tree's page-1 walk compiled (optional: mamba_radix.tree falls back to its Python loop).",
    -1,
    cwalk_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__cwalk(void)
{
    str_key = PyUnicode_InternFromString("key");
    str_children = PyUnicode_InternFromString("children");
    if (str_key == NULL || str_children == NULL) {
        return NULL;
    }
    return PyModule_Create(&cwalk_module);
}
