/* The Python door of a pull's walk: arguments checked here, the units walked by
 * mqs_pull_next, and each record taken built into an engine.record message object, its
 * slots filled from C (what engine.record.decode would give for it, field by field).
 * Holds the GIL throughout: a pull walks tens of units and builds Python objects. */
#include "mqs_pull_py.h"

#include <string.h>
#include <structmember.h>

#include "mqs_args.h"
#include "mqs_pull.h"

/* engine.record.RecordFields' fields, in its order. */
enum {
    F_PHYSICAL_OFFSET, F_SIZE, F_MAGIC, F_BODY_CRC, F_CRC_OK, F_QUEUE_ID, F_FLAG,
    F_QUEUE_OFFSET, F_SYS_FLAG, F_BORN_TIMESTAMP, F_BORN_HOST, F_STORE_TIMESTAMP,
    F_STORE_HOST, F_RECONSUME_TIMES, F_PREPARED_OFFSET, F_TOPIC, F_BODY, F_PROPERTIES,
    F_TAGS, F_KEYS, F_MSG_ID, NFIELDS
};

static const char *const FIELD_NAMES[NFIELDS] = {
    "physical_offset", "size", "magic", "body_crc", "crc_ok", "queue_id", "flag",
    "queue_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
    "store_host", "reconsume_times", "prepared_transaction_offset", "topic", "body",
    "properties", "tags", "keys", "msg_id",
};

/* Property names interned once: the common ones are not re-made per message. */
static const char *const COMMON_NAMES[] = {
    "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "MSG_REGION", "TRACE_ON", "CLUSTER",
};
#define NCOMMON ((int)(sizeof COMMON_NAMES / sizeof COMMON_NAMES[0]))

#define MQS_COMPRESSED 0x1 /* sysFlag: the body is compressed (engine.record.SysFlag) */

/* The roles of a lazy message's slots (pull_register_lazy), in the order it names them. */
enum { L_RAW, L_BODY, L_QUEUE_OFFSET, L_OWNER, L_TAG, L_DONE, L_CACHE, NLAZY };

/* What pull_register and pull_register_lazy set; touched only with the GIL held. */
static struct {
    PyTypeObject *cls[2]; /* [0] copies the body (DecodedRecord), [1] views it (RecordView) */
    Py_ssize_t off[2][NFIELDS];
    PyObject *format_host;
    PyObject *common[NCOMMON];
    PyTypeObject *lazy; /* a pull `into` an owner builds these */
    Py_ssize_t lazy_off[NLAZY];
} reg;

/* --- registration ------------------------------------------------------------------- */

/* The slot offsets of `cls`'s fields `names[0..n)`: each must be an object slot of a
 * class `cls` is. */
static int slot_offsets_of(PyObject *cls, const char *name, const char *const *names, int n,
                           Py_ssize_t *off)
{
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "%s must be a class, not %.100s", name,
                     Py_TYPE(cls)->tp_name);
        return -1;
    }
    for (int f = 0; f < n; f++) {
        PyObject *d = PyObject_GetAttrString(cls, names[f]);
        if (d == NULL)
            return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type);
        if (ok) {
            PyMemberDescrObject *md = (PyMemberDescrObject *)d;
            ok = md->d_member->type == T_OBJECT_EX &&
                 PyType_IsSubtype((PyTypeObject *)cls, PyDescr_TYPE(md));
            off[f] = md->d_member->offset;
        }
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s must be a slot", name, names[f]);
            return -1;
        }
    }
    return 0;
}

static int slot_offsets(PyObject *cls, const char *name, Py_ssize_t *off)
{
    return slot_offsets_of(cls, name, FIELD_NAMES, NFIELDS, off);
}

