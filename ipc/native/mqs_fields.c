#include "mqs_fields.h"

#include <stdio.h>
#include <string.h>

#include "mqs_layout.h"

#define MAX_PROPERTIES 32767
#define TOPIC_MAX_CHARS 127
#define TOPIC_RULE "only letters, digits, '%', '|', '_' and '-' (RocketMQ's ^[%|a-zA-Z0-9_-]+$)"

static PyObject *names[MQS_FIELDS], *name_tags, *name_keys, *space, *empty, *zero;
static const char *const field_names[MQS_FIELDS] = {
    "topic", "body", "tags", "keys", "properties", "queue_id", "delay_level"};
static const char *const message_attrs[MQS_FIELDS] = {
    "topic", "body", NULL, NULL, "properties", "queue_id", "delay_level"};

int mqs_fields_ready(void)
{
    for (int i = 0; i < MQS_FIELDS; i++)
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(field_names[i])) == NULL)
            return -1;
    if (name_tags == NULL && (name_tags = PyUnicode_InternFromString("TAGS")) == NULL)
        return -1;
    if (name_keys == NULL && (name_keys = PyUnicode_InternFromString("KEYS")) == NULL)
        return -1;
    if (space == NULL && (space = PyUnicode_InternFromString(" ")) == NULL)
        return -1;
    if (empty == NULL && (empty = PyUnicode_New(0, 0)) == NULL)
        return -1;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return -1;
    return 0;
}

/* Bytes below '!' by class: a separator (0x01, 0x02), or ASCII whitespace (Python's,
 * hence the keys' rule) 0x09-0x0D, 0x1C-0x20. */
enum { SEPARATOR = 1, SPACE = 2 };
static const uint8_t low_class[33] = {
    [1] = SEPARATOR, [2] = SEPARATOR, [9] = SPACE,  [10] = SPACE, [11] = SPACE, [12] = SPACE,
    [13] = SPACE,    [28] = SPACE,    [29] = SPACE, [30] = SPACE, [31] = SPACE, [32] = SPACE};

#define BYTES(b) (0x0101010101010101ULL * (b))
/* Nonzero when a byte of w (each below 0x80) is below '!'; LOW32 for a 4-byte word. */
#define LOW(w) (((w) - BYTES(0x21)) & ~(w) & BYTES(0x80))
#define LOW32(w) (((w) - 0x21212121U) & ~(w) & 0x80808080U)

/* The characters of a compact ASCII str (every exact str in practice: only the legacy
 * API made other ASCII strs), else NULL. One test of the state bits, where
 * PyUnicode_IS_ASCII and PyUnicode_DATA test them twice and branch. */
static inline __attribute__((always_inline)) const uint8_t *ascii_data(PyObject *s)
{
    return PyUnicode_IS_COMPACT_ASCII(s) ? (const uint8_t *)((PyASCIIObject *)s + 1) : NULL;
}

/* Copy the n bytes `d` (an ASCII str's) to `p` and answer the classes of its bytes below
 * '!', looked at one by one only when a word of them (a short str's two overlapping
 * 4-byte words, or its first, middle and last bytes) holds one. */
static inline __attribute__((always_inline)) unsigned copy_ascii(uint8_t *p, const uint8_t *d, size_t n)
{
    uint64_t low = 0, w;
    if (n >= 8) {
        for (size_t i = 0; i < n; i += 8) {
            size_t at = i + 8 <= n ? i : n - 8; /* the last word overlaps its predecessor */
            memcpy(&w, d + at, 8);
            memcpy(p + at, &w, 8);
            low |= LOW(w);
        }
    } else if (n >= 4) {
        uint32_t head, tail;
        memcpy(&head, d, 4);
        memcpy(&tail, d + n - 4, 4);
        memcpy(p, &head, 4);
        memcpy(p + n - 4, &tail, 4);
        low = LOW32(head) | LOW32(tail);
    } else if (n > 0) {
        uint8_t first = d[0], mid = d[n / 2], last = d[n - 1];
        p[0] = first;
        p[n / 2] = mid;
        p[n - 1] = last;
        low = (first < 33) | (mid < 33) | (last < 33);
    }
    if (__builtin_expect(!low, 1))
        return 0;
    unsigned found = 0;
    for (size_t i = 0; i < n; i++)
        found |= d[i] < 33 ? low_class[d[i]] : 0;
    return found;
}

/* Append the ASCII characters kd (kn of them) 0x01 vd (vn) 0x02: 0, or 1 when either is
 * empty or holds a separator (what was appended is then the caller's to drop), -1 an
 * error. */
static inline __attribute__((always_inline)) int add_ascii(struct mqs_arena *a, const uint8_t *kd,
                                                         size_t kn, const uint8_t *vd, size_t vn)
{
    if (mqs_arena_room(a, kn + vn + 2) < 0)
        return -1;
    uint8_t *p = a->buf + a->len;
    unsigned found = copy_ascii(p, kd, kn) | copy_ascii(p + kn + 1, vd, vn);
    p[kn] = 0x01;
    p[kn + 1 + vn] = 0x02;
    a->len += kn + vn + 2;
    return kn == 0 || vn == 0 || (found & SEPARATOR);
}

