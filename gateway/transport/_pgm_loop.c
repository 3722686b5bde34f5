/* gateway.transport._pgm_loop: the receive loop of gateway.transport.pgm in a native thread.

Why: OpenPGM advances its timers (NAKs, SPMRs) and drains its socket only while someone calls into it. In a
Python thread that caller needs the GIL between libpgm calls, so a subscriber whose main thread is busy
delays it: at a 1 Gbit/s burst the socket buffer overflowed, OpenPGM reset and ~40% of the records came
from replay (docs/pgm.md, "Cost at full rate"). Here one pthread per socket alone calls libpgm: ppoll(2) on
the socket's descriptors for at most OpenPGM's next timer, pgm_recvmsgv, the APDU reassembly of
gateway/wire/apdu.py (the same rules and table, in C), and whole messages into a bounded queue. It never
takes the GIL per packet: the consumer reads an eventfd (readable while messages wait) and takes messages
one call each. The GIL is taken only after an unrecoverable loss, to have Python open a fresh socket
(PgmReceiver._reopen: every socket option stays in one place, pgm.py).

Threading contract: `ReceiveLoop.start` starts the thread, `close` joins it; between them only the thread
touches the socket and the reassembler; `take`, `counters` and the thread share the queue and the counters
under one mutex, held for a few pointer moves. `Reassembler` is the same C reassembler for Python callers
(tests/unit/test_apdu.py runs the APDU rules on both twins).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <pgm/pgm.h>

#define NO_MESSAGE_START 0xFFFF
#define ZMTP_MORE 0x01
#define MSGV_BATCH 64 /* APDUs per pgm_recvmsgv call */

/* ---- growable byte buffer ---- */

typedef struct {
    unsigned char *p;
    size_t len, cap;
} buf_t;

