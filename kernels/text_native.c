/* The text kernels Python is slow at: a per-token step over millions of tokens, where each step in Python is a
 * str object and a dict probe or two (~100-300 ns). kernels/fasttext_tokens.py and kernels/word_classes.py wrap
 * them and keep pure-Python equivalents (used where this extension is not built; tests check both agree).
 *
 * split(data: bytes-like, seed: int) -> (distinct: bytes, ids: bytes, ends: bytes)
 *   fastText's tokens of a batch of lines, deduplicated, in one pass over their UTF-8 bytes. The language-ID
 *   fast path (pipeline/filters/fasttext_numpy.py) caches every distinct token's row sum, so what was left per
 *   token was finding its cache slot: in Python a str object per token and two dict probes (split,
 *   dict.fromkeys, a lookup), ~2/3 of the lid stage on a long stream. Here each distinct token of the batch is
 *   numbered in a small hash table that stays in the CPU's cache (equal bytes checked with memcmp: exact,
 *   whatever the hash), so Python sees only the batch's distinct tokens.
 *   data: lines joined by "\n"; tokens are the non-empty runs between fastText's separators (readWord in
 *   src/dictionary.cc: space, tab, vertical tab, form feed, carriage return, NUL; "\n" ends a line too).
 *   distinct: every distinct token once, in order of first occurrence, joined by "\n" (no token holds one);
 *   ids: per token, int64 index of its distinct token; ends: per line, int64 count of tokens up to its end.
 *
 * chunks(texts: list[str], seed: int) -> (distinct: list[str], ids: bytes, ends: bytes)
 *   str.split() of every text (runs of Py_UNICODE_ISSPACE), numbered by distinct chunk across the texts: the
 *   word splitter (pipeline/filters/text.py) then probes its large chunk cache once per distinct chunk of a
 *   batch, not once per chunk (twice, in Python, with a str object per chunk). ids and ends as for split.
 * assemble(parts: list[tuple[str, ...]], ids: bytes, ends: bytes) -> list[list[str]]
 *   per text, the items of parts[id] for each of its ids, in order: its words from its chunks' tokens.
 *
 * space_chunks(text: str) -> list[str]
 *   re.split(r" (?=\S)", text): the text cut at every space followed by a character that is not whitespace
 *   (Py_UNICODE_ISSPACE, what re's \s is for str), the space dropped. The byte-level BPE fast path
 *   (pipeline/fast/byte_level_bpe.py) looks each chunk up whole; most real texts hold a space before whitespace
 *   somewhere (indentation, a space before a line end), where str.split(" ") would cut wrongly and re.split
 *   was most of what the encoder cost outside its lookups.
 *
 * word_sums(words: list[str], symbols: bytes) -> (words, their characters, tokens with a letter)
 *   Gopher quality's sums: a token is a word unless every character is a symbol (bit set in the bitmap
 *   `symbols`, one bit per code point); a token has a letter when one character is alphabetic (str.isalpha).
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

static PyObject *word_sums(PyObject *self, PyObject *args) {
    PyObject *words;
    Py_buffer bits;
    if (!PyArg_ParseTuple(args, "O!y*", &PyList_Type, &words, &bits)) return NULL;
    const unsigned char *map = bits.buf;
    Py_UCS4 nbits = (Py_UCS4)(bits.len * 8);
    long long n_words = 0, len_words = 0, n_alpha = 0;
    Py_ssize_t n = PyList_GET_SIZE(words);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *w = PyList_GET_ITEM(words, k);
        if (!PyUnicode_Check(w)) {
            PyBuffer_Release(&bits);
            PyErr_SetString(PyExc_TypeError, "word_sums: every word must be a str");
            return NULL;
        }
        int kind = PyUnicode_KIND(w);
        const void *data = PyUnicode_DATA(w);
        Py_ssize_t len = PyUnicode_GET_LENGTH(w);
        int symbols_only = 1, alpha = 0;
        for (Py_ssize_t i = 0; i < len; i++) {
            Py_UCS4 ch = PyUnicode_READ(kind, data, i);
            if (symbols_only && !(ch < nbits && (map[ch >> 3] >> (ch & 7)) & 1)) symbols_only = 0;
            if (!alpha && Py_UNICODE_ISALPHA(ch)) alpha = 1;
            if (!symbols_only && alpha) break;
        }
        if (!symbols_only) {
            n_words++;
            len_words += len;
        }
        n_alpha += alpha;
    }
    PyBuffer_Release(&bits);
    return Py_BuildValue("(LLL)", n_words, len_words, n_alpha);
}

/* ---- chunks: str.split() of many texts, numbered by distinct chunk ---------------------------------------- */

