/* Data syncs submitted to the kernel through io_uring, with no thread of ours:
 * the file store's overwrites in place (okq/store/file.py, "Syncs without a
 * thread"). A Ring submits IORING_OP_FSYNC with IORING_FSYNC_DATASYNC (what
 * fdatasync(2) does) for a file descriptor and a tag, and signals an eventfd
 * when one completes; the event loop watches the eventfd and reaps (tag,
 * result) pairs, the result 0 or -errno as fdatasync would have failed.
 * Plain system calls, no liburing. Where the kernel or its headers have no
 * io_uring (or a sandbox forbids it), Ring() raises OSError and the store
 * syncs in its commit thread as before. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__linux__) && defined(__has_include)
#if __has_include(<linux/io_uring.h>)
#define OKQ_URING 1
#endif
#endif

#ifdef OKQ_URING
#include <errno.h>
#include <linux/io_uring.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif
#ifndef __NR_io_uring_register
#define __NR_io_uring_register 427
#endif
#endif

typedef struct {
    PyObject_HEAD
    int fd;          /* the ring's, -1 once closed */
    int event;       /* the eventfd its completions signal */
#ifdef OKQ_URING
    void *sq_map, *cq_map;
    size_t sq_len, cq_len;
    struct io_uring_sqe *sqes;
    size_t sqes_len;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, sq_entries;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_cqe *cqes;
#endif
    Py_ssize_t pending;  /* submitted, not yet reaped */
} Ring;

static void release(Ring *r) {
#ifdef OKQ_URING
    if (r->sqes != NULL && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqes_len);
    if (r->cq_map != NULL && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_len);
    if (r->sq_map != NULL && r->sq_map != MAP_FAILED) munmap(r->sq_map, r->sq_len);
    r->sqes = NULL;
    r->sq_map = r->cq_map = NULL;
    if (r->fd >= 0) close(r->fd);
    if (r->event >= 0) close(r->event);
#endif
    r->fd = r->event = -1;  /* elsewhere than Linux they never are anything else */
}

static void Ring_dealloc(Ring *r) {
    release(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* A ring with nothing open: what __init__ starts from, and what a ring whose
 * __init__ failed or never ran is freed as (its descriptors are never 0). */
static PyObject *Ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Ring *r = (Ring *)type->tp_alloc(type, 0);
    if (r != NULL) r->fd = r->event = -1;
    return (PyObject *)r;
}

static int Ring_init(Ring *r, PyObject *args, PyObject *kwds) {
    static char *names[] = {"entries", NULL};
    unsigned entries = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|I", names, &entries)) return -1;
    release(r);  /* __init__ called again: the old ring closed first */
    r->pending = 0;
#ifndef OKQ_URING
    PyErr_SetString(PyExc_OSError, "io_uring is not available on this platform");
    return -1;
#else
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int fd = (int)syscall(__NR_io_uring_setup, entries, &p);
    if (fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    r->fd = fd;
    r->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (r->cq_len > r->sq_len) r->sq_len = r->cq_len;
        r->cq_len = r->sq_len;
    }
    r->sq_map = mmap(NULL, r->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                     IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED) goto fail;
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        r->cq_map = r->sq_map;
    } else {
        r->cq_map = mmap(NULL, r->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                         fd, IORING_OFF_CQ_RING);
        if (r->cq_map == MAP_FAILED) goto fail;
    }
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                   IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) goto fail;
    char *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->sq_entries = p.sq_entries;
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    r->event = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->event < 0) goto fail;
    if (syscall(__NR_io_uring_register, fd, IORING_REGISTER_EVENTFD, &r->event, 1) < 0)
        goto fail;
    return 0;
fail:
    PyErr_SetFromErrno(PyExc_OSError);
    release(r);
    return -1;
#endif
}

static PyObject *closed(void) {
    PyErr_SetString(PyExc_ValueError, "the ring is closed");
    return NULL;
}

static PyObject *Ring_fileno(Ring *r, PyObject *unused) {
    if (r->fd < 0) return closed();
    return PyLong_FromLong(r->event);
}