static int buf_add(buf_t *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

/* ---- whole messages: frames as [u64 size][bytes], oldest first ---- */

typedef struct msg {
    struct msg *next;
    size_t len;
    unsigned char data[];
} msg_t;

typedef struct {
    msg_t *head, *tail;
    size_t count;
} msgq_t;

static void msgq_push(msgq_t *q, msg_t *m)
{
    m->next = NULL;
    if (q->tail)
        q->tail->next = m;
    else
        q->head = m;
    q->tail = m;
    q->count++;
}

static msg_t *msgq_pop(msgq_t *q)
{
    msg_t *m = q->head;
    if (m) {
        q->head = m->next;
        if (!q->head)
            q->tail = NULL;
        q->count--;
    }
    return m;
}

static void msgq_clear(msgq_t *q)
{
    msg_t *m;
    while ((m = msgq_pop(q)))
        free(m);
}

static PyObject *msg_frames(const msg_t *m)
{
    PyObject *frames = PyList_New(0);
    for (size_t pos = 0; frames && pos < m->len;) {
        uint64_t size;
        memcpy(&size, m->data + pos, sizeof size);
        PyObject *frame = PyBytes_FromStringAndSize((const char *)m->data + pos + sizeof size, (Py_ssize_t)size);
        if (!frame || PyList_Append(frames, frame) < 0)
            Py_CLEAR(frames);
        Py_XDECREF(frame);
        pos += sizeof size + size;
    }
    return frames;
}

/* ---- the reassembler (gateway/wire/apdu.py has the rules and the table) ---- */

typedef struct stream {
    struct stream *next;
    unsigned char key[16];
    size_t key_len;
    int joined;
    buf_t data;    /* bytes not yet parsed */
    buf_t frames;  /* the message so far, as in msg_t */
} stream_t;

typedef struct {
    buf_t *subscriptions;
    size_t n_subscriptions;
    uint64_t max_message_bytes;
    uint64_t junk;
    stream_t *streams;
} reasm_t;

static void stream_unjoin(stream_t *s)
{
    s->data.len = s->frames.len = 0;
    s->joined = 0;
}

static void stream_free(stream_t *s)
{
    free(s->data.p);
    free(s->frames.p);
    free(s);
}

static void reasm_lose_all(reasm_t *r)
{
    while (r->streams) {
        stream_t *s = r->streams;
        r->streams = s->next;
        stream_free(s);
    }
}

static void reasm_free(reasm_t *r)
{
    reasm_lose_all(r);
    for (size_t i = 0; i < r->n_subscriptions; i++)
        free(r->subscriptions[i].p);
    free(r->subscriptions);
    r->subscriptions = NULL, r->n_subscriptions = 0;
}

static stream_t *reasm_stream(reasm_t *r, const unsigned char *key, size_t key_len, int create)
{
    if (key_len > sizeof ((stream_t *)0)->key)
        key_len = sizeof ((stream_t *)0)->key;
    for (stream_t *s = r->streams; s; s = s->next)
        if (s->key_len == key_len && !memcmp(s->key, key, key_len))
            return s;
    if (!create)
        return NULL;
    stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    memcpy(s->key, key, key_len);
    s->key_len = key_len;
    s->next = r->streams;
    r->streams = s;
    return s;
}

static int subscribed(const reasm_t *r, const unsigned char *frame, uint64_t size)
{
    for (size_t i = 0; i < r->n_subscriptions; i++)
        if (r->subscriptions[i].len <= size && !memcmp(frame, r->subscriptions[i].p, r->subscriptions[i].len))
            return 1;
    return 0;
}

/* Parse the stream's frames; whole subscribed messages go to `out`. -1 only when out of memory. */
static int reasm_parse(reasm_t *r, stream_t *s, msgq_t *out)
{
    const unsigned char *d = s->data.p;
    size_t pos = 0, end = s->data.len;
    while (end - pos >= 2) {
        uint64_t size;
        unsigned flags;
        size_t head;
        if (d[pos] != 0xFF) {
            size = d[pos], flags = d[pos + 1], head = 2;
        } else {
            if (end - pos < 10)
                break;
            size = 0;
            for (int i = 1; i <= 8; i++)
                size = size << 8 | d[pos + i];
            flags = d[pos + 9], head = 10;
        }
        if (size == 0 || size - 1 > r->max_message_bytes) {
            r->junk++;
            stream_unjoin(s); /* not libzmq's framing: wait for the next message start */
            return 0;
        }
        size -= 1; /* the flags byte */
        if (end - pos < head + size)
            break;
        if (buf_add(&s->frames, &size, sizeof size) < 0 || buf_add(&s->frames, d + pos + head, size) < 0)
            return -1;
        pos += head + size;
        if (!(flags & ZMTP_MORE)) {
            uint64_t first;
            memcpy(&first, s->frames.p, sizeof first);
            if (subscribed(r, s->frames.p + sizeof first, first)) {
                msg_t *m = malloc(sizeof *m + s->frames.len);
                if (!m)
                    return -1;
                m->len = s->frames.len;
                memcpy(m->data, s->frames.p, s->frames.len);
                msgq_push(out, m);
            }
            s->frames.len = 0;
        }
    }
    if (pos) {
        memmove(s->data.p, s->data.p + pos, end - pos);
        s->data.len = end - pos;
    }
    return 0;
}

/* Add one APDU of sender `key`; -1 only when out of memory. */
static int reasm_feed(reasm_t *r, const unsigned char *key, size_t key_len, const unsigned char *apdu, size_t len,
                      msgq_t *out)
{
    stream_t *s = reasm_stream(r, key, key_len, 1);
    if (!s)
        return -1;
    if (len < 2) {
        r->junk++;
        stream_unjoin(s);
        return 0;
    }
    const size_t offset = (size_t)apdu[0] << 8 | apdu[1];
    const unsigned char *body = apdu + 2;
    const size_t body_len = len - 2;
    if (offset == NO_MESSAGE_START) {
        if (!s->joined)
            return 0;
        return buf_add(&s->data, body, body_len) < 0 ? -1 : reasm_parse(r, s, out);
    }
    if (offset > body_len) {
        r->junk++;
        stream_unjoin(s);
        return 0;
    }
    if (s->joined && offset) {
        if (buf_add(&s->data, body, offset) < 0 || reasm_parse(r, s, out) < 0)
            return -1;
    }
    if (s->joined && (s->data.len || s->frames.len))
        r->junk++; /* the message in progress did not end where the next one starts */
    stream_unjoin(s);
    s->joined = 1;
    return buf_add(&s->data, body + offset, body_len - offset) < 0 ? -1 : reasm_parse(r, s, out);
}

static int reasm_init(reasm_t *r, PyObject *subscriptions, unsigned long long max_message_bytes)
{
    memset(r, 0, sizeof *r);
    r->max_message_bytes = max_message_bytes;
    PyObject *seq = PySequence_Fast(subscriptions, "subscriptions must be a sequence of bytes");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    r->subscriptions = calloc(n ? (size_t)n : 1, sizeof *r->subscriptions);
    if (!r->subscriptions) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char *p;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, i), &p, &len) < 0 ||
            buf_add(&r->subscriptions[i], p, (size_t)len) < 0) {
            r->n_subscriptions = (size_t)i + 1;
            reasm_free(r);
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            return -1;
        }
        r->n_subscriptions = (size_t)i + 1;
    }
    Py_DECREF(seq);
    return 0;
}