/* The caller's properties (an exact dict) in one pass over its items, which checks their
 * types (MQS_FIELDS_TYPES: a name or value not a str) and, while every name and value is
 * an exact ASCII str and nothing is to be refused, appends them: 1 appended, 0
 * when the checked pass must run (nothing appended), -1 an error. `tags`, `keys`: given
 * (a name TAGS or KEYS is then refused: set twice). */
static inline __attribute__((always_inline)) int props_ascii(struct mqs_arena *a, PyObject *props, int tags, int keys,
                                                           int *uniq_named)
{
    Py_ssize_t pos = 0, left = PyDict_GET_SIZE(props); /* no call past the last item */
    size_t start = a->len;
    PyObject *k, *v;
    int fast = 1, rc, uniq = 0;
    while (left-- > 0 && PyDict_Next(props, &pos, &k, &v)) {
        if (!PyUnicode_Check(k) || !PyUnicode_Check(v))
            return MQS_FIELDS_TYPES;
        if (!fast)
            continue;
        /* NULL for a str subclass too (never compact): the checked pass takes those */
        const uint8_t *kd = ascii_data(k), *vd = ascii_data(v);
        size_t kn = (size_t)PyUnicode_GET_LENGTH(k);
        if (!kd || !vd ||
            (kn == 4 && ((tags && !memcmp(kd, "TAGS", 4)) || (keys && !memcmp(kd, "KEYS", 4))))) {
            fast = 0;
            continue;
        }
        uniq |= kn == 8 && !memcmp(kd, "UNIQ_KEY", 8);
        if ((rc = add_ascii(a, kd, kn, vd, (size_t)PyUnicode_GET_LENGTH(v))) < 0)
            return -1;
        fast = rc == 0;
    }
    *uniq_named |= uniq;
    if (!fast)
        a->len = start;
    return fast;
}

/* TAGS and KEYS after the caller's properties, as props_ascii writes those: 1 appended,
 * 0 when the checked pass must run (what was appended is the caller's to drop), -1 an
 * error. */
static int tags_keys_ascii(struct mqs_arena *a, PyObject *tags, PyObject *keys)
{
    int rc = 0;
    const uint8_t *d;
    if (tags && (!(d = ascii_data(tags)) ||
                 (rc = add_ascii(a, (const uint8_t *)"TAGS", 4, d,
                                 (size_t)PyUnicode_GET_LENGTH(tags))) != 0))
        return rc < 0 ? -1 : 0;
    if (keys && PyUnicode_Check(keys)) {
        if (!(d = ascii_data(keys)) ||
            (rc = add_ascii(a, (const uint8_t *)"KEYS", 4, d, (size_t)PyUnicode_GET_LENGTH(keys))) != 0)
            return rc < 0 ? -1 : 0;
    } else if (keys) { /* a list or tuple of str: joined with spaces */
        PyObject **kv = PySequence_Fast_ITEMS(keys);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
        if (n == 0)
            return 0;
        if (mqs_arena_room(a, 5) < 0)
            return -1;
        memcpy(a->buf + a->len, "KEYS\x01", 5);
        a->len += 5;
        for (Py_ssize_t i = 0; i < n; i++) {
            size_t len = (size_t)PyUnicode_GET_LENGTH(kv[i]), at = a->len;
            if (!(d = ascii_data(kv[i])) || len == 0)
                return 0;
            if (mqs_arena_room(a, len + 1) < 0)
                return -1;
            uint8_t *p = a->buf + at;
            if (copy_ascii(p, d, len))
                return 0; /* whitespace or a separator in a key */
            p[len] = i + 1 < n ? ' ' : 0x02;
            a->len = at + len + 1;
        }
    }
    return 1;
}

/* ---- step 1: types ------------------------------------------------------------------ */

/* A field given: not absent (NULL) and not None; else NULL. */
static inline PyObject *given(PyObject *o)
{
    return o == Py_None ? NULL : o;
}

static int str_items(PyObject *seq)
{
    PyObject **v = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0, n = PySequence_Fast_GET_SIZE(seq); i < n; i++)
        if (!PyUnicode_Check(v[i]))
            return 0;
    return 1;
}

/* The types the C put reads: the rest is the client's (a TypeError, or plain types).
 * `a`: a put's arena, which its properties are written to in the pass that checks them
 * (props_ascii); NULL (a batch's message) checks them only. */
