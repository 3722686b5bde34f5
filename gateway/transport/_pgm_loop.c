/* gateway.transport._pgm_loop: the I/O loops of gateway.transport.pgm in native threads.

Why: OpenPGM advances its timers (NAKs, SPMs, repairs) and drains its sockets only while someone calls into
them. In a Python thread that caller needs the GIL between libpgm calls, so a busy interpreter delays it: at a
1 Gbit/s burst the subscriber's socket buffer overflowed, OpenPGM reset and ~40% of the records came from
replay (docs/pgm.md, "Cost at full rate"). Here one pthread per socket alone calls libpgm and never takes
the GIL per packet.

- ReceiveLoop: ppoll(2) on the socket's descriptors for at most OpenPGM's next timer, pgm_recvmsgv, the APDU
  reassembly of gateway/wire/apdu.py (the same rules and table, in C), and whole messages into a bounded
  queue, handed over once per pgm_recvmsgv batch. The consumer reads an eventfd (readable while messages
  wait) and takes messages one call each. The GIL is taken only after an unrecoverable loss, to have Python
  open a fresh socket (PgmReceiver._reopen: every socket option stays in one place, pgm.py).
- SendLoop: Python queues each message as its frames; `send` cuts them into APDUs (gateway.wire.apdu's
  packetise, in C: one copy of the bytes, no Python object per packet) and waits (GIL released) for room; the
  thread sends them at OpenPGM's rate, answers NAKs and keeps the SPM heartbeats.

Threading contract: between a loop's start and `close` only its thread touches the socket (and the
reassembler); the Python side and the thread share the queue and the counters under one mutex, held for a
few pointer moves. `Reassembler` is the C reassembler for Python callers (tests/unit/test_apdu.py runs the
APDU rules on both twins and checks that they agree; `packetise` is the send side's twin, checked the same way).
*/
#define _GNU_SOURCE /* pthread_setname_np, pthread_timedjoin_np, ppoll */
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
    unsigned char data[] __attribute__((aligned(16)));
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
    if ((size_t)key.len > sizeof ((stream_t *)0)->key) { /* a PGM sender is its 8-byte TSI */
        PyBuffer_Release(&key);
        PyBuffer_Release(&apdu);
        PyErr_SetString(PyExc_ValueError, "feed(): a sender is named by at most 16 bytes");
        return NULL;
    }
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
    pthread_setname_np(pthread_self(), "pgm-recv");
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


/* ---- Packetising: gateway.wire.apdu.packetise in C (one copy of each frame, no Python object per APDU) ---- */

typedef struct {
    Py_buffer *views; /* the message's frames */
    Py_ssize_t n;
    size_t total; /* bytes of their ZMTP/1 encoding */
} v1msg_t;

/* The ZMTP/1 header of a frame of `size` bytes (libzmq's v1 encoder: gateway.wire.framing.encode_v1). */
static size_t v1_head(uint64_t size, int more, unsigned char *h)
{
    size += 1; /* the flags byte */
    if (size < 255) {
        h[0] = (unsigned char)size, h[1] = (unsigned char)more;
        return 2;
    }
    h[0] = 0xFF;
    for (int i = 0; i < 8; i++)
        h[1 + i] = (unsigned char)(size >> (56 - 8 * i));
    h[9] = (unsigned char)more;
    return 10;
}

static void v1msg_close(v1msg_t *m)
{
    for (Py_ssize_t i = 0; i < m->n; i++)
        PyBuffer_Release(&m->views[i]);
    PyMem_Free(m->views);
    m->views = NULL, m->n = 0;
}

/* Hold the buffers of `frames` (a non-empty sequence of bytes-like objects); -1 with an exception set. */
static int v1msg_open(v1msg_t *m, PyObject *frames)
{
    m->views = NULL, m->n = 0, m->total = 0;
    PyObject *seq = PySequence_Fast(frames, "packetise(): frames are a sequence of bytes-like objects");
    if (!seq)
        return -1;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n == 0) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "packetise(): a message has at least one frame");
        return -1;
    }
    m->views = PyMem_Calloc((size_t)n, sizeof *m->views);
    if (!m->views) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    unsigned char head[10];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &m->views[i], PyBUF_SIMPLE) < 0) {
            Py_DECREF(seq);
            v1msg_close(m);
            return -1;
        }
        m->n = i + 1;
        m->total += v1_head((uint64_t)m->views[i].len, 0, head) + (size_t)m->views[i].len;
    }
    Py_DECREF(seq);
    return 0;
}