PyObject *mqs_py_pull_register(PyObject *Py_UNUSED(module), PyObject *const *args,
                               Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "pull_register takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *fields = args[2];
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != NFIELDS) {
        PyErr_Format(PyExc_ValueError, "fields must be a tuple of the %d record fields",
                     NFIELDS);
        return NULL;
    }
    for (int f = 0; f < NFIELDS; f++) {
        PyObject *got = PyTuple_GET_ITEM(fields, f);
        if (!PyUnicode_Check(got) || PyUnicode_CompareWithASCIIString(got, FIELD_NAMES[f])) {
            PyErr_Format(PyExc_ValueError, "fields[%d] must be %s, as the C builder fills it",
                         f, FIELD_NAMES[f]);
            return NULL;
        }
    }
    if (!PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "format_host must be callable");
        return NULL;
    }
    Py_ssize_t off[2][NFIELDS];
    if (slot_offsets(args[0], "decoded", off[0]) < 0 || slot_offsets(args[1], "view", off[1]) < 0)
        return NULL;
    for (int k = 0; k < NCOMMON; k++) {
        if (reg.common[k] == NULL)
            reg.common[k] = PyUnicode_InternFromString(COMMON_NAMES[k]);
        if (reg.common[k] == NULL)
            return NULL;
    }
    for (int c = 0; c < 2; c++) {
        Py_INCREF(args[c]);
        Py_XSETREF(reg.cls[c], (PyTypeObject *)args[c]);
        memcpy(reg.off[c], off[c], sizeof off[c]);
    }
    Py_INCREF(args[3]);
    Py_XSETREF(reg.format_host, args[3]);
    Py_RETURN_NONE;
}

PyObject *mqs_py_pull_register_lazy(PyObject *Py_UNUSED(module), PyObject *const *args,
                                    Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "pull_register_lazy takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *names = args[1];
    if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != NLAZY) {
        PyErr_Format(PyExc_ValueError,
                     "names must be a tuple of %d slot names (raw, body, queue_offset, owner, "
                     "tag, done, cache)",
                     NLAZY);
        return NULL;
    }
    const char *cnames[NLAZY];
    for (int f = 0; f < NLAZY; f++) {
        PyObject *got = PyTuple_GET_ITEM(names, f);
        cnames[f] = PyUnicode_Check(got) ? PyUnicode_AsUTF8(got) : NULL;
        if (cnames[f] == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "names[%d] must be str", f);
            return NULL;
        }
    }
    Py_ssize_t off[NLAZY];
    if (slot_offsets_of(args[0], "lazy", cnames, NLAZY, off) < 0)
        return NULL;
    Py_INCREF(args[0]);
    Py_XSETREF(reg.lazy, (PyTypeObject *)args[0]);
    memcpy(reg.lazy_off, off, sizeof off);
    Py_RETURN_NONE;
}

/* --- one message ---------------------------------------------------------------------- */

struct host_cache {
    uint8_t raw[20]; /* address and port as stored */
    int n;
    PyObject *str;
};

/* The state of one call: the view bodies slice, and the strings messages share. */
struct builder {
    const uint8_t *log;
    int zero_copy;
    PyObject *view; /* zero_copy: a byte memoryview of `log` */
    struct host_cache hosts[2];
    const uint8_t *topic_p;
    int64_t topic_n;
    PyObject *topic;
    uint8_t id_raw[20];
    int id_n;
};

static void builder_clear(struct builder *b)
{
    Py_CLEAR(b->view);
    Py_CLEAR(b->hosts[0].str);
    Py_CLEAR(b->hosts[1].str);
    Py_CLEAR(b->topic);
}

