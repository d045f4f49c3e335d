/* fastText's tokens of a batch of lines, deduplicated, in one pass over their UTF-8 bytes.
 *
 * Why native: the language-ID fast path (pipeline/filters/fasttext_numpy.py) caches every distinct token's row
 * sum, so what is left per token is finding its cache slot. In Python that is a str object per token and two
 * dict probes on it (split, dict.fromkeys, a lookup): ~2/3 of the lid stage's cost on a long stream. Here one
 * pass splits on fastText's separators and numbers each distinct token of the batch in a small hash table that
 * stays in the CPU's cache (equal bytes checked with memcmp: exact, whatever the hash), so Python sees only the
 * batch's distinct tokens. kernels/fasttext_tokens.py wraps it and keeps a pure-Python equivalent.
 *
 * split(data: bytes-like, seed: int) -> (distinct: bytes, ids: bytes, ends: bytes)
 *   data: lines joined by "\n"; tokens are the non-empty runs between fastText's separators (readWord in
 *   src/dictionary.cc: space, tab, vertical tab, form feed, carriage return, NUL; "\n" ends a line too).
 *   distinct: every distinct token once, in order of first occurrence, joined by "\n" (no token holds one);
 *   ids: per token, int64 index of its distinct token; ends: per line, int64 count of tokens up to its end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline int is_sep(unsigned char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\v' || c == '\f' || c == '\r' || c == '\0';
}

typedef struct {
    int64_t *data;
    Py_ssize_t len, cap;
} Vec;

static int vec_push(Vec *v, int64_t x) {
    if (v->len == v->cap) {
        Py_ssize_t cap = v->cap ? 2 * v->cap : 1024;
        int64_t *p = PyMem_RawRealloc(v->data, (size_t)cap * sizeof(int64_t));
        if (p == NULL) return -1;
        v->data = p;
        v->cap = cap;
    }
    v->data[v->len++] = x;
    return 0;
}

typedef struct {
    int32_t *slot;   /* distinct index + 1, 0: empty */
    uint64_t *hash;  /* the hash of that slot's token */
    size_t mask;
} Table;

static int table_init(Table *t, size_t cap) {
    t->slot = PyMem_RawCalloc(cap, sizeof(int32_t));
    t->hash = PyMem_RawMalloc(cap * sizeof(uint64_t));
    t->mask = cap - 1;
    return (t->slot == NULL || t->hash == NULL) ? -1 : 0;
}

static void table_free(Table *t) {
    PyMem_RawFree(t->slot);
    PyMem_RawFree(t->hash);
}

/* the table twice as large, every distinct token placed again */
static int table_grow(Table *t) {
    Table n;
    if (table_init(&n, 2 * (t->mask + 1)) < 0) {
        table_free(&n);
        return -1;
    }
    for (size_t i = 0; i <= t->mask; i++) {
        if (!t->slot[i]) continue;
        size_t j = t->hash[i] & n.mask;
        while (n.slot[j]) j = (j + 1) & n.mask;
        n.slot[j] = t->slot[i];
        n.hash[j] = t->hash[i];
    }
    table_free(t);
    *t = n;
    return 0;
}

static inline uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* 0 on success, -1 out of memory (nothing raised: the GIL is released) */
static int split_bytes(const unsigned char *s, Py_ssize_t n, uint64_t seed, Vec *ids, Vec *ends, Vec *starts,
                       Vec *lens) {
    Table t;
    size_t cap = 1024;
    while (cap < (size_t)(n / 8 + 1) * 2 && cap < ((size_t)1 << 30)) cap <<= 1;
    if (table_init(&t, cap) < 0) {
        table_free(&t);
        return -1;
    }
    Py_ssize_t i = 0;
    int rc = 0;
    while (1) {
        while (i < n && is_sep(s[i])) {
            if (s[i] == '\n' && vec_push(ends, ids->len) < 0) goto oom;
            i++;
        }
        if (i >= n) break;
        Py_ssize_t a = i;
        uint64_t h = seed;
        while (i < n && !is_sep(s[i])) {
            h = (h ^ s[i]) * 0x100000001B3ULL; /* FNV-1a step, then mixed */
            i++;
        }
        h = mix64(h ^ (uint64_t)(i - a));
        Py_ssize_t len = i - a;
        size_t j = h & t.mask;
        int64_t id = -1;
        while (t.slot[j]) {
            int64_t k = t.slot[j] - 1;
            if (t.hash[j] == h && lens->data[k] == len && memcmp(s + starts->data[k], s + a, (size_t)len) == 0) {
                id = k;
                break;
            }
            j = (j + 1) & t.mask;
        }
        if (id < 0) {
            id = starts->len;
            if (id >= INT32_MAX - 1) goto oom;
            if (vec_push(starts, a) < 0 || vec_push(lens, len) < 0) goto oom;
            t.slot[j] = (int32_t)(id + 1);
            t.hash[j] = h;
            if ((size_t)starts->len * 2 > t.mask + 1 && table_grow(&t) < 0) goto oom;
        }
        if (vec_push(ids, id) < 0) goto oom;
    }
    if (vec_push(ends, ids->len) < 0) goto oom;
    goto done;
oom:
    rc = -1;
done:
    table_free(&t);
    return rc;
}

static PyObject *vec_bytes(Vec *v) {
    return PyBytes_FromStringAndSize((const char *)v->data, v->len * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *split(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "y*K", &buf, &seed)) return NULL;
    Vec ids = {0}, ends = {0}, starts = {0}, lens = {0};
    const unsigned char *s = buf.buf;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = split_bytes(s, buf.len, (uint64_t)seed, &ids, &ends, &starts, &lens);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = starts.len > 0 ? starts.len - 1 : 0;
    for (Py_ssize_t k = 0; k < starts.len; k++) total += lens.data[k];
    PyObject *distinct = PyBytes_FromStringAndSize(NULL, total);
    if (distinct == NULL) goto done;
    char *p = PyBytes_AS_STRING(distinct);
    for (Py_ssize_t k = 0; k < starts.len; k++) {
        if (k) *p++ = '\n';
        memcpy(p, s + starts.data[k], (size_t)lens.data[k]);
        p += lens.data[k];
    }
    PyObject *ids_b = vec_bytes(&ids), *ends_b = vec_bytes(&ends);
    if (ids_b != NULL && ends_b != NULL) out = PyTuple_Pack(3, distinct, ids_b, ends_b);
    Py_DECREF(distinct);
    Py_XDECREF(ids_b);
    Py_XDECREF(ends_b);
done:
    PyMem_RawFree(ids.data);
    PyMem_RawFree(ends.data);
    PyMem_RawFree(starts.data);
    PyMem_RawFree(lens.data);
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"split", split, METH_VARARGS, "split(data, seed) -> (distinct, ids, ends): see the module's source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fasttext_tokens", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fasttext_tokens(void) { return PyModule_Create(&module); }
