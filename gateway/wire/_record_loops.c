/* gateway.wire._record_loops: the per-record loops of gateway.wire.batch, compiled.

gateway/wire/record_loops.py holds the same five functions in Python, says what each does and why, and picks
this module when it was built. Both give the same results and the same error messages
(tests/test_record_loops.py checks it on generated and corrupted batches). Everything here works on one
batch at a time and holds no state; integers in a batch are little-endian.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define RECORD_SIZE 17 /* delta u32, ts_ns u64, key_len u8, body_len u32 */
#define TTL_SIZE 4     /* ttl_ms u32 after them, in batches with FLAG_TTL */

static inline uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t get64(const unsigned char *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static inline void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}

static inline void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)v), put32(p + 4, (uint32_t)(v >> 32));
}

PyDoc_STRVAR(check_doc, "check(buf, count, span, overhead, start) -> str | None: the first structural fault, or None.");

static PyObject *check(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count, overhead, start;
    unsigned long long span;
    if (!PyArg_ParseTuple(args, "y*nKnn:check", &view, &count, &span, &overhead, &start))
        return NULL;
    if (overhead < RECORD_SIZE || start < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "check(): overhead below the record header size, or a negative start");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    const uint64_t end = (uint64_t)view.len;
    uint64_t pos = (uint64_t)start;
    int64_t prev = -1;
    PyObject *fault = Py_None;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos + (uint64_t)overhead > end) {
            fault = PyUnicode_FromFormat("record %zd: header runs past the batch end at byte %llu", i,
                                         (unsigned long long)pos);
            goto done;
        }
        const uint32_t delta = get32(buf + pos);
        if ((int64_t)delta <= prev || delta > span) {
            fault = PyUnicode_FromFormat("record %zd: sequence delta %u out of order or outside coverage", i,
                                         (unsigned int)delta);
            goto done;
        }
        prev = delta;
        pos += (uint64_t)overhead + buf[pos + 12] + get32(buf + pos + 13);
    }
    if (pos != end)
        fault = PyUnicode_FromFormat("records end at byte %llu but the batch is %llu bytes", (unsigned long long)pos,
                                     (unsigned long long)end);
done:
    PyBuffer_Release(&view);
    if (fault == Py_None)
        Py_RETURN_NONE;
    return fault; /* NULL if formatting failed: its exception propagates */
}

PyDoc_STRVAR(entries_doc,
             "entries(buf, first, count, overhead, start, lo, hi, with_ttl) -> list of (seq, ts_ns, key, body[, "
             "ttl_ms]), key and body views into the memoryview buf.");

static PyObject *entries(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *mv;
    unsigned long long first, lo, hi;
    Py_ssize_t count, overhead, start;
    int with_ttl;
    if (!PyArg_ParseTuple(args, "O!KnnnKKp:entries", &PyMemoryView_Type, &mv, &first, &count, &overhead, &start,
                          &lo, &hi, &with_ttl))
        return NULL;
    const Py_buffer *view = PyMemoryView_GET_BUFFER(mv);
    if (view->ndim != 1 || view->itemsize != 1 || !PyBuffer_IsContiguous(view, 'C')) {
        PyErr_SetString(PyExc_TypeError, "entries() needs a contiguous memoryview of bytes");
        return NULL;
    }
    if (overhead < RECORD_SIZE || start < 0) {
        PyErr_SetString(PyExc_ValueError, "entries(): overhead below the record header size, or a negative start");
        return NULL;
    }
    const unsigned char *buf = view->buf;
    const Py_ssize_t end = view->len;
    const int has_ttl = overhead >= RECORD_SIZE + TTL_SIZE;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t pos = start;
    for (Py_ssize_t i = 0; i < count; i++) {
        /* Batch.parse has checked every bound; checked again here, as memory safety must not rest on a caller. */
        if (pos + overhead > end)
            goto past_end;
        const uint64_t seq = first + get32(buf + pos);
        const Py_ssize_t k = pos + overhead, b = k + buf[pos + 12];
        const Py_ssize_t next = b + (Py_ssize_t)get32(buf + pos + 13);
        if (next > end)
            goto past_end;
        if (seq > hi)
            break;
        if (seq >= lo) {
            PyObject *item = PyTuple_New(with_ttl ? 5 : 4);
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                goto fail;
            }
            Py_DECREF(item); /* the list holds it; the fields below fill it in place */
            PyObject *field;
            if ((field = PyLong_FromUnsignedLongLong(seq)) == NULL)
                goto fail;
            PyTuple_SET_ITEM(item, 0, field);
            if ((field = PyLong_FromUnsignedLongLong(get64(buf + pos + 4))) == NULL)
                goto fail;
            PyTuple_SET_ITEM(item, 1, field);
            if ((field = PySequence_GetSlice(mv, k, b)) == NULL)
                goto fail;
            PyTuple_SET_ITEM(item, 2, field);
            if ((field = PySequence_GetSlice(mv, b, next)) == NULL)
                goto fail;
            PyTuple_SET_ITEM(item, 3, field);
            if (with_ttl) {
                if ((field = PyLong_FromUnsignedLong(has_ttl ? get32(buf + pos + RECORD_SIZE) : 0)) == NULL)
                    goto fail;
                PyTuple_SET_ITEM(item, 4, field);
            }
        }
        pos = next;
    }
    return out;