/* engine.record.format_host of an address of n - 4 bytes and the port after it. */
static PyObject *host_str(struct host_cache *c, const uint8_t *raw, int n)
{
    if (c->str != NULL && c->n == n && memcmp(c->raw, raw, (size_t)n) == 0)
        return Py_NewRef(c->str);
    int32_t port = (int32_t)mqs_rd32(raw + n - 4);
    PyObject *s;
    if (n == 8) {
        char buf[32];
        int len = snprintf(buf, sizeof buf, "%u.%u.%u.%u:%d", raw[0], raw[1], raw[2], raw[3],
                           (int)port);
        s = PyUnicode_DecodeASCII(buf, len, NULL);
    } else {
        s = PyObject_CallFunction(reg.format_host, "y#i", (const char *)raw, (Py_ssize_t)(n - 4),
                                  (int)port);
        if (s != NULL && !PyUnicode_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "format_host must return str");
            Py_CLEAR(s);
        }
    }
    if (s == NULL)
        return NULL;
    memcpy(c->raw, raw, (size_t)n);
    c->n = n;
    Py_XSETREF(c->str, Py_NewRef(s));
    return s;
}

static PyObject *topic_str(struct builder *b, const uint8_t *p, int64_t n)
{
    if (b->topic != NULL && b->topic_n == n && memcmp(b->topic_p, p, (size_t)n) == 0)
        return Py_NewRef(b->topic);
    PyObject *s = mqs_str_utf8(p, (size_t)n);
    if (s == NULL)
        return NULL;
    b->topic_p = p;
    b->topic_n = n;
    Py_XSETREF(b->topic, Py_NewRef(s));
    return s;
}