/* fdatasync(fd, tag): the data sync of fd submitted, reaped later as (tag, result).
 * BlockingIOError when the submission queue is full; OSError when the kernel
 * refuses the submission (nothing was queued then). */
static PyObject *Ring_fdatasync(Ring *r, PyObject *args) {
    int fd;
    unsigned long long tag;
    if (!PyArg_ParseTuple(args, "iK", &fd, &tag)) return NULL;
    if (r->fd < 0) return closed();
#ifdef OKQ_URING
    unsigned tail = *r->sq_tail;
    unsigned head = __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
    if (tail - head >= r->sq_entries) {
        PyErr_SetString(PyExc_BlockingIOError, "the submission queue is full");
        return NULL;
    }
    unsigned index = tail & *r->sq_mask;
    struct io_uring_sqe *sqe = &r->sqes[index];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = IORING_OP_FSYNC;
    sqe->fd = fd;
    sqe->fsync_flags = IORING_FSYNC_DATASYNC;
    sqe->user_data = tag;
    r->sq_array[index] = index;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
    long done;
    do {
        done = syscall(__NR_io_uring_enter, r->fd, 1, 0, 0, NULL, 0);
    } while (done < 0 && errno == EINTR);
    if (done != 1) {
        /* Not consumed: take it back, so that no later call submits it. */
        int err = done < 0 ? errno : EAGAIN;
        if (__atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE) == tail)
            __atomic_store_n(r->sq_tail, tail, __ATOMIC_RELEASE);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    r->pending++;
    Py_RETURN_NONE;
#else
    return closed();
#endif
}

/* reap() -> [(tag, result), ...]: every completion there is (none: an empty list). */
static PyObject *Ring_reap(Ring *r, PyObject *unused) {
    if (r->fd < 0) return closed();
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
#ifdef OKQ_URING
    uint64_t count;
    if (read(r->event, &count, sizeof count) < 0 && errno != EAGAIN) {
        Py_DECREF(out);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    unsigned head = *r->cq_head;
    for (;;) {
        unsigned tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
        if (head == tail) break;
        struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
        PyObject *pair = Py_BuildValue("(Ki)", (unsigned long long)cqe->user_data, cqe->res);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            return NULL;  /* the completions not read stay in the ring */
        }
        Py_DECREF(pair);
        head++;
        __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
        r->pending--;
    }
#endif
    return out;
}

static PyObject *Ring_close(Ring *r, PyObject *unused) {
    release(r);
    Py_RETURN_NONE;
}

static PyObject *Ring_get_pending(Ring *r, void *unused) {
    return PyLong_FromSsize_t(r->pending);
}

static PyObject *Ring_get_closed(Ring *r, void *unused) {
    return PyBool_FromLong(r->fd < 0);
}

static PyMethodDef Ring_methods[] = {
    {"fileno", (PyCFunction)Ring_fileno, METH_NOARGS,
     "The eventfd that becomes readable when a sync completes."},
    {"fdatasync", (PyCFunction)Ring_fdatasync, METH_VARARGS,
     "fdatasync(fd, tag): submit a data sync of fd, reaped as (tag, result)."},
    {"reap", (PyCFunction)Ring_reap, METH_NOARGS,
     "reap() -> [(tag, result)]: the completed syncs, result 0 or -errno."},
    {"close", (PyCFunction)Ring_close, METH_NOARGS,
     "Close the ring (syncs in flight still complete in the kernel)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Ring_getset[] = {
    {"pending", (getter)Ring_get_pending, NULL, "syncs submitted and not yet reaped", NULL},
    {"closed", (getter)Ring_get_closed, NULL, "whether close() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "okq.store._uring.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ring(entries=64): data syncs through io_uring, completions on an eventfd.",
    .tp_methods = Ring_methods,
    .tp_getset = Ring_getset,
    .tp_init = (initproc)Ring_init,
    .tp_new = Ring_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "okq.store._uring",
    "Data syncs through io_uring (okq/_native/uring.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__uring(void) {
    if (PyType_Ready(&RingType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