/* ---- Reassembler: the C reassembler for Python callers ---- */

typedef struct {
    PyObject_HEAD
    reasm_t r;
} ReassemblerObject;

static int Reassembler_init(ReassemblerObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"subscriptions", "max_message_bytes", NULL};
    PyObject *subscriptions = NULL;
    unsigned long long max_message_bytes = 64 * 1024 * 1024;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OK:Reassembler", kwlist, &subscriptions, &max_message_bytes))
        return -1;
    reasm_free(&self->r);
    if (subscriptions)
        return reasm_init(&self->r, subscriptions, max_message_bytes);
    PyObject *all = Py_BuildValue("(y)", "");
    int rc = all ? reasm_init(&self->r, all, max_message_bytes) : -1;
    Py_XDECREF(all);
    return rc;
}

static void Reassembler_dealloc(ReassemblerObject *self)
{
    reasm_free(&self->r);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Reassembler_feed(ReassemblerObject *self, PyObject *args)
{
    Py_buffer key, apdu;
    PyObject *out;
    if (!PyArg_ParseTuple(args, "y*y*O!:feed", &key, &apdu, &PyList_Type, &out))
        return NULL;
    msgq_t done = {0};
    int rc = reasm_feed(&self->r, key.buf, (size_t)key.len, apdu.buf, (size_t)apdu.len, &done);
    PyBuffer_Release(&key);
    PyBuffer_Release(&apdu);
    msg_t *m;
    while (rc == 0 && (m = msgq_pop(&done))) {
        PyObject *frames = msg_frames(m);
        free(m);
        rc = frames && PyList_Append(out, frames) == 0 ? 0 : -1;
        Py_XDECREF(frames);
    }
    msgq_clear(&done);
    if (rc < 0)
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Reassembler_lose(ReassemblerObject *self, PyObject *arg)
{
    Py_buffer key;
    if (!PyArg_Parse(arg, "y*:lose", &key))
        return NULL;
    stream_t *s = reasm_stream(&self->r, key.buf, (size_t)key.len, 0);
    PyBuffer_Release(&key);
    if (s)
        stream_unjoin(s);
    Py_RETURN_NONE;
}

static PyObject *Reassembler_lose_all(ReassemblerObject *self, PyObject *Py_UNUSED(arg))
{
    reasm_lose_all(&self->r);
    Py_RETURN_NONE;
}

static PyObject *Reassembler_get_junk(ReassemblerObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->r.junk);
}

static PyMethodDef Reassembler_methods[] = {
    {"feed", (PyCFunction)Reassembler_feed, METH_VARARGS, "feed(sender, apdu, out): append completed messages."},
    {"lose", (PyCFunction)Reassembler_lose, METH_O, "lose(sender): resume at its next message start."},
    {"lose_all", (PyCFunction)Reassembler_lose_all, METH_NOARGS, "lose_all(): every sender resumes afresh."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Reassembler_getset[] = {
    {"junk", (getter)Reassembler_get_junk, NULL, "APDUs or frames that were not libzmq's framing", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReassemblerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway.transport._pgm_loop.Reassembler",
    .tp_doc = "gateway.wire.apdu.Reassembler in C (the reassembler of ReceiveLoop).",
    .tp_basicsize = sizeof(ReassemblerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reassembler_init,
    .tp_dealloc = (destructor)Reassembler_dealloc,
    .tp_methods = Reassembler_methods,
    .tp_getset = Reassembler_getset,
};

/* ---- ReceiveLoop: the native thread that drives one receiving OpenPGM socket ---- */

enum { C_MESSAGES, C_APDUS, C_REPAIRS, C_RESETS, C_LOST, C_JUNK, C_OVERRUNS, N_COUNTERS };
static const char *const counter_names[N_COUNTERS] = {"messages", "apdus", "repairs", "resets", "lost", "junk",
                                                      "overruns"};

typedef struct {
    PyObject_HEAD
    pgm_sock_t *sock;
    PyObject *reopen; /* () -> address of a fresh socket, after an unrecoverable loss */
    reasm_t r;
    size_t hwm;
    int wake, signal; /* eventfds: wake the thread; readable while messages wait */
    int started, stopping, signalled;
    pthread_t thread;
    pthread_mutex_t lock; /* the queue, `signalled` and the counters */
    msgq_t ready;
    uint64_t counters[N_COUNTERS];
} LoopObject;

static int sock_fd(pgm_sock_t *sock, int name)
{
    int fd = -1;
    socklen_t len = sizeof fd;
    return pgm_getsockopt(sock, IPPROTO_PGM, name, &fd, &len) ? fd : -1;
}

/* Wait for the socket's descriptors or the wake eventfd, at most `timeout_us` (negative: no limit). */
static void loop_wait(LoopObject *self, long long timeout_us)
{
    struct pollfd fds[3] = {
        {.fd = sock_fd(self->sock, PGM_RECV_SOCK), .events = POLLIN},
        {.fd = sock_fd(self->sock, PGM_PENDING_SOCK), .events = POLLIN},
        {.fd = self->wake, .events = POLLIN},
    };
    struct timespec ts = {.tv_sec = timeout_us / 1000000, .tv_nsec = timeout_us % 1000000 * 1000};
    ppoll(fds, 3, timeout_us < 0 ? NULL : &ts, NULL);
    uint64_t drained;
    if (fds[2].revents & POLLIN && read(self->wake, &drained, sizeof drained) < 0) {
        /* nothing to do: another wake raced it (the eventfd is non-blocking) */
    }
}

static long long remain_us(LoopObject *self, int name)
{
    struct timeval tv;
    socklen_t len = sizeof tv;
    if (!pgm_getsockopt(self->sock, IPPROTO_PGM, name, &tv, &len))
        return 1000;
    long long us = (long long)tv.tv_sec * 1000000 + tv.tv_usec;
    return us < 0 ? 0 : us;
}

/* Reassemble the APDUs one pgm_recvmsgv call returned, then hand the messages over in one go. */
static void loop_deliver(LoopObject *self, const struct pgm_msgv_t *msgv, size_t bytes)
{
    msgq_t done = {0};
    buf_t joined = {0};
    uint64_t repairs = 0, apdus = 0;
    for (; bytes > 0; msgv++, apdus++) {
        const unsigned char *apdu;
        size_t len;
        const struct pgm_sk_buff_t *skb = msgv->msgv_skb[0];
        if (msgv->msgv_len == 1) {
            apdu = skb->data, len = skb->len;
        } else { /* an APDU OpenPGM reassembled from fragments (only other senders than libzmq's cut them) */
            joined.len = 0;
            for (uint32_t i = 0; i < msgv->msgv_len; i++)
                if (buf_add(&joined, msgv->msgv_skb[i]->data, msgv->msgv_skb[i]->len) < 0)
                    break;
            apdu = joined.p, len = joined.len;
        }
        for (uint32_t i = 0; i < msgv->msgv_len; i++) {
            repairs += msgv->msgv_skb[i]->pgm_header->pgm_type == PGM_RDATA;
            bytes -= msgv->msgv_skb[i]->len;
        }
        if (reasm_feed(&self->r, (const unsigned char *)&skb->tsi, sizeof skb->tsi, apdu, len, &done) < 0)
            reasm_lose_all(&self->r); /* out of memory: what was in progress is lost, like a reset */
    }
    free(joined.p);
    pthread_mutex_lock(&self->lock);
    self->counters[C_APDUS] += apdus;
    self->counters[C_REPAIRS] += repairs;
    self->counters[C_JUNK] = self->r.junk;
    msg_t *m;
    while ((m = msgq_pop(&done))) {
        if (self->ready.count >= self->hwm) {
            self->counters[C_OVERRUNS]++;
            free(m);
            continue;
        }
        msgq_push(&self->ready, m);
        self->counters[C_MESSAGES]++;
    }
    if (self->ready.count && !self->signalled) {
        const uint64_t one = 1;
        if (write(self->signal, &one, sizeof one) == sizeof one)
            self->signalled = 1;
    }
    pthread_mutex_unlock(&self->lock);
}

/* OpenPGM lost data for good: count it and have Python open a new session (PgmReceiver._reopen says why). */
static int loop_reset(LoopObject *self, struct pgm_sk_buff_t *error_skb)
{
    pthread_mutex_lock(&self->lock);
    self->counters[C_RESETS]++;
    if (error_skb)
        self->counters[C_LOST] += error_skb->sequence; /* this session's lost_count */
    pthread_mutex_unlock(&self->lock);
    if (error_skb)
        pgm_free_skb(error_skb);
    reasm_lose_all(&self->r);
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *fresh = PyObject_CallNoArgs(self->reopen);
    void *sock = fresh ? PyLong_AsVoidPtr(fresh) : NULL;
    Py_XDECREF(fresh);
    if (!sock)
        PyErr_WriteUnraisable(self->reopen); /* the receiver delivers nothing more; its owner sees no messages */
    PyGILState_Release(gil);
    self->sock = sock;
    return sock ? 0 : -1;
}

static void *loop_run(void *arg)
{
    LoopObject *self = arg;
    struct pgm_msgv_t msgv[MSGV_BATCH];
    while (!__atomic_load_n(&self->stopping, __ATOMIC_ACQUIRE)) {
        size_t bytes = 0;
        msgv[0].msgv_skb[0] = NULL; /* a reset puts its error skb here (MSG_ERRQUEUE) */
        const int status = pgm_recvmsgv(self->sock, msgv, MSGV_BATCH, MSG_ERRQUEUE, &bytes, NULL);
        switch (status) {
        case PGM_IO_STATUS_NORMAL:
            loop_deliver(self, msgv, bytes);
            break;
        case PGM_IO_STATUS_RESET:
            if (loop_reset(self, msgv[0].msgv_skb[0]) < 0)
                return NULL;
            break;
        case PGM_IO_STATUS_TIMER_PENDING:
            loop_wait(self, remain_us(self, PGM_TIME_REMAIN));
            break;
        case PGM_IO_STATUS_RATE_LIMITED:
            loop_wait(self, remain_us(self, PGM_RATE_REMAIN));
            break;
        case PGM_IO_STATUS_WOULD_BLOCK:
            loop_wait(self, -1);
            break;
        default: /* not seen in practice; do not spin */
            loop_wait(self, 10000);
        }
    }
    return NULL;
}

static int Loop_init(LoopObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sock", "reopen", "subscriptions", "hwm", "max_message_bytes", NULL};
    PyObject *sock, *reopen, *subscriptions;
    Py_ssize_t hwm;
    unsigned long long max_message_bytes;
    if (self->sock) {
        PyErr_SetString(PyExc_RuntimeError, "ReceiveLoop is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOnK:ReceiveLoop", kwlist, &sock, &reopen, &subscriptions, &hwm,
                                     &max_message_bytes))
        return -1;
    self->sock = PyLong_AsVoidPtr(sock);
    if (!self->sock || hwm < 0 || !PyCallable_Check(reopen)) {
        self->sock = NULL;
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "ReceiveLoop needs a socket address, a callable reopen and hwm >= 0");
        return -1;
    }
    if (reasm_init(&self->r, subscriptions, max_message_bytes) < 0)
        return -1;
    Py_INCREF(reopen);
    self->reopen = reopen;
    self->hwm = (size_t)hwm;
    self->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    self->signal = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->wake < 0 || self->signal < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&self->lock, NULL);
    return 0;
}

static PyObject *Loop_start(LoopObject *self, PyObject *Py_UNUSED(arg))
{
    if (!self->reopen || self->started || self->wake < 0) {
        PyErr_SetString(PyExc_RuntimeError, "ReceiveLoop: start once, after init");
        return NULL;
    }
    int rc = pthread_create(&self->thread, NULL, loop_run, self);
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->started = 1;
    Py_RETURN_NONE;
}

static void loop_join(LoopObject *self)
{
    if (!self->started)
        return;
    __atomic_store_n(&self->stopping, 1, __ATOMIC_RELEASE);
    const uint64_t one = 1;
    if (write(self->wake, &one, sizeof one) < 0) {
        /* the eventfd is full (2^64 - 2 wakes): the thread is awake anyway */
    }
    Py_BEGIN_ALLOW_THREADS /* a reset in progress calls back into Python */
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->started = 0;
}

static void loop_close(LoopObject *self)
{
    loop_join(self);
    if (self->wake > 0)
        close(self->wake);
    if (self->signal > 0)
        close(self->signal);
    self->wake = self->signal = -1;
}

static PyObject *Loop_close(LoopObject *self, PyObject *Py_UNUSED(arg))
{
    loop_close(self);
    Py_RETURN_NONE;
}

static PyObject *Loop_take(LoopObject *self, PyObject *Py_UNUSED(arg))
{
    pthread_mutex_lock(&self->lock);
    msg_t *m = msgq_pop(&self->ready);
    if (!self->ready.count && self->signalled) {
        uint64_t drained;
        if (read(self->signal, &drained, sizeof drained) == sizeof drained)
            self->signalled = 0;
    }
    pthread_mutex_unlock(&self->lock);
    if (!m)
        Py_RETURN_NONE;
    PyObject *frames = msg_frames(m);
    free(m);
    return frames;
}

static PyObject *Loop_ready(LoopObject *self, PyObject *Py_UNUSED(arg))
{
    pthread_mutex_lock(&self->lock);
    const size_t n = self->ready.count;
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromSize_t(n);
}

static PyObject *Loop_counters(LoopObject *self, PyObject *Py_UNUSED(arg))
{
    uint64_t c[N_COUNTERS];
    pthread_mutex_lock(&self->lock);
    memcpy(c, self->counters, sizeof c);
    pthread_mutex_unlock(&self->lock);
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < N_COUNTERS; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(c[i]);
        if (!v || PyDict_SetItemString(d, counter_names[i], v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

static PyObject *Loop_fileno(LoopObject *self, PyObject *Py_UNUSED(arg))
{
    return PyLong_FromLong(self->signal);
}

static void Loop_dealloc(LoopObject *self)
{
    loop_close(self);
    if (self->reopen) {
        msgq_clear(&self->ready);
        reasm_free(&self->r);
        pthread_mutex_destroy(&self->lock);
        Py_CLEAR(self->reopen);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Loop_methods[] = {
    {"start", (PyCFunction)Loop_start, METH_NOARGS, "start(): start the thread."},
    {"close", (PyCFunction)Loop_close, METH_NOARGS, "close(): stop the thread, wait for it, close the eventfds."},
    {"take", (PyCFunction)Loop_take, METH_NOARGS, "take() -> list[bytes] | None: the oldest whole message."},
    {"ready", (PyCFunction)Loop_ready, METH_NOARGS, "ready() -> int: messages waiting."},
    {"counters", (PyCFunction)Loop_counters, METH_NOARGS, "counters() -> dict: ReceiverStats' fields."},
    {"fileno", (PyCFunction)Loop_fileno, METH_NOARGS, "fileno() -> int: an eventfd, readable while messages wait."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LoopType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway.transport._pgm_loop.ReceiveLoop",
    .tp_doc = "ReceiveLoop(sock, reopen, subscriptions, hwm, max_message_bytes): one socket's native receive thread.",
    .tp_basicsize = sizeof(LoopObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Loop_init,
    .tp_dealloc = (destructor)Loop_dealloc,
    .tp_methods = Loop_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gateway.transport._pgm_loop",
    "The receive loop of gateway.transport.pgm in a native thread (see _pgm_loop.c).", -1, NULL, NULL, NULL, NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__pgm_loop(void)
{
    if (PyType_Ready(&ReassemblerType) < 0 || PyType_Ready(&LoopType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&ReassemblerType);
    Py_INCREF(&LoopType);
    if (PyModule_AddObject(m, "Reassembler", (PyObject *)&ReassemblerType) < 0 ||
        PyModule_AddObject(m, "ReceiveLoop", (PyObject *)&LoopType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