static int types(struct mqs_fields *m, struct mqs_arena *a)
{
    PyObject **f = m->f, *o, *tags = given(f[MQS_F_TAGS]), *keys = given(f[MQS_F_KEYS]);
    if (f[MQS_F_TOPIC] && !PyUnicode_Check(f[MQS_F_TOPIC]))
        return MQS_FIELDS_TYPES;
    if ((o = f[MQS_F_BODY]) != NULL && !PyBytes_Check(o)) {
        if (!PyByteArray_Check(o) && !PyMemoryView_Check(o))
            return MQS_FIELDS_TYPES;
        if (PyObject_GetBuffer(o, &m->body, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* not contiguous: the client passes bytes(body) */
            return MQS_FIELDS_TYPES;
        }
    }
    if (tags && !PyUnicode_Check(tags))
        return MQS_FIELDS_TYPES;
    if (keys && !PyUnicode_Check(keys) &&
        !((PyList_Check(keys) || PyTuple_Check(keys)) && str_items(keys)))
        return MQS_FIELDS_TYPES;
    if ((o = given(f[MQS_F_PROPS])) != NULL) {
        if (!PyDict_CheckExact(o))
            return MQS_FIELDS_TYPES;
        if (a != NULL) {
            m->props_off = a->len;
            int rc = props_ascii(a, o, tags != NULL, keys != NULL, &m->uniq_named);
            if (rc < 0)
                return rc == MQS_FIELDS_TYPES ? rc : MQS_FIELDS_ERROR;
            m->props_done = 1 + rc;
        } else {
            Py_ssize_t pos = 0, left = PyDict_GET_SIZE(o); /* no call past the last item */
            PyObject *k, *v;
            while (left-- > 0 && PyDict_Next(o, &pos, &k, &v))
                if (!PyUnicode_Check(k) || !PyUnicode_Check(v))
                    return MQS_FIELDS_TYPES;
        }
    }
    for (int i = MQS_F_QID; i <= MQS_F_DELAY; i++) /* int or None; a bool is no int here */
        if ((o = given(f[i])) != NULL && (!PyLong_Check(o) || PyBool_Check(o)))
            return MQS_FIELDS_TYPES;
    return MQS_FIELDS_OK;
}

int mqs_fields_of_args(struct mqs_fields *m, PyObject *const *args, PyObject *delay,
                       struct mqs_arena *arena)
{
    for (int i = 0; i < MQS_F_DELAY; i++)
        m->f[i] = Py_NewRef(args[i]);
    m->f[MQS_F_DELAY] = delay == zero ? NULL : Py_XNewRef(delay); /* 0 (the small int): none */
    return types(m, arena);
}

/* A dict's fields: in one pass over its items when its keys are the interned names
 * themselves (a literal's are), else a lookup per name. */
static int dict_fields(struct mqs_fields *m, PyObject *d)
{
    Py_ssize_t pos = 0, found = 0;
    PyObject *k, *v;
    int fast = 1;
    while (fast && PyDict_Next(d, &pos, &k, &v)) {
        int i = 0;
        while (i < MQS_FIELDS && k != names[i])
            i++;
        if (i == MQS_FIELDS)
            fast = 0;
        else
            m->f[i] = Py_NewRef(v);
    }
    if (!fast) {
        for (int i = 0; i < MQS_FIELDS; i++) {
            Py_CLEAR(m->f[i]);
            v = PyDict_GetItemWithError(d, names[i]);
            if (v == NULL && PyErr_Occurred())
                return MQS_FIELDS_ERROR;
            found += v != NULL;
            m->f[i] = Py_XNewRef(v);
        }
        if (found != PyDict_GET_SIZE(d))
            m->unknown = Py_NewRef(d);
    }
    m->missing = m->f[MQS_F_TOPIC] == NULL ? 1 : m->f[MQS_F_BODY] == NULL ? 2 : 0;
    return types(m, NULL);
}

int mqs_fields_of_item(struct mqs_fields *m, PyObject *item, Py_ssize_t i,
                       PyObject *message_type, PyObject *message_fields)
{
    if (PyDict_CheckExact(item))
        return dict_fields(m, item);
    if (!PyObject_TypeCheck(item, (PyTypeObject *)message_type))
        return MQS_FIELDS_TYPES;
    for (int k = 0; k < MQS_FIELDS; k++)
        if (message_attrs[k] && (m->f[k] = PyObject_GetAttrString(item, message_attrs[k])) == NULL)
            return MQS_FIELDS_ERROR;
    int rc = types(m, NULL);
    if (rc != MQS_FIELDS_OK)
        return rc;
    if (m->f[MQS_F_QID] == Py_None) /* Message.queue_id is an int */
        return MQS_FIELDS_TYPES;
    m->message = PyObject_CallFunction(message_fields, "nO", i, item);
    return m->message ? MQS_FIELDS_OK : MQS_FIELDS_ERROR;
}

/* ---- step 2: content ------------------------------------------------------------------ */

int mqs_fields_refuse(struct mqs_refusal *why, int status, PyObject *reason)
{
    if (reason == NULL)
        return MQS_FIELDS_ERROR;
    why->status = status;
    why->reason = reason;
    return MQS_FIELDS_REFUSED;
}

/* engine.names.topic_problem: RocketMQ's ^[%|a-zA-Z0-9_-]+$, at most 127 characters. */
static PyObject *topic_problem(PyObject *t)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(t);
    if (n == 0)
        return PyUnicode_FromString("topic name is empty");
    if (n > TOPIC_MAX_CHARS)
        return PyUnicode_FromFormat("topic name is %zd characters; at most %d are allowed", n,
                                    TOPIC_MAX_CHARS);
    int kind = PyUnicode_KIND(t);
    const void *data = PyUnicode_DATA(t);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '%' || ch == '|' || ch == '_' || ch == '-'))
            return PyUnicode_FromFormat("topic name %R is not allowed: %s", t, TOPIC_RULE);
    }
    return Py_NewRef(Py_None);
}