past_end:
    PyErr_Format(PyExc_ValueError, "batch records run past its end at byte %zd: parse it with Batch.parse", pos);
fail:
    Py_DECREF(out);
    return NULL;
}

/* One record's fields, checked: what pack() needs from each (ts_ns, key, body[, ttl_ms]) item. */
typedef struct {
    PyObject *item; /* a tuple or list: PySequence_Fast of the record */
    uint64_t ts;
    uint32_t ttl;
    Py_buffer key, body;
} Fields;

static int get_fields(PyObject *record, Py_ssize_t i, int ttl, Py_ssize_t max_batch, Fields *f)
{
    f->item = PySequence_Fast(record, "a record must be a tuple (ts_ns, key, body[, ttl_ms])");
    if (f->item == NULL)
        return -1;
    f->key.obj = f->body.obj = NULL;
    if (PySequence_Fast_GET_SIZE(f->item) < (ttl ? 4 : 3)) {
        PyErr_Format(PyExc_TypeError, "record %zd: expected (ts_ns, key, body%s)", i, ttl ? ", ttl_ms" : "");
        goto fail;
    }
    PyObject **items = PySequence_Fast_ITEMS(f->item);
    f->ts = PyLong_AsUnsignedLongLong(items[0]);
    if (f->ts == (uint64_t)-1 && PyErr_Occurred())
        goto fail;
    if (PyObject_GetBuffer(items[1], &f->key, PyBUF_SIMPLE) < 0)
        goto fail;
    if (PyObject_GetBuffer(items[2], &f->body, PyBUF_SIMPLE) < 0)
        goto fail;
    if (f->key.len > 255) {
        PyErr_Format(PyExc_ValueError, "record %zd: key is %zd bytes, the limit is 255", i, f->key.len);
        goto fail;
    }
    if (f->body.len > max_batch) {
        PyErr_Format(PyExc_ValueError, "record %zd: body is %zd bytes, a batch holds at most %zd", i, f->body.len,
                     max_batch);
        goto fail;
    }
    f->ttl = 0;
    if (ttl) {
        int overflow;
        const long long v = PyLong_AsLongLongAndOverflow(items[3], &overflow);
        if (v == -1 && PyErr_Occurred())
            goto fail;
        if (overflow || v < 0 || v > 0xFFFFFFFFLL) {
            PyErr_Format(PyExc_ValueError, "record %zd: ttl_ms %S outside 0..4294967295", i, items[3]);
            goto fail;
        }
        f->ttl = (uint32_t)v;
    }
    return 0;
fail:
    if (f->key.obj)
        PyBuffer_Release(&f->key);
    if (f->body.obj)
        PyBuffer_Release(&f->body);
    Py_DECREF(f->item);
    return -1;
}

static void release_fields(Fields *f)
{
    PyBuffer_Release(&f->key);
    PyBuffer_Release(&f->body);
    Py_DECREF(f->item);
}

PyDoc_STRVAR(pack_doc,
             "pack(records, ttl, reserve, max_batch) -> (bytearray, count): records laid out after `reserve` "
             "zero bytes, deltas 0, 1, ...");

