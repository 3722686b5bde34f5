/* gateway.wire._column_loops: the one per-record walk of gateway.wire.columns, compiled.

gateway/wire/columns.py holds the same function in Python (py_walk), says what it returns and why, and picks
this module when it was built; tests/unit/test_columns.py checks that both agree with Batch.raw(). Integers in a
batch are little-endian; the columns are native int64 (the machines this runs on are little-endian too, and
numpy and Arrow read them as they are).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define RECORD_SIZE 17 /* delta u32, ts_ns u64, key_len u8, body_len u32 */
#define COLUMNS 6      /* seq, ts_ns, key_start, key_len, body_start, body_len */

static inline uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Whether the key at k (klen bytes) starts with one of `prefixes` (a tuple of bytes); all match when empty. */
static int wanted(PyObject *prefixes, const unsigned char *key, Py_ssize_t klen)
{
    const Py_ssize_t n = PyTuple_GET_SIZE(prefixes);
    if (n == 0)
        return 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyTuple_GET_ITEM(prefixes, i);
        const Py_ssize_t plen = PyBytes_GET_SIZE(p);
        if (plen <= klen && memcmp(PyBytes_AS_STRING(p), key, (size_t)plen) == 0)
            return 1;
    }
    return 0;
}

PyDoc_STRVAR(walk_doc, "walk(buf, first, count, overhead, start, lo, hi, prefixes) -> (columns, n): see columns.py.");

static PyObject *walk(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    unsigned long long first, lo, hi;
    Py_ssize_t count, overhead, start;
    PyObject *prefixes;
    if (!PyArg_ParseTuple(args, "y*KnnnKKO!:walk", &view, &first, &count, &overhead, &start, &lo, &hi, &PyTuple_Type,
                          &prefixes))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(prefixes, i))) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "walk(): prefixes must be a tuple of bytes");
            return NULL;
        }
    }
    if (overhead < RECORD_SIZE || start < 0 || count < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "walk(): overhead below the record header size, or a negative start/count");
        return NULL;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(COLUMNS * sizeof(int64_t)) * count);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int64_t *col = (int64_t *)PyByteArray_AS_STRING(out);
    memset(col, 0, (size_t)PyByteArray_GET_SIZE(out)); /* unfilled rows hold zeros, never old heap bytes */
    const unsigned char *buf = view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = start, n = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        /* Batch.parse has checked every bound; checked again here, as memory safety must not rest on a caller. */
        if (pos + overhead > end)
            goto past_end;
        const uint64_t seq = first + le(buf + pos, 4);
        const Py_ssize_t klen = buf[pos + 12], blen = (Py_ssize_t)le(buf + pos + 13, 4);
        const Py_ssize_t k = pos + overhead, next = k + klen + blen;
        if (next > end)
            goto past_end;
        if (seq > hi)
            break;
        if (seq >= lo && wanted(prefixes, buf + k, klen)) {
            col[n] = (int64_t)seq;
            col[count + n] = (int64_t)le(buf + pos + 4, 8);
            col[2 * count + n] = k;
            col[3 * count + n] = klen;
            col[4 * count + n] = k + klen;
            col[5 * count + n] = blen;
            n++;
        }
        pos = next;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", out, n);
past_end:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    PyErr_Format(PyExc_ValueError, "batch records run past its end at byte %zd: parse it with Batch.parse", pos);
    return NULL;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.wire._column_loops",
    .m_doc = "The per-record walk of gateway.wire.columns, compiled.",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__column_loops(void)
{
    return PyModule_Create(&module);
}
