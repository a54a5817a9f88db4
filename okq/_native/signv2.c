/* Version 2 lease tokens signed in C: keyed BLAKE2b (RFC 7693), 16-byte digest,
 * personalisation given, over "{prefix}{index}.{v}"; each token is that text,
 * ".", and the digest in lowercase hex (docs/DESIGN.md, "Tokens").
 *
 * The same tokens, byte for byte, as okq/_pure/tokens.py makes with hashlib
 * (tests/unit/test_tokens.py compares them): this module only saves the Python
 * objects a token costs there (a hash object, the tail's text and bytes, the
 * hex digest's text). A build that cannot compile it signs in Python. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
    0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t SIGMA[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

#define DIGEST 16
#define BLOCK 128

typedef struct {
    uint64_t h[8];
    uint64_t t;      /* bytes compressed so far (the counter's high word stays 0) */
    size_t used;     /* bytes waiting in buf */
    uint8_t buf[BLOCK];
} State;

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint64_t rotr64(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

#define G(a, b, c, d, x, y)            \
    do {                               \
        a = a + b + (x);               \
        d = rotr64(d ^ a, 32);         \
        c = c + d;                     \
        b = rotr64(b ^ c, 24);         \
        a = a + b + (y);               \
        d = rotr64(d ^ a, 16);         \
        c = c + d;                     \
        b = rotr64(b ^ c, 63);         \
    } while (0)

static void compress(uint64_t h[8], const uint8_t block[BLOCK], uint64_t t, int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t;
    if (last) v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = SIGMA[r % 10];
        G(v[0], v[4], v[8], v[12], m[s[0]], m[s[1]]);
        G(v[1], v[5], v[9], v[13], m[s[2]], m[s[3]]);
        G(v[2], v[6], v[10], v[14], m[s[4]], m[s[5]]);
        G(v[3], v[7], v[11], v[15], m[s[6]], m[s[7]]);
        G(v[0], v[5], v[10], v[15], m[s[8]], m[s[9]]);
        G(v[1], v[6], v[11], v[12], m[s[10]], m[s[11]]);
        G(v[2], v[7], v[8], v[13], m[s[12]], m[s[13]]);
        G(v[3], v[4], v[9], v[14], m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* A block is compressed only once more input follows it: the last one is
 * compressed by finish, flagged as last. */
static void absorb(State *s, const uint8_t *in, size_t n) {
    while (n > 0) {
        if (s->used == BLOCK) {
            s->t += BLOCK;
            compress(s->h, s->buf, s->t, 0);
            s->used = 0;
        }
        size_t take = BLOCK - s->used;
        if (take > n) take = n;
        memcpy(s->buf + s->used, in, take);
        s->used += take;
        in += take;
        n -= take;
    }
}

static void finish(State *s, uint8_t out[DIGEST]) {
    s->t += s->used;
    memset(s->buf + s->used, 0, BLOCK - s->used);
    compress(s->h, s->buf, s->t, 1);
    for (int i = 0; i < DIGEST; i++) out[i] = (uint8_t)(s->h[i / 8] >> (8 * (i % 8)));
}

static void keyed(State *s, const uint8_t *key, size_t keylen, const uint8_t *person,
                  size_t personlen) {
    uint8_t p[16] = {0};
    memcpy(p, person, personlen);
    for (int i = 0; i < 8; i++) s->h[i] = IV[i];
    s->h[0] ^= 0x01010000ULL | ((uint64_t)keylen << 8) | DIGEST;
    s->h[6] ^= load64(p);
    s->h[7] ^= load64(p + 8);
    s->t = 0;
    memset(s->buf, 0, BLOCK);
    memcpy(s->buf, key, keylen);
    s->used = BLOCK;
}

/* The decimal spelling of n (as Python's str(n) for n >= 0) at out; its length. */
static size_t decimal(unsigned long long n, char *out) {
    char tmp[24];
    size_t k = 0;
    do {
        tmp[k++] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    for (size_t i = 0; i < k; i++) out[i] = tmp[k - 1 - i];
    return k;
}

static const char HEX[] = "0123456789abcdef";

/* sign(key, person, prefix, deliveries, minted, head) -> list of tokens.
 * deliveries: a list of (index, v), ints from 0 to 2**63 - 1; minted: the dict each
 * token is recorded in, as head + (index, v). OverflowError for an int out of range,
 * before anything is recorded. */
static PyObject *sign(PyObject *self, PyObject *args) {
    Py_buffer key, person;
    PyObject *prefix, *deliveries, *minted, *head;
    if (!PyArg_ParseTuple(args, "y*y*UO!O!O!", &key, &person, &prefix, &PyList_Type,
                          &deliveries, &PyDict_Type, &minted, &PyTuple_Type, &head))
        return NULL;
    PyObject *out = NULL;
    unsigned long long *nums = NULL;
    Py_ssize_t n = PyList_GET_SIZE(deliveries);
    if (key.len < 1 || key.len > 64 || person.len > 16 || !PyUnicode_IS_ASCII(prefix)) {
        PyErr_SetString(PyExc_ValueError, "a key of 1 to 64 bytes, a personalisation of "
                        "at most 16 and an ASCII prefix are needed");
        goto done;
    }
    nums = PyMem_Malloc(sizeof(unsigned long long) * 2 * (n ? n : 1));
    if (nums == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(deliveries, i);
        if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 2) {
            PyErr_SetString(PyExc_TypeError, "each delivery is an (index, v) tuple");
            goto done;
        }
        for (int k = 0; k < 2; k++) {
            long long value = PyLong_AsLongLong(PyTuple_GET_ITEM(d, k));
            if (value == -1 && PyErr_Occurred()) goto done;
            if (value < 0) {
                PyErr_SetString(PyExc_OverflowError, "a negative index or v");
                goto done;
            }
            nums[2 * i + k] = (unsigned long long)value;
        }
    }
    Py_ssize_t plen = PyUnicode_GET_LENGTH(prefix);
    const uint8_t *ptext = PyUnicode_1BYTE_DATA(prefix);
    State base;
    keyed(&base, key.buf, (size_t)key.len, person.buf, (size_t)person.len);
    absorb(&base, ptext, (size_t)plen);
    out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        char tail[48];
        size_t tl = decimal(nums[2 * i], tail);
        tail[tl++] = '.';
        tl += decimal(nums[2 * i + 1], tail + tl);
        State s = base;
        uint8_t mac[DIGEST];
        absorb(&s, (const uint8_t *)tail, tl);
        finish(&s, mac);
        PyObject *token = PyUnicode_New(plen + (Py_ssize_t)tl + 1 + 2 * DIGEST, 127);
        if (token == NULL) goto fail;
        Py_UCS1 *w = PyUnicode_1BYTE_DATA(token);
        memcpy(w, ptext, (size_t)plen);
        w += plen;
        memcpy(w, tail, tl);
        w += tl;
        *w++ = '.';
        for (int k = 0; k < DIGEST; k++) {
            *w++ = (Py_UCS1)HEX[mac[k] >> 4];
            *w++ = (Py_UCS1)HEX[mac[k] & 15];
        }
        PyList_SET_ITEM(out, i, token);
        PyObject *d = PyList_GET_ITEM(deliveries, i);
        Py_ssize_t hn = PyTuple_GET_SIZE(head);
        PyObject *named = PyTuple_New(hn + 2);
        if (named == NULL) goto fail;
        for (Py_ssize_t k = 0; k < hn; k++) {
            PyObject *part = PyTuple_GET_ITEM(head, k);
            Py_INCREF(part);
            PyTuple_SET_ITEM(named, k, part);
        }
        for (int k = 0; k < 2; k++) {
            PyObject *part = PyTuple_GET_ITEM(d, k);
            Py_INCREF(part);
            PyTuple_SET_ITEM(named, hn + k, part);
        }
        int failed = PyDict_SetItem(minted, token, named);
        Py_DECREF(named);
        if (failed) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(nums);
    PyBuffer_Release(&key);
    PyBuffer_Release(&person);
    return out;
}

static PyMethodDef methods[] = {
    {"sign", sign, METH_VARARGS,
     "sign(key, person, prefix, deliveries, minted, head): version 2 tokens"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "okq._compiled.signv2",
    "Version 2 lease tokens signed in C (okq/_native/signv2.c).", -1, methods,
};

PyMODINIT_FUNC PyInit_signv2(void) { return PyModule_Create(&module); }