/* APDUs of at most `chunk` bytes of the encoding each, after their 2-byte offset; the last one's size. */
static size_t apdu_count(const v1msg_t *m, size_t chunk)
{
    return (m->total + chunk - 1) / chunk;
}

static size_t apdu_size(const v1msg_t *m, size_t chunk, size_t k)
{
    return 2 + (k + 1 < apdu_count(m, chunk) ? chunk : m->total - k * chunk);
}

/* A message being cut: `into` is where its APDUs go (a list for packetise, a queued msg_t for SendLoop.send). */
typedef struct {
    const v1msg_t *m;
    size_t chunk;
    void *into;
} cut_t;

/* Copy the message's encoding into its APDUs: the first with offset 0 (a message starts there), the others
   NO_MESSAGE_START. `at(cut, k)` gives where APDU k goes (apdu_size bytes), NULL if it cannot (-1 then). */
static int v1msg_cut(const cut_t *cut, unsigned char *(*at)(const cut_t *, size_t))
{
    const v1msg_t *m = cut->m;
    const size_t chunk = cut->chunk;
    size_t k = 0, room = 0;
    unsigned char *out = NULL, head[10];
    for (Py_ssize_t i = 0; i < m->n; i++) {
        const size_t head_len = v1_head((uint64_t)m->views[i].len, i + 1 < m->n ? ZMTP_MORE : 0, head);
        const unsigned char *parts[2] = {head, m->views[i].buf};
        size_t lens[2] = {head_len, (size_t)m->views[i].len};
        for (int p = 0; p < 2; p++) {
            const unsigned char *src = parts[p];
            while (lens[p]) {
                if (!room) {
                    if (!(out = at(cut, k)))
                        return -1;
                    const unsigned offset = k ? NO_MESSAGE_START : 0;
                    out[0] = (unsigned char)(offset >> 8), out[1] = (unsigned char)offset;
                    out += 2, room = chunk, k++;
                }
                const size_t n = lens[p] < room ? lens[p] : room;
                memcpy(out, src, n);
                out += n, src += n, lens[p] -= n, room -= n;
            }
        }
    }
    return 0;
}

static int chunk_of(Py_ssize_t mss, size_t *chunk)
{
    if (mss <= 2) {
        PyErr_SetString(PyExc_ValueError, "packetise(): mss must leave room after the 2-byte offset");
        return -1;
    }
    *chunk = (size_t)mss - 2;
    return 0;
}

static unsigned char *apdu_in_list(const cut_t *cut, size_t k)
{
    PyObject *apdu = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)apdu_size(cut->m, cut->chunk, k));
    if (!apdu)
        return NULL;
    PyList_SET_ITEM((PyObject *)cut->into, (Py_ssize_t)k, apdu);
    return (unsigned char *)PyBytes_AS_STRING(apdu);
}

PyDoc_STRVAR(packetise_doc, "packetise(frames, mss) -> list[bytes]: gateway.wire.apdu.packetise in C, the APDUs "
                            "SendLoop.send queues (tests/unit/test_apdu.py checks that the two agree).");

static PyObject *packetise(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *frames;
    Py_ssize_t mss;
    size_t chunk;
    v1msg_t m;
    if (!PyArg_ParseTuple(args, "On:packetise", &frames, &mss) || chunk_of(mss, &chunk) < 0 ||
        v1msg_open(&m, frames) < 0)
        return NULL;
    PyObject *list = PyList_New((Py_ssize_t)apdu_count(&m, chunk));
    const cut_t cut = {&m, chunk, list};
    if (list && v1msg_cut(&cut, apdu_in_list) < 0)
        Py_CLEAR(list);
    v1msg_close(&m);
    return list;
}

/* ---- SendLoop: the native thread that drives one sending OpenPGM socket ---- */

enum { S_MESSAGES, S_APDUS, S_RATE_LIMITED, S_DROPPED, N_SEND_COUNTERS };
static const char *const send_counter_names[N_SEND_COUNTERS] = {"messages", "apdus", "rate_limited", "dropped"};