typedef struct {
    Py_ssize_t text, start, len;
} Span;

static inline int same_chunk(PyObject *a, Py_ssize_t as, PyObject *b, Py_ssize_t bs, Py_ssize_t len) {
    int ka = PyUnicode_KIND(a), kb = PyUnicode_KIND(b);
    const void *da = PyUnicode_DATA(a), *db = PyUnicode_DATA(b);
    if (ka == kb) return memcmp((const char *)da + as * ka, (const char *)db + bs * kb, (size_t)(len * ka)) == 0;
    for (Py_ssize_t i = 0; i < len; i++)
        if (PyUnicode_READ(ka, da, as + i) != PyUnicode_READ(kb, db, bs + i)) return 0;
    return 1;
}

static PyObject *chunks(PyObject *self, PyObject *args) {
    PyObject *texts;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "O!K", &PyList_Type, &texts, &seed)) return NULL;
    Py_ssize_t ntexts = PyList_GET_SIZE(texts);
    Py_ssize_t total = 0;
    for (Py_ssize_t t = 0; t < ntexts; t++) {
        PyObject *s = PyList_GET_ITEM(texts, t);
        if (!PyUnicode_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "chunks: every text must be a str");
            return NULL;
        }
        total += PyUnicode_GET_LENGTH(s);
    }
    Vec ids = {0}, ends = {0};
    Span *spans = NULL;
    Py_ssize_t nspans = 0, capspans = 0;
    Table tab;
    size_t cap = 1024;
    while (cap < (size_t)(total / 16 + 1) * 2 && cap < ((size_t)1 << 30)) cap <<= 1;
    PyObject *out = NULL, *distinct = NULL;
    if (table_init(&tab, cap) < 0) goto oom;
    for (Py_ssize_t t = 0; t < ntexts; t++) {
        PyObject *s = PyList_GET_ITEM(texts, t);
        int kind = PyUnicode_KIND(s);
        const void *data = PyUnicode_DATA(s);
        Py_ssize_t n = PyUnicode_GET_LENGTH(s), i = 0;
        while (1) {
            while (i < n && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i))) i++;
            if (i >= n) break;
            Py_ssize_t a = i;
            uint64_t h = seed;
            while (i < n) {
                Py_UCS4 ch = PyUnicode_READ(kind, data, i);
                if (Py_UNICODE_ISSPACE(ch)) break;
                h = (h ^ ch) * 0x100000001B3ULL;
                i++;
            }
            Py_ssize_t len = i - a;
            h = mix64(h ^ (uint64_t)len);
            size_t j = h & tab.mask;
            int64_t id = -1;
            while (tab.slot[j]) {
                int64_t k = tab.slot[j] - 1;
                if (tab.hash[j] == h && spans[k].len == len &&
                    same_chunk(PyList_GET_ITEM(texts, spans[k].text), spans[k].start, s, a, len)) {
                    id = k;
                    break;
                }
                j = (j + 1) & tab.mask;
            }
            if (id < 0) {
                id = nspans;
                if (id >= INT32_MAX - 1) goto oom;
                if (nspans == capspans) {
                    Py_ssize_t c = capspans ? 2 * capspans : 1024;
                    Span *p = PyMem_RawRealloc(spans, (size_t)c * sizeof(Span));
                    if (p == NULL) goto oom;
                    spans = p;
                    capspans = c;
                }
                spans[nspans].text = t;
                spans[nspans].start = a;
                spans[nspans].len = len;
                nspans++;
                tab.slot[j] = (int32_t)(id + 1);
                tab.hash[j] = h;
                if ((size_t)nspans * 2 > tab.mask + 1 && table_grow(&tab) < 0) goto oom;
            }
            if (vec_push(&ids, id) < 0) goto oom;
        }
        if (vec_push(&ends, ids.len) < 0) goto oom;
    }
    distinct = PyList_New(nspans);
    if (distinct == NULL) goto done;
    for (Py_ssize_t k = 0; k < nspans; k++) {
        PyObject *sub = PyUnicode_Substring(PyList_GET_ITEM(texts, spans[k].text), spans[k].start,
                                            spans[k].start + spans[k].len);
        if (sub == NULL) goto done;
        PyList_SET_ITEM(distinct, k, sub);
    }
    PyObject *ids_b = vec_bytes(&ids), *ends_b = vec_bytes(&ends);
    if (ids_b != NULL && ends_b != NULL) out = PyTuple_Pack(3, distinct, ids_b, ends_b);
    Py_XDECREF(ids_b);
    Py_XDECREF(ends_b);
    goto done;