static int has_separator(PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    return PyUnicode_FindChar(s, 1, 0, n, 1) >= 0 || PyUnicode_FindChar(s, 2, 0, n, 1) >= 0;
}

/* engine.record.properties_problem for one property: None when it can be stored. */
static PyObject *property_problem(PyObject *k, PyObject *v)
{
    if (PyUnicode_GET_LENGTH(k) == 0)
        return PyUnicode_FromString("a property name is empty");
    if (PyUnicode_GET_LENGTH(v) == 0)
        return PyUnicode_FromFormat(
            "property %R has an empty value (RocketMQ's decoder would drop it)", k);
    if (has_separator(k) || has_separator(v))
        return PyUnicode_FromFormat("property %R contains a separator character (0x01 or 0x02)",
                                    k);
    return Py_NewRef(Py_None);
}

/* A list of keys: each non-empty and without whitespace, RocketMQ's KEYS separator (a
 * key with a space would be indexed as two); then the KEYS property they make, as
 * property_problem would find it in their join. None when they can be joined. */
static PyObject *keys_problem(PyObject *keys)
{
    PyObject **v = PySequence_Fast_ITEMS(keys);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    if (n == 0)
        return property_problem(name_keys, empty);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(v[i]);
        if (n == 0)
            return PyUnicode_FromFormat("keys[%zd] is empty", i);
        int kind = PyUnicode_KIND(v[i]);
        const void *data = PyUnicode_DATA(v[i]);
        for (Py_ssize_t j = 0; j < n; j++)
            if (Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, j)))
                return PyUnicode_FromFormat(
                    "keys[%zd] %R contains whitespace, which separates keys in RocketMQ's KEYS "
                    "property: pass each key as its own item",
                    i, v[i]);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (has_separator(v[i]))
            return property_problem(name_keys, v[i]);
    return Py_NewRef(Py_None);
}

/* A problem found (refused MESSAGE_ILLEGAL, reason set), none (0), or an error (-1). */
static int found(PyObject *why_o, struct mqs_refusal *why)
{
    if (why_o == NULL)
        return MQS_FIELDS_ERROR;
    if (why_o == Py_None) {
        Py_DECREF(why_o);
        return MQS_FIELDS_OK;
    }
    return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL, why_o);
}

int mqs_arena_grow(struct mqs_arena *a, size_t n)
{
    size_t cap = a->cap * 2;
    while (cap < a->len + n)
        cap *= 2;
    uint8_t *b = a->buf == a->local ? PyMem_Malloc(cap) : PyMem_Realloc(a->buf, cap);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (a->buf == a->local)
        memcpy(b, a->local, a->len);
    a->buf = b;
    a->cap = cap;
    return 0;
}

void mqs_arena_free(struct mqs_arena *a)
{
    if (a->buf != a->local)
        PyMem_Free(a->buf);
    MQS_ARENA_INIT(*a);
}

/* A str with no UTF-8 form (a lone surrogate): refused as the reference refuses it. */
static int not_utf8(struct mqs_refusal *why)
{
    if (!PyErr_ExceptionMatches(PyExc_UnicodeError))
        return MQS_FIELDS_ERROR;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *reason = PyUnicode_FromFormat("bad message: %S", value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL, reason);
}

/* Append `name` 0x01 `value` 0x02 (engine.record.encode_properties). */
static int add_property(struct mqs_arena *a, PyObject *k, PyObject *v, struct mqs_refusal *why)
{
    Py_ssize_t kn, vn;
    const char *kb = PyUnicode_AsUTF8AndSize(k, &kn);
    const char *vb = kb ? PyUnicode_AsUTF8AndSize(v, &vn) : NULL;
    if (vb == NULL)
        return not_utf8(why);
    if (mqs_arena_room(a, (size_t)(kn + vn + 2)) < 0)
        return MQS_FIELDS_ERROR;
    uint8_t *p = a->buf + a->len;
    memcpy(p, kb, (size_t)kn);
    p[kn] = 0x01;
    memcpy(p + kn + 1, vb, (size_t)vn);
    p[kn + 1 + vn] = 0x02;
    a->len += (size_t)(kn + vn + 2);
    return MQS_FIELDS_OK;
}