typedef struct {
    PyObject_HEAD
    pgm_sock_t *sock;
    size_t hwm;
    int wake;
    int started, stopping;
    pthread_t thread;
    pthread_mutex_t lock; /* the queue, `stopping` and the counters */
    pthread_cond_t room;  /* signalled when a message has left the queue */
    msgq_t queue;         /* messages as APDUs: each [u64 size][u64 unused][bytes], padded to 16 bytes */
    size_t sent;          /* bytes of the oldest message already sent (only the thread touches it) */
    uint64_t counters[N_SEND_COUNTERS]; /* apdus and rate_limited: written by the thread alone, unlocked */
} SendLoopObject;

static void send_wait(SendLoopObject *self, long long timeout_us, int writable)
{
    struct pollfd fds[4];
    nfds_t n = 0;
    if (writable) { /* OpenPGM's send socket is full: wait for room, but keep the timers going */
        fds[n++] = (struct pollfd){.fd = sock_fd(self->sock, PGM_SEND_SOCK), .events = POLLOUT};
        if (timeout_us < 0 || timeout_us > 1000)
            timeout_us = 1000;
    } else {
        fds[n++] = (struct pollfd){.fd = sock_fd(self->sock, PGM_RECV_SOCK), .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = sock_fd(self->sock, PGM_REPAIR_SOCK), .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = sock_fd(self->sock, PGM_PENDING_SOCK), .events = POLLIN};
    }
    fds[n++] = (struct pollfd){.fd = self->wake, .events = POLLIN};
    struct timespec ts = {.tv_sec = timeout_us / 1000000, .tv_nsec = timeout_us % 1000000 * 1000};
    ppoll(fds, n, timeout_us < 0 ? NULL : &ts, NULL);
    uint64_t drained;
    if (fds[n - 1].revents & POLLIN && read(self->wake, &drained, sizeof drained) < 0) {
        /* nothing to do: another wake raced it (the eventfd is non-blocking) */
    }
}

static long long send_remain_us(SendLoopObject *self, int name)
{
    struct timeval tv;
    socklen_t len = sizeof tv;
    if (!pgm_getsockopt(self->sock, IPPROTO_PGM, name, &tv, &len))
        return 1000;
    long long us = (long long)tv.tv_sec * 1000000 + tv.tv_usec;
    return us < 0 ? 0 : us;
}

/* OpenPGM's checksum-and-copy (pgm_compat_csum_partial_copy) stores to its packet buffer with aligned SSE
   moves at the source's 16-byte alignment: a source that is not 16-byte aligned crashes it (seen). So every
   queued APDU starts 16-byte aligned, behind a 16-byte header. */
#define APDU_HEAD 16

static size_t apdu_span(size_t size)
{
    return APDU_HEAD + ((size + 15) & ~(size_t)15);
}

static void send_done(SendLoopObject *self, int counter)
{
    pthread_mutex_lock(&self->lock);
    free(msgq_pop(&self->queue));
    self->counters[counter]++;
    pthread_cond_broadcast(&self->room);
    pthread_mutex_unlock(&self->lock);
    self->sent = 0;
}

static void *send_run(void *arg)
{
    SendLoopObject *self = arg;
    pthread_setname_np(pthread_self(), "pgm-send");
    struct pgm_msgv_t dummy;
    for (;;) {
        size_t bytes;
        /* NAKs, SPMRs and the repairs they ask for; SPM timers */
        int status = pgm_recvmsgv(self->sock, &dummy, 1, 0, &bytes, NULL);
        long long rate_wait = status == PGM_IO_STATUS_RATE_LIMITED ? send_remain_us(self, PGM_RATE_REMAIN) : -1;
        int blocked = 0;
        for (;;) {
            pthread_mutex_lock(&self->lock);
            const msg_t *m = self->queue.head; /* only this thread removes messages: m stays valid */
            pthread_mutex_unlock(&self->lock);
            if (!m)
                break;
            uint64_t size;
            memcpy(&size, m->data + self->sent, sizeof size);
            status = pgm_send(self->sock, m->data + self->sent + APDU_HEAD, size, &bytes);
            if (status == PGM_IO_STATUS_NORMAL) {
                self->counters[S_APDUS]++;
                self->sent += apdu_span(size);
                if (self->sent == m->len)
                    send_done(self, S_MESSAGES);
                continue;
            }
            if (status == PGM_IO_STATUS_RATE_LIMITED) {
                self->counters[S_RATE_LIMITED]++;
                rate_wait = send_remain_us(self, PGM_RATE_REMAIN);
            } else if (status == PGM_IO_STATUS_WOULD_BLOCK) {
                blocked = 1;
            } else {
                send_done(self, S_DROPPED); /* not seen in practice: counted, and the rest goes on */
                continue;
            }
            break;
        }
        pthread_mutex_lock(&self->lock);
        const int done = self->stopping && !self->queue.head;
        pthread_mutex_unlock(&self->lock);
        if (done)
            return NULL;
        long long timeout = send_remain_us(self, PGM_TIME_REMAIN); /* sending re-arms the heartbeat SPMs */
        if (rate_wait >= 0 && rate_wait < timeout)
            timeout = rate_wait;
        send_wait(self, timeout, blocked);
    }
}