oom:
    PyErr_NoMemory();
done:
    Py_XDECREF(distinct);
    table_free(&tab);
    PyMem_RawFree(spans);
    PyMem_RawFree(ids.data);
    PyMem_RawFree(ends.data);
    return out;
}

/* assemble(parts, ids, ends) -> one list per text: the items of parts[id] for each of its ids, in order */
static PyObject *assemble(PyObject *self, PyObject *args) {
    PyObject *parts;
    Py_buffer idb, endb;
    if (!PyArg_ParseTuple(args, "O!y*y*", &PyList_Type, &parts, &idb, &endb)) return NULL;
    const int64_t *ids = idb.buf, *ends = endb.buf;
    Py_ssize_t nids = idb.len / (Py_ssize_t)sizeof(int64_t), ntexts = endb.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t nparts = PyList_GET_SIZE(parts);
    PyObject *out = PyList_New(ntexts);
    if (out == NULL) goto fail;
    for (Py_ssize_t k = 0; k < nparts; k++) {
        if (!PyTuple_Check(PyList_GET_ITEM(parts, k))) {
            PyErr_SetString(PyExc_TypeError, "assemble: every part must be a tuple");
            goto fail;
        }
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t t = 0; t < ntexts; t++) {
        Py_ssize_t end = ends[t], n = 0;
        if (end < at || end > nids) {
            PyErr_SetString(PyExc_ValueError, "assemble: ends out of order");
            goto fail;
        }
        for (Py_ssize_t i = at; i < end; i++) {
            if (ids[i] < 0 || ids[i] >= nparts) {
                PyErr_SetString(PyExc_IndexError, "assemble: id out of range");
                goto fail;
            }
            n += PyTuple_GET_SIZE(PyList_GET_ITEM(parts, ids[i]));
        }
        PyObject *words = PyList_New(n);
        if (words == NULL) goto fail;
        Py_ssize_t w = 0;
        for (Py_ssize_t i = at; i < end; i++) {
            PyObject *tup = PyList_GET_ITEM(parts, ids[i]);
            for (Py_ssize_t q = 0; q < PyTuple_GET_SIZE(tup); q++) {
                PyObject *item = PyTuple_GET_ITEM(tup, q);
                Py_INCREF(item);
                PyList_SET_ITEM(words, w++, item);
            }
        }
        PyList_SET_ITEM(out, t, words);
        at = end;
    }
    PyBuffer_Release(&idb);
    PyBuffer_Release(&endb);
    return out;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&idb);
    PyBuffer_Release(&endb);
    return NULL;
}

/* out.append(text[start:end]); -1 with the error set when that fails */
static int append_slice(PyObject *out, PyObject *text, Py_ssize_t start, Py_ssize_t end) {
    PyObject *piece = PyUnicode_Substring(text, start, end);
    if (!piece) return -1;
    int rc = PyList_Append(out, piece);
    Py_DECREF(piece);
    return rc;
}

static PyObject *space_chunks(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "space_chunks: the text must be a str");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(arg), start = 0;
    int kind = PyUnicode_KIND(arg);
    const void *data = PyUnicode_DATA(arg);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        if (PyUnicode_READ(kind, data, i) != ' ' || Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, i + 1))) continue;
        if (append_slice(out, arg, start, i) < 0) goto fail;
        start = i + 1;
    }
    if (append_slice(out, arg, start, n) < 0) goto fail;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"split", split, METH_VARARGS, "split(data, seed) -> (distinct, ids, ends): see the module's source."},
    {"chunks", chunks, METH_VARARGS, "chunks(texts, seed) -> (distinct, ids, ends): str.split() of each text."},
    {"assemble", assemble, METH_VARARGS, "assemble(parts, ids, ends) -> per text, the items of its parts."},
    {"space_chunks", space_chunks, METH_O, "space_chunks(text) -> re.split(r' (?=\\S)', text)."},
    {"word_sums", word_sums, METH_VARARGS, "word_sums(words, symbols) -> (words, characters, with a letter)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_text_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__text_native(void) { return PyModule_Create(&module); }