/* Append KEYS 0x01 the keys joined with spaces 0x02, without making the joined str
 * (but for the reason of a key with no UTF-8 form, which names its place in the join). */
static int add_keys(struct mqs_arena *a, PyObject *keys, struct mqs_refusal *why)
{
    size_t start = a->len;
    PyObject **v = PySequence_Fast_ITEMS(keys);
    if (mqs_arena_room(a, 5) < 0)
        return MQS_FIELDS_ERROR;
    memcpy(a->buf + a->len, "KEYS\x01", 5);
    a->len += 5;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(keys); i++) {
        Py_ssize_t n;
        const char *b = PyUnicode_AsUTF8AndSize(v[i], &n);
        if (b == NULL) {
            a->len = start;
            PyObject *joined = PyErr_ExceptionMatches(PyExc_UnicodeError)
                                   ? (PyErr_Clear(), PyUnicode_Join(space, keys))
                                   : NULL;
            int rc = joined ? add_property(a, name_keys, joined, why) : MQS_FIELDS_ERROR;
            Py_XDECREF(joined);
            return rc;
        }
        if (mqs_arena_room(a, (size_t)n + 1) < 0)
            return MQS_FIELDS_ERROR;
        memcpy(a->buf + a->len, b, (size_t)n);
        a->buf[a->len + (size_t)n] = i + 1 < PySequence_Fast_GET_SIZE(keys) ? ' ' : 0x02;
        a->len += (size_t)n + 1;
    }
    return MQS_FIELDS_OK;
}

/* The properties, checked then encoded in the order the record holds them: the
 * caller's, TAGS, KEYS (a list joined with spaces); in one pass when they are ASCII and
 * fine (props_ascii, which a put ran in step 1, then tags_keys_ascii), else each problem
 * named as the reference names it. */
static int properties(struct mqs_fields *m, struct mqs_arena *a, struct mqs_refusal *why)
{
    PyObject *props = given(m->f[MQS_F_PROPS]), *tags = given(m->f[MQS_F_TAGS]);
    PyObject *keys = given(m->f[MQS_F_KEYS]);
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    int rc = 1;
    if (m->props_done) { /* a put's: its step 1 wrote them at props_off */
        rc = m->props_done - 1;
    } else {
        m->props_off = a->len;
        if (props)
            rc = props_ascii(a, props, tags != NULL, keys != NULL, &m->uniq_named);
    }
    if (rc == 1)
        rc = tags_keys_ascii(a, tags, keys);
    if (rc == MQS_FIELDS_TYPES) /* step 1 saw str only: the client's code changed them */
        PyErr_SetString(PyExc_TypeError, "properties changed during the put");
    if (rc < 0)
        return MQS_FIELDS_ERROR;
    m->no_uniq = rc == 1 && !m->uniq_named;
    if (rc == 0) {
        a->len = m->props_off;
        rc = MQS_FIELDS_OK;
        if (props && (tags || keys)) { /* one value per property, never one dropped */
            int twice_tags = tags ? PyDict_Contains(props, name_tags) : 0;
            int twice_keys = keys ? PyDict_Contains(props, name_keys) : 0;
            if (twice_tags < 0 || twice_keys < 0)
                return MQS_FIELDS_ERROR;
            if (twice_tags || twice_keys)
                return mqs_fields_refuse(
                    why, MQS_ST_MESSAGE_ILLEGAL,
                    PyUnicode_FromFormat("%s= and properties[%R] both set the %U property: "
                                         "give it once",
                                         twice_tags ? "tags" : "keys",
                                         twice_tags ? name_tags : name_keys,
                                         twice_tags ? name_tags : name_keys));
        }
        while (props && PyDict_Next(props, &pos, &k, &v))
            if ((rc = found(property_problem(k, v), why)) != MQS_FIELDS_OK)
                return rc;
        if (tags && (rc = found(property_problem(name_tags, tags), why)) != MQS_FIELDS_OK)
            return rc;
        if (keys && (rc = found(PyUnicode_Check(keys) ? property_problem(name_keys, keys)
                                                       : keys_problem(keys),
                                why)) != MQS_FIELDS_OK)
            return rc;
        pos = 0;
        while (rc == MQS_FIELDS_OK && props && PyDict_Next(props, &pos, &k, &v))
            rc = add_property(a, k, v, why);
        if (rc == MQS_FIELDS_OK && tags)
            rc = add_property(a, name_tags, tags, why);
        if (rc == MQS_FIELDS_OK && keys)
            rc = PyUnicode_Check(keys) ? add_property(a, name_keys, keys, why)
                                       : add_keys(a, keys, why);
    } else {
        rc = MQS_FIELDS_OK;
    }
    if (rc == MQS_FIELDS_OK && a->len - m->props_off > MAX_PROPERTIES)
        rc = mqs_fields_refuse(why, MQS_ST_PROPERTIES_SIZE_EXCEEDED,
                    PyUnicode_FromFormat("properties are %zu UTF-8 bytes; at most %d are allowed",
                                         a->len - m->props_off, MAX_PROPERTIES));
    return rc;
}