/* engine.record.make_msg_id: hex of the store host's address and port, then the offset. */
static PyObject *msg_id_str(const uint8_t *store, int n, int64_t physical_offset)
{
    static const char HEX[] = "0123456789ABCDEF";
    PyObject *s = PyUnicode_New(2 * (n + 8), 127);
    if (s == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(s);
    for (int k = 0; k < n; k++) {
        *out++ = (Py_UCS1)HEX[store[k] >> 4];
        *out++ = (Py_UCS1)HEX[store[k] & 0xF];
    }
    uint64_t v = (uint64_t)physical_offset;
    for (int k = 15; k >= 0; k--)
        *out++ = (Py_UCS1)HEX[(v >> (4 * k)) & 0xF];
    return s;
}

static PyObject *name_str(const uint8_t *p, size_t n)
{
    for (int k = 0; k < NCOMMON; k++) {
        if (strlen(COMMON_NAMES[k]) == n && memcmp(COMMON_NAMES[k], p, n) == 0)
            return Py_NewRef(reg.common[k]);
    }
    return mqs_str_utf8(p, (size_t)n);
}

/* engine.record.decode_properties (the pairs it keeps: mqs_props_next); the last pair of
 * a name wins. */
static PyObject *props_dict(const uint8_t *p, int64_t n)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    struct mqs_span name, value;
    for (const uint8_t *end = p + n; mqs_props_next(&p, end, &name, &value);) {
        PyObject *k = name_str(name.p, name.n);
        PyObject *v = k == NULL ? NULL
                                : mqs_str_utf8(value.p, value.n);
        int rc = v == NULL ? -1 : PyDict_SetItem(d, k, v);
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static PyObject *prop_or_none(PyObject *props, int common_index)
{
    PyObject *v = PyDict_GetItemWithError(props, reg.common[common_index]);
    if (v == NULL && PyErr_Occurred())
        return NULL;
    return Py_NewRef(v != NULL ? v : Py_None);
}

/* The message of the record at log[pos] (layout `l`), or NULL with an exception set;
 * `props` (a new reference, or NULL to parse here) becomes its properties. */
static PyObject *build(struct builder *b, int64_t pos, const struct mqs_layout *l, PyObject *props)
{
    const uint8_t *r = b->log + pos;
    int32_t sys_flag = (int32_t)mqs_rd32(r + 36);
    int bh = sys_flag & MQS_BORN_V6 ? 20 : 8;
    int sh = sys_flag & MQS_STORE_V6 ? 20 : 8;
    const uint8_t *store = r + 56 + bh;
    int64_t phys = mqs_rd64(r + 28);
    PyObject *v[NFIELDS] = {0};
    v[F_PROPERTIES] = props != NULL ? props : props_dict(r + l->props_at, l->props_len);
    if (v[F_PROPERTIES] == NULL)
        goto fail;
    v[F_PHYSICAL_OFFSET] = PyLong_FromLongLong(phys);
    v[F_SIZE] = PyLong_FromLongLong(l->total);
    v[F_MAGIC] = PyLong_FromUnsignedLong(mqs_rd32(r + 4));
    v[F_BODY_CRC] = PyLong_FromLong((int32_t)mqs_rd32(r + 8));
    v[F_CRC_OK] = Py_NewRef(Py_True); /* the walk checked it */
    v[F_QUEUE_ID] = PyLong_FromLong((int32_t)mqs_rd32(r + 12));
    v[F_FLAG] = PyLong_FromLong((int32_t)mqs_rd32(r + 16));
    v[F_QUEUE_OFFSET] = PyLong_FromLongLong(mqs_rd64(r + 20));
    v[F_SYS_FLAG] = PyLong_FromLong(sys_flag);
    v[F_BORN_TIMESTAMP] = PyLong_FromLongLong(mqs_rd64(r + 40));
    v[F_BORN_HOST] = host_str(&b->hosts[0], r + 48, bh);
    v[F_STORE_TIMESTAMP] = PyLong_FromLongLong(mqs_rd64(r + 48 + bh));
    v[F_STORE_HOST] = host_str(&b->hosts[1], store, sh);
    v[F_RECONSUME_TIMES] = PyLong_FromLong((int32_t)mqs_rd32(store + sh));
    v[F_PREPARED_OFFSET] = PyLong_FromLongLong(mqs_rd64(store + sh + 4));
    v[F_TOPIC] = topic_str(b, r + l->topic_at, l->topic_len);
    if (b->zero_copy)
        v[F_BODY] = PySequence_GetSlice(b->view, (Py_ssize_t)(pos + l->fixed),
                                        (Py_ssize_t)(pos + l->fixed + l->body_len));
    else
        v[F_BODY] = PyBytes_FromStringAndSize((const char *)r + l->fixed, (Py_ssize_t)l->body_len);
    v[F_TAGS] = prop_or_none(v[F_PROPERTIES], 0);
    v[F_KEYS] = prop_or_none(v[F_PROPERTIES], 1);
    v[F_MSG_ID] = msg_id_str(store, sh, phys);
    for (int f = 0; f < NFIELDS; f++)
        if (v[f] == NULL)
            goto fail;
    PyTypeObject *cls = reg.cls[b->zero_copy];
    PyObject *obj = cls->tp_alloc(cls, 0);
    if (obj == NULL)
        goto fail;
    for (int f = 0; f < NFIELDS; f++) /* the slots take the references */
        *(PyObject **)((char *)obj + reg.off[b->zero_copy][f]) = v[f];
    return obj;
fail:
    for (int f = 0; f < NFIELDS; f++)
        Py_XDECREF(v[f]);
    return NULL;
}

/* The lazy message of the record at log[pos] (layout `l`) for `into` = (owner, tag): its
 * record's bytes, its body (None when compressed: the owner inflates it on demand), its
 * queue offset, owner, tag, done False, cache None. NULL with an exception set. */
static PyObject *build_lazy(struct builder *b, int64_t pos, const struct mqs_layout *l,
                            PyObject *into)
{
    const uint8_t *r = b->log + pos;
    int32_t sys_flag = (int32_t)mqs_rd32(r + 36);
    PyObject *v[NLAZY] = {0};
    v[L_RAW] = PyBytes_FromStringAndSize((const char *)r, (Py_ssize_t)l->total);
    if (sys_flag & MQS_COMPRESSED)
        v[L_BODY] = Py_NewRef(Py_None);
    else
        v[L_BODY] = PyBytes_FromStringAndSize((const char *)r + l->fixed, (Py_ssize_t)l->body_len);
    v[L_QUEUE_OFFSET] = PyLong_FromLongLong(mqs_rd64(r + 20));
    v[L_OWNER] = Py_NewRef(PyTuple_GET_ITEM(into, 0));
    v[L_TAG] = Py_NewRef(PyTuple_GET_ITEM(into, 1));
    v[L_DONE] = Py_NewRef(Py_False);
    v[L_CACHE] = Py_NewRef(Py_None);
    for (int f = 0; f < NLAZY; f++)
        if (v[f] == NULL)
            goto fail;
    PyObject *obj = reg.lazy->tp_alloc(reg.lazy, 0);
    if (obj == NULL)
        goto fail;
    for (int f = 0; f < NLAZY; f++) /* the slots take the references */
        *(PyObject **)((char *)obj + reg.lazy_off[f]) = v[f];
    return obj;
fail:
    for (int f = 0; f < NLAZY; f++)
        Py_XDECREF(v[f]);
    return NULL;
}

/* --- the call --------------------------------------------------------------------------- */

#define NARGS 12 /* and `into`, optional */

/* `codes`: None, or a tuple of ints, copied into *held (PyMem_Free it). */
static int parse_codes(PyObject *o, int64_t **held, struct mqs_pull *p)
{
    p->codes = NULL;
    p->ncodes = 0;
    if (o == Py_None)
        return 0;
    if (!PyTuple_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "codes must be None or a tuple of ints");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(o);
    int64_t *codes = PyMem_Malloc(n > 0 ? (size_t)n * sizeof *codes : 1);
    if (codes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *held = codes;
    for (Py_ssize_t k = 0; k < n; k++)
        if (mqs_arg_i64(PyTuple_GET_ITEM(o, k), "codes[i]", &codes[k]) < 0)
            return -1;
    p->codes = codes;
    p->ncodes = n;
    return 0;
}

static int parse(PyObject *const *args, struct mqs_pull *p, int64_t **codes, int64_t *start)
{
    if (mqs_arg_i64(args[1], "start", start) < 0 ||
        mqs_arg_i64(args[3], "log_base", &p->log_base) < 0 ||
        mqs_arg_i64(args[4], "limit", &p->limit) < 0 || parse_codes(args[5], codes, p) < 0 ||
        mqs_arg_i64(args[7], "max_count", &p->max_count) < 0 ||
        mqs_arg_i64(args[8], "max_bytes", &p->max_bytes) < 0 ||
        mqs_arg_i64(args[9], "got_bytes", &p->got_bytes) < 0)
        return -1;
    if (args[6] != Py_None && !PyAnySet_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "wanted must be None or a set of str");
        return -1;
    }
    if (!PyBool_Check(args[10])) {
        PyErr_SetString(PyExc_TypeError, "zero_copy must be bool");
        return -1;
    }
    if (!PyList_CheckExact(args[11])) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return -1;
    }
    if (p->log_base < 0) {
        PyErr_SetString(PyExc_ValueError, "log_base must not be negative");
        return -1;
    }
    if (p->max_count < 1) {
        PyErr_SetString(PyExc_ValueError, "max_count must be at least 1");
        return -1;
    }
    return 0;
}

/* A byte memoryview of `log` whose slices are the bodies of a zero-copy pull. */
static PyObject *byte_view(PyObject *log)
{
    PyObject *mv = PyMemoryView_Check(log) ? Py_NewRef(log) : PyMemoryView_FromObject(log);
    if (mv == NULL)
        return NULL;
    Py_buffer *b = PyMemoryView_GET_BUFFER(mv);
    if (b->ndim != 1 || b->itemsize != 1 || !PyBuffer_IsContiguous(b, 'C')) {
        Py_DECREF(mv);
        PyErr_SetString(PyExc_TypeError, "log must be a contiguous byte buffer for zero_copy");
        return NULL;
    }
    return mv;
}

/* Take records until the walk ends: 0, or -1 with an exception set. */
static int take(struct mqs_pull *p, struct builder *b, PyObject *wanted, PyObject *out,
                PyObject *into, int *stop)
{
    for (;;) {
        *stop = mqs_pull_next(p);
        if (*stop != MQS_PULL_RECORD)
            return 0;
        PyObject *props = NULL;
        if (wanted != Py_None) { /* the record's TAGS decide */
            props = props_dict(p->log + p->rec_pos + p->lay.props_at, p->lay.props_len);
            if (props == NULL)
                return -1;
            PyObject *tags = PyDict_GetItemWithError(props, reg.common[0]);
            int in = -1;
            if (tags != NULL || !PyErr_Occurred())
                in = PySet_Contains(wanted, tags != NULL ? tags : Py_None);
            if (in <= 0) {
                Py_DECREF(props);
                if (in < 0)
                    return -1;
                continue;
            }
        }
        PyObject *msg;
        if (into != NULL) {
            Py_XDECREF(props);
            msg = build_lazy(b, p->rec_pos, &p->lay, into);
        } else {
            msg = build(b, p->rec_pos, &p->lay, props);
        }
        if (msg == NULL)
            return -1;
        int rc = PyList_Append(out, msg);
        Py_DECREF(msg);
        if (rc < 0)
            return -1;
        p->count++;
        p->got_bytes += p->lay.total;
    }
}

PyObject *mqs_py_pull_units(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != NARGS && nargs != NARGS + 1) {
        PyErr_Format(PyExc_TypeError, "pull_units takes %d or %d arguments (%zd given)", NARGS,
                     NARGS + 1, nargs);
        return NULL;
    }
    if (reg.cls[0] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pull_units before pull_register");
        return NULL;
    }
    PyObject *into = nargs > NARGS && args[NARGS] != Py_None ? args[NARGS] : NULL;
    if (into != NULL) {
        if (!PyTuple_Check(into) || PyTuple_GET_SIZE(into) != 2) {
            PyErr_SetString(PyExc_TypeError, "into must be None or an (owner, tag) tuple");
            return NULL;
        }
        if (args[10] == Py_True) {
            PyErr_SetString(PyExc_ValueError, "a pull into an owner takes zero_copy False");
            return NULL;
        }
        if (reg.lazy == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "a pull into an owner before pull_register_lazy");
            return NULL;
        }
    }
    struct mqs_pull p = {0};
    int64_t *codes = NULL, start;
    if (parse(args, &p, &codes, &start) < 0) {
        PyMem_Free(codes);
        return NULL;
    }
    Py_buffer units, log;
    if (mqs_arg_buffer(args[0], "units", &units) < 0) {
        PyMem_Free(codes);
        return NULL;
    }
    if (mqs_arg_buffer(args[2], "log", &log) < 0) {
        PyBuffer_Release(&units);
        PyMem_Free(codes);
        return NULL;
    }
    PyObject *result = NULL;
    struct builder b = {.log = log.buf, .zero_copy = args[10] == Py_True};
    p.units = units.buf;
    p.nunits = (int64_t)units.len / MQS_CQ_UNIT;
    p.log = log.buf;
    p.log_len = (int64_t)log.len;
    p.count = PyList_GET_SIZE(args[11]);
    p.i = start;
    if (units.len % MQS_CQ_UNIT != 0) {
        PyErr_SetString(PyExc_ValueError, "units must hold whole 20-byte units");
        goto done;
    }
    if (start < 0 || start > p.nunits) {
        PyErr_Format(PyExc_ValueError, "start %lld is not a unit of units", (long long)start);
        goto done;
    }
    if (b.zero_copy && (b.view = byte_view(args[2])) == NULL)
        goto done;
    int stop;
    if (take(&p, &b, args[6], args[11], into, &stop) == 0)
        result = Py_BuildValue("LiLO", (long long)p.i, stop, (long long)p.got_bytes,
                               p.removing ? Py_True : Py_False);
done:
    builder_clear(&b);
    PyBuffer_Release(&log);
    PyBuffer_Release(&units);
    PyMem_Free(codes);
    return result;
}