static int SendLoop_init(SendLoopObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sock", "hwm", NULL};
    PyObject *sock;
    Py_ssize_t hwm;
    if (self->sock) {
        PyErr_SetString(PyExc_RuntimeError, "SendLoop is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On:SendLoop", kwlist, &sock, &hwm))
        return -1;
    self->sock = PyLong_AsVoidPtr(sock);
    if (!self->sock || hwm < 1) {
        self->sock = NULL;
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "SendLoop needs a socket address and hwm >= 1");
        return -1;
    }
    self->hwm = (size_t)hwm;
    self->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->wake < 0) {
        self->sock = NULL;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&self->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&self->room, &attr);
    pthread_condattr_destroy(&attr);
    int rc = pthread_create(&self->thread, NULL, send_run, self);
    if (rc) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->started = 1;
    return 0;
}

static void wake_thread(int fd)
{
    const uint64_t one = 1;
    if (write(fd, &one, sizeof one) < 0) {
        /* the eventfd is full (2^64 - 2 wakes): the thread is awake anyway */
    }
}

static struct timespec deadline_after(double seconds)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    const long long ns = t.tv_nsec + (long long)(seconds * 1e9);
    t.tv_sec += ns / 1000000000, t.tv_nsec = ns % 1000000000;
    return t;
}

PyDoc_STRVAR(send_doc, "send(frames, mss, wait_s) -> bool: queue one message, cut into its APDUs of at most mss "
                       "bytes (packetise); False when `hwm` messages still wait after wait_s seconds.");

/* APDU k of a queued message: its [u64 size][unused] head, then its bytes, 16-byte aligned (APDU_HEAD). */
static unsigned char *apdu_in_queue(const cut_t *cut, size_t k)
{
    const uint64_t size = apdu_size(cut->m, cut->chunk, k);
    unsigned char *at = ((msg_t *)cut->into)->data + k * apdu_span(cut->chunk + 2);
    memcpy(at, &size, sizeof size);
    return at + APDU_HEAD;
}

static PyObject *SendLoop_send(SendLoopObject *self, PyObject *args)
{
    PyObject *frames;
    Py_ssize_t mss;
    double wait_s;
    size_t chunk;
    v1msg_t v1;
    if (!PyArg_ParseTuple(args, "Ond:send", &frames, &mss, &wait_s) || chunk_of(mss, &chunk) < 0)
        return NULL;
    if (!self->started) {
        PyErr_SetString(PyExc_RuntimeError, "SendLoop is closed");
        return NULL;
    }
    if (v1msg_open(&v1, frames) < 0)
        return NULL;
    const size_t count = apdu_count(&v1, chunk);
    const size_t len = (count - 1) * apdu_span(chunk + 2) + apdu_span(apdu_size(&v1, chunk, count - 1));
    msg_t *m = malloc(sizeof *m + len);
    if (!m) {
        v1msg_close(&v1);
        return PyErr_NoMemory();
    }
    m->len = len;
    const cut_t cut = {&v1, chunk, m};
    v1msg_cut(&cut, apdu_in_queue); /* cannot fail: the room is there */
    v1msg_close(&v1);
    int queued = 0, was_idle = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    if (self->queue.count >= self->hwm && wait_s > 0) {
        const struct timespec until = deadline_after(wait_s);
        while (self->queue.count >= self->hwm && pthread_cond_timedwait(&self->room, &self->lock, &until) == 0)
            ;
    }
    if (self->queue.count < self->hwm) {
        was_idle = !self->queue.count;
        msgq_push(&self->queue, m);
        queued = 1;
    }
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    if (!queued)
        free(m);
    else if (was_idle)
        wake_thread(self->wake);
    return PyBool_FromLong(queued);
}