static PyObject *pack(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *records;
    int ttl;
    Py_ssize_t reserve, max_batch;
    if (!PyArg_ParseTuple(args, "Opnn:pack", &records, &ttl, &reserve, &max_batch))
        return NULL;
    PyObject *seq = PySequence_Fast(records, "records must be iterable");
    if (seq == NULL)
        return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const Py_ssize_t overhead = RECORD_SIZE + (ttl ? TTL_SIZE : 0);
    PyObject *out = NULL;
    Fields f;
    /* Pass 1 checks every record and sizes the batch; pass 2 fills it, so a bad record costs no copy. */
    Py_ssize_t total = reserve;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (get_fields(PySequence_Fast_GET_ITEM(seq, i), i, ttl, max_batch, &f) < 0)
            goto done;
        total += overhead + f.key.len + f.body.len;
        release_fields(&f);
        if (total > max_batch) {
            PyErr_Format(PyExc_ValueError, "batch of %zd bytes is over the limit of %zd", total, max_batch);
            goto done;
        }
    }
    out = PyByteArray_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(out);
    memset(dst, 0, (size_t)reserve);
    dst += reserve;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (get_fields(PySequence_Fast_GET_ITEM(seq, i), i, ttl, max_batch, &f) < 0) {
            Py_CLEAR(out); /* a record changed between the passes (another thread): refuse it like pass 1 */
            goto done;
        }
        if (dst + overhead + f.key.len + f.body.len > (unsigned char *)PyByteArray_AS_STRING(out) + total) {
            release_fields(&f);
            Py_CLEAR(out);
            PyErr_SetString(PyExc_RuntimeError, "records changed size while being packed");
            goto done;
        }
        put32(dst, (uint32_t)i);
        put64(dst + 4, f.ts);
        dst[12] = (unsigned char)f.key.len;
        put32(dst + 13, (uint32_t)f.body.len);
        if (ttl)
            put32(dst + RECORD_SIZE, f.ttl);
        dst += overhead;
        memcpy(dst, f.key.buf, (size_t)f.key.len);
        dst += f.key.len;
        memcpy(dst, f.body.buf, (size_t)f.body.len);
        dst += f.body.len;
        release_fields(&f);
    }
    if (dst != (unsigned char *)PyByteArray_AS_STRING(out) + total) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_RuntimeError, "records changed size while being packed");
    }
done:
    Py_DECREF(seq);
    if (out == NULL)
        return NULL;
    return Py_BuildValue("(Nn)", out, n);
}

PyDoc_STRVAR(take_doc,
             "take(queue, max_records, max_payload) -> (records, payload, ttl): (ts_ns, key, body, ttl_ms) tuples "
             "popped from the left of a deque, at most max_records of them and max_payload bytes of keys and bodies "
             "(but at least one); payload is their keys' and bodies' bytes, ttl whether one has a TTL.");

static PyObject *take(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *queue;
    Py_ssize_t max_records, max_payload;
    if (!PyArg_ParseTuple(args, "Onn:take", &queue, &max_records, &max_payload))
        return NULL;
    PyObject *popleft = PyObject_GetAttrString(queue, "popleft");
    if (popleft == NULL)
        return NULL;
    PyObject *out = PyList_New(0), *rec = NULL;
    Py_ssize_t payload = 0;
    int ttl = 0;
    if (out == NULL)
        goto fail;
    while (PyList_GET_SIZE(out) < max_records) {
        const Py_ssize_t left = PyObject_Length(queue);
        if (left < 0)
            goto fail;
        if (left == 0)
            break;
        rec = PyObject_CallNoArgs(popleft);
        if (rec == NULL)
            goto fail;
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 4 || !PyBytes_Check(PyTuple_GET_ITEM(rec, 1)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(rec, 2))) {
            PyErr_Format(PyExc_TypeError, "queued record %R is not (ts_ns, key bytes, body bytes, ttl_ms)", rec);
            goto fail;
        }
        const Py_ssize_t size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(rec, 1)) + PyBytes_GET_SIZE(PyTuple_GET_ITEM(rec, 2));
        if (PyList_GET_SIZE(out) > 0 && payload + size > max_payload)
            break; /* rec goes back to the front below */
        const int has_ttl = PyObject_IsTrue(PyTuple_GET_ITEM(rec, 3));
        if (has_ttl < 0 || PyList_Append(out, rec) < 0)
            goto fail;
        Py_CLEAR(rec);
        payload += size;
        ttl |= has_ttl;
    }
    if (rec != NULL) {
        PyObject *r = PyObject_CallMethod(queue, "appendleft", "(O)", rec);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
        Py_CLEAR(rec);
    }
    Py_DECREF(popleft);
    return Py_BuildValue("(NnO)", out, payload, ttl ? Py_True : Py_False);