/* The topic's lane, made by the client on its first put (`new_lane(topic)`). */
static PyObject *lane_of(PyObject *lanes, PyObject *new_lane, PyObject *topic)
{
    PyObject *lane = PyDict_GetItemWithError(lanes, topic);
    if (lane != NULL)
        Py_INCREF(lane);
    else if (!PyErr_Occurred())
        lane = PyObject_CallOneArg(new_lane, topic);
    if (lane == NULL)
        return NULL;
    PyObject **l = PyList_CheckExact(lane) && PyList_GET_SIZE(lane) == MQS_LANE_FIELDS
                       ? &PyList_GET_ITEM(lane, 0)
                       : NULL;
    if (l == NULL || !PyBytes_CheckExact(l[MQS_LANE_TOPIC]) ||
        !PyLong_CheckExact(l[MQS_LANE_QUEUES]) || !PyLong_CheckExact(l[MQS_LANE_RR_N]) ||
        !PyLong_CheckExact(l[MQS_LANE_RR]) || !PyList_CheckExact(l[MQS_LANE_QSLOTS])) {
        Py_DECREF(lane);
        PyErr_SetString(PyExc_TypeError, "a lane is [bytes, int, int, int, list]");
        return NULL;
    }
    return lane;
}

/* The message goes to queue `qid` of `lane`, whose queue-table row is known or found at
 * its reservation (-1). */
static int to_queue(struct mqs_item *it, PyObject *lane, long long qid)
{
    PyObject *qslots = PyList_GET_ITEM(lane, MQS_LANE_QSLOTS);
    long qs = qid < PyList_GET_SIZE(qslots) ? PyLong_AsLong(PyList_GET_ITEM(qslots, qid)) : -1;
    if (PyErr_Occurred())
        return MQS_FIELDS_ERROR;
    it->msg.queue_id = (int32_t)qid;
    it->qslot = qs < 0 || qs > INT32_MAX ? -1 : (int32_t)qs;
    return MQS_FIELDS_OK;
}

/* The queue id: given, or the lane's round robin (moving its counter), then checked
 * against the topic's queues (put_reference.queue_id_problem). */
static int queue(struct mqs_fields *m, struct mqs_item *it, struct mqs_refusal *why)
{
    PyObject **l = &PyList_GET_ITEM(m->lane, 0), *qid_o = m->f[MQS_F_QID];
    long queues = PyLong_AsLong(l[MQS_LANE_QUEUES]);
    long long qid;
    int overflow = 0;
    if (given(qid_o) == NULL) {
        long n = PyLong_AsLong(l[MQS_LANE_RR_N]);
        long long rr = PyLong_AsLongLong(l[MQS_LANE_RR]);
        if (PyErr_Occurred())
            return MQS_FIELDS_ERROR;
        qid = n > 0 ? rr % n : 0;
        PyObject *next = PyLong_FromLongLong(n > 0 ? (qid + 1) % n : 0); /* a small int */
        if (next == NULL)
            return MQS_FIELDS_ERROR;
        m->rr_before = Py_NewRef(l[MQS_LANE_RR]);
        PyList_SetItem(m->lane, MQS_LANE_RR, next);
        qid_o = NULL;
    } else {
        qid = PyLong_AsLongLongAndOverflow(qid_o, &overflow);
        if (qid == -1 && PyErr_Occurred())
            return MQS_FIELDS_ERROR;
    }
    if (overflow || qid < 0 || qid >= queues) {
        PyObject *shown = qid_o ? Py_NewRef(qid_o) : PyLong_FromLongLong(qid);
        PyObject *reason =
            shown ? PyUnicode_FromFormat("queue id %R is not one of topic %R's %ld queues "
                                         "(0..%ld); `mqstore topic DIR set %S --queues N` "
                                         "changes the count",
                                         shown, m->f[MQS_F_TOPIC], queues, queues - 1,
                                         m->f[MQS_F_TOPIC])
                  : NULL;
        Py_XDECREF(shown);
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL, reason);
    }
    return to_queue(it, m->lane, qid);
}