/* Let the thread send what is queued for up to `linger_s`, then drop the rest; the socket is unused after. */
static void send_close(SendLoopObject *self, double linger_s)
{
    if (!self->started)
        return;
    pthread_mutex_lock(&self->lock);
    self->stopping = 1;
    pthread_mutex_unlock(&self->lock);
    wake_thread(self->wake);
    Py_BEGIN_ALLOW_THREADS
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* pthread_timedjoin_np takes CLOCK_REALTIME */
    const long long ns = until.tv_nsec + (long long)(linger_s * 1e9);
    until.tv_sec += ns / 1000000000, until.tv_nsec = ns % 1000000000;
    if (pthread_timedjoin_np(self->thread, NULL, &until) != 0) { /* still rate limited: give up on the rest */
        pthread_mutex_lock(&self->lock);
        msgq_t rest = self->queue;
        if (rest.head) { /* the thread may be sending the oldest: keep it, drop the others */
            msg_t *keep = rest.head, *drop = keep->next;
            keep->next = NULL;
            self->queue.tail = keep, self->queue.count = 1;
            while (drop) {
                msg_t *next = drop->next;
                free(drop);
                drop = next;
            }
        }
        pthread_mutex_unlock(&self->lock);
        wake_thread(self->wake);
        pthread_join(self->thread, NULL);
    }
    Py_END_ALLOW_THREADS
    self->started = 0;
    msgq_clear(&self->queue);
    close(self->wake);
    self->wake = -1;
}

static PyObject *SendLoop_close(SendLoopObject *self, PyObject *args)
{
    double linger_s;
    if (!PyArg_ParseTuple(args, "d:close", &linger_s))
        return NULL;
    send_close(self, linger_s);
    Py_RETURN_NONE;
}

static PyObject *SendLoop_counters(SendLoopObject *self, PyObject *Py_UNUSED(arg))
{
    uint64_t c[N_SEND_COUNTERS];
    pthread_mutex_lock(&self->lock);
    memcpy(c, self->counters, sizeof c);
    pthread_mutex_unlock(&self->lock);
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < N_SEND_COUNTERS; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(c[i]);
        if (!v || PyDict_SetItemString(d, send_counter_names[i], v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

static void SendLoop_dealloc(SendLoopObject *self)
{
    send_close(self, 0);
    if (self->sock) {
        pthread_mutex_destroy(&self->lock);
        pthread_cond_destroy(&self->room);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef SendLoop_methods[] = {
    {"send", (PyCFunction)SendLoop_send, METH_VARARGS, send_doc},
    {"close", (PyCFunction)SendLoop_close, METH_VARARGS, "close(linger_s): send what is queued for up to linger_s."},
    {"counters", (PyCFunction)SendLoop_counters, METH_NOARGS, "counters() -> dict: SenderStats' fields."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SendLoopType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway.transport._pgm_loop.SendLoop",
    .tp_doc = "SendLoop(sock, hwm): one socket's native send thread, started at once.",
    .tp_basicsize = sizeof(SendLoopObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SendLoop_init,
    .tp_dealloc = (destructor)SendLoop_dealloc,
    .tp_methods = SendLoop_methods,
};

static PyMethodDef module_methods[] = {
    {"packetise", packetise, METH_VARARGS, packetise_doc},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gateway.transport._pgm_loop",
    "The I/O loops of gateway.transport.pgm in native threads (see _pgm_loop.c).", -1, module_methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC PyInit__pgm_loop(void)
{
    if (PyType_Ready(&ReassemblerType) < 0 || PyType_Ready(&LoopType) < 0 || PyType_Ready(&SendLoopType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&ReassemblerType);
    Py_INCREF(&LoopType);
    Py_INCREF(&SendLoopType);
    if (PyModule_AddObject(m, "Reassembler", (PyObject *)&ReassemblerType) < 0 ||
        PyModule_AddObject(m, "ReceiveLoop", (PyObject *)&LoopType) < 0 ||
        PyModule_AddObject(m, "SendLoop", (PyObject *)&SendLoopType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