fail:;
    /* Put back what was popped, in order, so an error loses no record. */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (rec != NULL) {
        PyObject *r = PyObject_CallMethod(queue, "appendleft", "(O)", rec);
        Py_XDECREF(r);
        Py_DECREF(rec);
    }
    for (Py_ssize_t i = out ? PyList_GET_SIZE(out) - 1 : -1; i >= 0; i--) {
        PyObject *r = PyObject_CallMethod(queue, "appendleft", "(O)", PyList_GET_ITEM(out, i));
        Py_XDECREF(r);
    }
    PyErr_Restore(type, value, traceback);
    Py_XDECREF(out);
    Py_DECREF(popleft);
    return NULL;
}

PyDoc_STRVAR(cut_doc,
             "cut(buf, count, overhead, start, max_bytes, reserve) -> list of (records, bytearray): the records as "
             "consecutive parts of at most max_bytes, each after reserve zero bytes, deltas from 0.");

/* One part: `reserve` zero bytes, then the records of buf[from:to] with their deltas rewritten 0, 1, ... */
static PyObject *cut_part(const unsigned char *buf, uint64_t from, uint64_t to, Py_ssize_t n, Py_ssize_t overhead,
                          Py_ssize_t reserve)
{
    PyObject *out = PyByteArray_FromStringAndSize(NULL, reserve + (Py_ssize_t)(to - from));
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(out);
    memset(p, 0, (size_t)reserve);
    memcpy(p + reserve, buf + from, (size_t)(to - from));
    unsigned char *rec = p + reserve;
    for (Py_ssize_t i = 0; i < n; i++) {
        put32(rec, (uint32_t)i);
        rec += overhead + rec[12] + get32(rec + 13);
    }
    return Py_BuildValue("(nN)", n, out);
}

static PyObject *cut(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count, overhead, start, max_bytes, reserve;
    if (!PyArg_ParseTuple(args, "y*nnnnn:cut", &view, &count, &overhead, &start, &max_bytes, &reserve))
        return NULL;
    PyObject *parts = NULL;
    if (overhead < RECORD_SIZE || start < 0 || reserve < 0) {
        PyErr_SetString(PyExc_ValueError, "cut(): overhead below the record header size, or a negative start");
        goto done;
    }
    if ((parts = PyList_New(0)) == NULL)
        goto done;
    const unsigned char *buf = view.buf;
    const uint64_t end = (uint64_t)view.len;
    uint64_t pos = (uint64_t)start, from = pos, size = (uint64_t)reserve;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos + (uint64_t)overhead > end) {
            PyErr_Format(PyExc_ValueError, "record %zd: header runs past the batch end at byte %llu", i,
                         (unsigned long long)pos);
            goto fail;
        }
        const uint64_t len = (uint64_t)overhead + buf[pos + 12] + get32(buf + pos + 13);
        if (pos + len > end) {
            PyErr_Format(PyExc_ValueError, "record %zd: runs past the batch end at byte %llu", i,
                         (unsigned long long)pos);
            goto fail;
        }
        if (n > 0 && size + len > (uint64_t)max_bytes) {
            PyObject *part = cut_part(buf, from, pos, n, overhead, reserve);
            if (part == NULL || PyList_Append(parts, part) < 0) {
                Py_XDECREF(part);
                goto fail;
            }
            Py_DECREF(part);
            from = pos, size = (uint64_t)reserve, n = 0;
        }
        size += len, pos += len, n++;
    }
    if (n > 0) {
        PyObject *part = cut_part(buf, from, pos, n, overhead, reserve);
        if (part == NULL || PyList_Append(parts, part) < 0) {
            Py_XDECREF(part);
            goto fail;
        }
        Py_DECREF(part);
    }
    goto done;
fail:
    Py_CLEAR(parts);
done:
    PyBuffer_Release(&view);
    return parts;
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, check_doc},
    {"entries", entries, METH_VARARGS, entries_doc},
    {"pack", pack, METH_VARARGS, pack_doc},
    {"take", take, METH_VARARGS, take_doc},
    {"cut", cut, METH_VARARGS, cut_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.wire._record_loops",
    .m_doc = "The per-record loops of gateway.wire.batch, compiled.",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__record_loops(void)
{
    return PyModule_Create(&module);
}