/* "unknown fields [...]": the dict's keys that are not put's fields, sorted. */
static PyObject *unknown_fields(PyObject *d)
{
    PyObject *out = PyList_New(0), *k, *v;
    Py_ssize_t pos = 0;
    while (out && PyDict_Next(d, &pos, &k, &v)) {
        int known = 0;
        for (int i = 0; i < MQS_FIELDS && !known; i++) {
            int eq = PyObject_RichCompareBool(k, names[i], Py_EQ);
            if (eq < 0)
                Py_CLEAR(out);
            known = eq > 0;
        }
        if (out && !known && PyList_Append(out, k) < 0)
            Py_CLEAR(out);
    }
    if (out == NULL || PyList_Sort(out) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    PyObject *reason = PyUnicode_FromFormat("unknown fields %R", out);
    Py_DECREF(out);
    return reason;
}

/* A Message's other fields, as the client read them: 0, or a refusal. */
static int message_fields(struct mqs_fields *m, struct mqs_message *msg, int *takes_offset,
                          struct mqs_refusal *why)
{
    PyObject *t = m->message;
    if (PyUnicode_Check(t))
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL, Py_NewRef(t));
    PyObject *addr;
    int32_t port;
    if (!PyArg_ParseTuple(t, "SiiiiLL:message_fields", &addr, &port, &msg->sys_flag, &msg->flag,
                          &msg->reconsume_times, &msg->prepared_offset, &msg->born_timestamp))
        return MQS_FIELDS_ERROR;
    /* the record takes 4 or 16 bytes of it (mqs_record.c: host): no other length is read */
    Py_ssize_t addr_len = PyBytes_GET_SIZE(addr);
    if (addr_len != 4 && addr_len != 16) {
        PyErr_Format(PyExc_ValueError,
                     "message_fields: the born address must be 4 (IPv4) or 16 (IPv6) bytes, "
                     "not %zd",
                     addr_len);
        return MQS_FIELDS_ERROR;
    }
    msg->born.addr = (const uint8_t *)PyBytes_AS_STRING(addr);
    msg->born.addr_len = (int)addr_len;
    msg->born.port = port;
    int tx = msg->sys_flag & 0xC;
    *takes_offset = tx == 0 || tx == 0x8;
    return MQS_FIELDS_OK;
}

/* ---- delayed messages (issue 25) --------------------------------------------------------- */

/* RocketMQ's CommitLog delay rewrite (spec 1.12) of a message with delay_level > 0, after
 * its real queue was chosen: the level clamped to `max_delay`; DELAY, REAL_TOPIC and
 * REAL_QID appended to its properties (after the caller's, TAGS and KEYS); the record
 * goes to SCHEDULE_TOPIC_XXXX queue level - 1. Level 0 is no delay; a negative level, or
 * one of those three properties also given in `properties`, is refused. The Python
 * reference is tests/native/put_reference.py (`delay_reference`). */
static int delay_rewrite(struct mqs_fields *m, struct mqs_item *it, struct mqs_arena *a,
                         struct mqs_refusal *why, const struct mqs_client *c)
{
    static const char *const owned[3] = {"DELAY", "REAL_TOPIC", "REAL_QID"};
    PyObject *o = m->f[MQS_F_DELAY], *props = m->f[MQS_F_PROPS];
    int overflow = 0;
    long long level = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (level == -1 && PyErr_Occurred())
        return MQS_FIELDS_ERROR;
    if (overflow < 0 || (!overflow && level < 0))
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL,
                      PyUnicode_FromFormat("delay_level %R is negative: 0 (no delay) or a "
                                           "level 1..%d of messageDelayLevel",
                                           o, c->max_delay));
    if ((level == 0 && !overflow) || (it->msg.sys_flag & 0xC) == 0x4 || (it->msg.sys_flag & 0xC) == 0xC)
        return MQS_FIELDS_OK; /* RocketMQ delays neither a prepared nor a rolled-back message */
    if (c->max_delay < 1)
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL,
                      PyUnicode_FromString("delay_level given but messageDelayLevel has no levels"));
    if (overflow || level > c->max_delay)
        level = c->max_delay;
    for (int i = 0; given(props) && i < 3; i++) {
        PyObject *k = PyUnicode_FromString(owned[i]);
        int twice = k ? PyDict_Contains(props, k) : -1;
        Py_XDECREF(k);
        if (twice < 0)
            return MQS_FIELDS_ERROR;
        if (twice)
            return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL,
                          PyUnicode_FromFormat("delay_level= and properties['%s'] both given: "
                                               "the store sets %s for a delayed message",
                                               owned[i], owned[i]));
    }
    const char *topic = PyUnicode_AsUTF8(m->f[MQS_F_TOPIC]); /* checked: <= 127 ASCII */
    char three[192];
    int n = topic ? snprintf(three, sizeof three, "DELAY\x01%lld\x02REAL_TOPIC\x01%s\x02REAL_QID\x01%d\x02",
                             level, topic, (int)it->msg.queue_id)
                  : -1;
    if (n < 0 || mqs_arena_room(a, (size_t)n) < 0)
        return MQS_FIELDS_ERROR;
    memcpy(a->buf + a->len, three, (size_t)n);
    a->len += (size_t)n;
    if (a->len - m->props_off > MAX_PROPERTIES)
        return mqs_fields_refuse(why, MQS_ST_PROPERTIES_SIZE_EXCEEDED,
                      PyUnicode_FromFormat("properties are %zu UTF-8 bytes with the delay's "
                                           "DELAY, REAL_TOPIC and REAL_QID; at most %d are allowed",
                                           a->len - m->props_off, MAX_PROPERTIES));
    PyObject *name = PyUnicode_FromString("SCHEDULE_TOPIC_XXXX");
    PyObject *lane = name ? lane_of(c->lanes, c->new_lane, name) : NULL;
    Py_XDECREF(name);
    if (lane == NULL)
        return MQS_FIELDS_ERROR;
    m->real_lane = m->lane;
    m->lane = lane;
    PyObject **l = &PyList_GET_ITEM(lane, 0);
    long queues = PyLong_AsLong(l[MQS_LANE_QUEUES]), qid = (long)level - 1;
    if (PyErr_Occurred())
        return MQS_FIELDS_ERROR;
    if (qid >= queues)
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL,
                      PyUnicode_FromFormat("delay level %lld needs queue %ld of "
                                           "SCHEDULE_TOPIC_XXXX, which has %ld queues",
                                           level, qid, queues));
    return to_queue(it, lane, qid);
}

int mqs_fields_check(struct mqs_fields *m, struct mqs_item *it, struct mqs_arena *arena,
                     struct mqs_refusal *why, const struct mqs_client *c, int64_t seg_size,
                     int64_t born)
{
    static const uint8_t loopback[4] = {127, 0, 0, 1};
    struct mqs_message *msg = &it->msg;
    memset(it, 0, sizeof *it);
    msg->born.addr = loopback;
    msg->born.addr_len = 4;
    msg->store = c->store;
    it->takes_offset = 1;
    int rc;
    if (m->missing)
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL,
                      PyUnicode_FromFormat("missing field '%s'", m->missing == 1 ? "topic" : "body"));
    if (m->message && (rc = message_fields(m, msg, &it->takes_offset, why)) != MQS_FIELDS_OK)
        return rc;
    PyObject *topic = m->f[MQS_F_TOPIC];
    if ((rc = found(topic_problem(topic), why)) != MQS_FIELDS_OK ||
        (rc = properties(m, arena, why)) != MQS_FIELDS_OK)
        return rc;
    if (m->body.obj) {
        msg->body = m->body.buf;
        msg->body_len = (size_t)m->body.len;
    } else {
        msg->body = (const uint8_t *)PyBytes_AS_STRING(m->f[MQS_F_BODY]);
        msg->body_len = (size_t)PyBytes_GET_SIZE(m->f[MQS_F_BODY]);
    }
    if ((int64_t)msg->body_len > c->max_body)
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL,
                      PyUnicode_FromFormat("body is %zu bytes; maxMessageSize is %lld",
                                           msg->body_len, (long long)c->max_body));
    if ((m->lane = lane_of(c->lanes, c->new_lane, topic)) == NULL)
        return MQS_FIELDS_ERROR;
    if ((rc = queue(m, it, why)) != MQS_FIELDS_OK)
        return rc;
    if (given(m->f[MQS_F_DELAY]) && (rc = delay_rewrite(m, it, arena, why, c)) != MQS_FIELDS_OK)
        return rc;
    PyObject *topic_b = PyList_GET_ITEM(m->lane, MQS_LANE_TOPIC);
    msg->topic = (const uint8_t *)PyBytes_AS_STRING(topic_b);
    msg->topic_len = (size_t)PyBytes_GET_SIZE(topic_b);
    msg->props_len = arena->len - m->props_off; /* msg->props: once the arena is done */
    if (!msg->born_timestamp)
        msg->born_timestamp = born;
    it->size = (int64_t)mqs_record_length(msg);
    if (it->size + MQS_END_FILE_MIN_BLANK > seg_size)
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL,
                      PyUnicode_FromFormat("record of %lld bytes does not fit a %lld-byte segment",
                                           (long long)it->size, (long long)seg_size));
    if (m->unknown)
        return mqs_fields_refuse(why, MQS_ST_MESSAGE_ILLEGAL, unknown_fields(m->unknown));
    return MQS_FIELDS_OK;
}

void mqs_fields_undo(struct mqs_fields *m)
{
    PyObject *lane = m->real_lane ? m->real_lane : m->lane;
    if (m->rr_before && lane)
        PyList_SetItem(lane, MQS_LANE_RR, Py_NewRef(m->rr_before));
    Py_CLEAR(m->rr_before);
}

void mqs_fields_release(struct mqs_fields *m)
{
    for (int i = 0; i < MQS_FIELDS; i++)
        Py_CLEAR(m->f[i]);
    Py_CLEAR(m->lane);
    Py_CLEAR(m->real_lane);
    Py_CLEAR(m->rr_before);
    Py_CLEAR(m->message);
    Py_CLEAR(m->unknown);
    if (m->body.obj)
        PyBuffer_Release(&m->body);
}
