/* RocketMQ's IndexFile.putKey (spec §4.3) over a batch, the twin of
 * engine.indexfile.put_hashes: the layout table is in engine/indexfile.py.
 *
 * The keys are the scanner's columns (engine.scan): record r's key hashes are
 * key_hash[key_first[r]:key_first[r + 1]], its commit-log offset base + pos[r], its store
 * time store_timestamp[r]. Keys from key_from up to key_first[rec_to] go in, record by
 * record, until the file is full; the next key not put is returned. */
#include "mqs_index.h"

#include <stdint.h>
#include <string.h>

#include "mqs_args.h"
#include "mqs_be.h"

#define HEADER_SIZE 40
#define ENTRY_SIZE 20
#define INDEX_PREFETCH 8 /* keys ahead whose slot is asked for */

/* A store of a field a lookup in another process may be loading (a slot head, a header
 * field): mqs_publish, one whole released store. A buffer that is not 8-aligned is no
 * mapping (those are page-aligned), nobody else loads it: a plain store. */
static inline void pub32(int shared, uint8_t *p, uint32_t v)
{
    if (shared)
        mqs_publish32(p, v);
    else
        mqs_wr32(p, v);
}

static inline void pub64(int shared, uint8_t *p, uint64_t v)
{
    if (shared)
        mqs_publish64(p, v);
    else
        mqs_wr64(p, v);
}

/* One key; 0 put, 1 the file is full, -1 bad input (message in *err). */
static int put_one(const struct mqs_index_batch *b, int32_t h, int64_t phy, int64_t ts,
                   const char **err)
{
    uint8_t *f = b->file;
    int64_t begin_ts = mqs_rd64(f);
    int32_t slot_count = (int32_t)mqs_rd32(f + 32), count = (int32_t)mqs_rd32(f + 36);
    if (count >= b->entries)
        return 1;
    if (h < 0) {
        *err = "key_hash holds a negative hash";
        return -1;
    }
    if (count < 0) {
        *err = "the index file's index_count is negative";
        return -1;
    }
    uint8_t *slot = f + HEADER_SIZE + (h % b->slots) * 4;
    int32_t slot_value = (int32_t)mqs_rd32(slot);
    if (slot_value <= 0 || slot_value > count)
        slot_value = 0;
    if (slot_value == 0 && slot_count == INT32_MAX) {
        *err = "the index file's hash_slot_count is at its maximum";
        return -1;
    }
    int32_t diff = 0;
    if (begin_ts > 0) {
        /* (ts - begin_ts) / 1000, truncated toward zero as Java's long division; in 64
         * bits unless a hostile time makes the difference overflow them */
        int64_t d64;
        __int128 d = __builtin_sub_overflow(ts, begin_ts, &d64) ? ((__int128)ts - begin_ts) / 1000
                                                                : d64 / 1000;
        diff = d < 0 ? 0 : d > INT32_MAX ? INT32_MAX : (int32_t)d;
    }
    /* The new entry first, plainly: no lookup reaches it before its slot's head points
     * at it (and the count counts it), both stored after it, released. */
    uint8_t *e = f + HEADER_SIZE + b->slots * 4 + (int64_t)count * ENTRY_SIZE;
    mqs_wr32(e, (uint32_t)h);
    mqs_wr64(e + 4, (uint64_t)phy);
    mqs_wr32(e + 12, (uint32_t)diff);
    mqs_wr32(e + 16, (uint32_t)slot_value);
    /* Then the visible fields, each one whole store, the count last: a lookup loads the
     * head before the count (engine.indexfile.IndexFile.select_phy_offsets). */
    int shared = ((uintptr_t)f & 7) == 0;
    pub32(shared, slot, (uint32_t)count);
    if (count <= 1) {
        pub64(shared, f, (uint64_t)ts);
        pub64(shared, f + 16, (uint64_t)phy);
    }
    if (slot_value == 0)
        slot_count++;
    pub64(shared, f + 8, (uint64_t)ts);
    pub64(shared, f + 24, (uint64_t)phy);
    pub32(shared, f + 32, (uint32_t)slot_count);
    pub32(shared, f + 36, (uint32_t)count + 1);
    return 0;
}

/* Keys [key_from, key_first[rec_to]); returns the next key not put, or -1 (*err set).
 * key_first rises and key_first[rec_from] <= key_from (checked at the door), so record r
 * below holds key k. */
int64_t mqs_index_put_keys(const struct mqs_index_batch *b, int64_t rec_from, int64_t rec_to,
                           int64_t key_from, const char **err)
{
    int64_t k = key_from, r = rec_from;
    int64_t end = b->key_first[rec_to];
    while (k < end) {
        /* The slots are random writes into hash_slot_num * 4 bytes (20 MB by default), a
         * miss each: ask for a later key's slot now, so that it arrives while the keys
         * between are put (a prefetch never faults; a negative hash is refused below). */
        if (k + INDEX_PREFETCH < end && b->key_hash[k + INDEX_PREFETCH] >= 0)
            __builtin_prefetch(b->file + HEADER_SIZE +
                                   (b->key_hash[k + INDEX_PREFETCH] % b->slots) * 4,
                               1);
        while (r < rec_to && b->key_first[r + 1] <= k)
            r++;
        if (b->pos[r] < 0 || b->base > INT64_MAX - b->pos[r]) {
            *err = "base + pos is not a commit-log offset";
            return -1;
        }
        int rc = put_one(b, b->key_hash[k], b->base + b->pos[r], b->ts[r], err);
        if (rc < 0)
            return -1;
        if (rc > 0)
            break;
        k++;
    }
    return k;
}

static int column(PyObject *o, const char *name, Py_ssize_t itemsize, Py_ssize_t min_len,
                  Py_buffer *v)
{
    if (mqs_arg_buffer(o, name, v) < 0)
        return -1;
    if (v->itemsize != itemsize || v->len / itemsize < min_len) {
        PyErr_Format(PyExc_ValueError, "%s must hold at least %zd items of %zd bytes", name,
                     min_len, itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* key_first must rise: checked here, so that put_keys may trust it. */
static int rising(const int32_t *kf, int64_t from, int64_t to)
{
    for (int64_t r = from; r < to; r++)
        if (kf[r] < 0 || kf[r + 1] < kf[r])
            return 0;
    return 1;
}

PyObject *mqs_py_index_put(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError,
                        "index_put(buf, hash_slot_num, index_num, key_first, key_hash, pos, "
                        "store_timestamp, base, rec_from, rec_to, key_from) takes 11 arguments");
        return NULL;
    }
    int64_t slots, entries, base, rec_from, rec_to, key_from;
    if (mqs_arg_i64(args[1], "hash_slot_num", &slots) < 0 ||
        mqs_arg_i64(args[2], "index_num", &entries) < 0 ||
        mqs_arg_i64(args[7], "base", &base) < 0 ||
        mqs_arg_i64(args[8], "rec_from", &rec_from) < 0 ||
        mqs_arg_i64(args[9], "rec_to", &rec_to) < 0 ||
        mqs_arg_i64(args[10], "key_from", &key_from) < 0)
        return NULL;
    if (slots <= 0 || slots > INT32_MAX || entries <= 0 || entries > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "hash_slot_num and index_num must be in [1, 2^31)");
        return NULL;
    }
    if (rec_from < 0 || rec_to < rec_from || base < 0) {
        PyErr_SetString(PyExc_ValueError, "need 0 <= rec_from <= rec_to and base >= 0");
        return NULL;
    }
    Py_buffer buf, kf, kh, pos, ts;
    if (mqs_arg_wbuffer(args[0], "buf", &buf) < 0)
        return NULL;
    PyObject *res = NULL;
    if (buf.len < HEADER_SIZE + slots * 4 + entries * ENTRY_SIZE) {
        PyErr_SetString(PyExc_ValueError, "buf is smaller than the index file's geometry");
        goto out_buf;
    }
    if (column(args[3], "key_first", 4, rec_to + 1, &kf) < 0)
        goto out_buf;
    const int32_t *first = kf.buf;
    if (!rising(first, rec_from, rec_to)) {
        PyErr_SetString(PyExc_ValueError, "key_first must rise from rec_from to rec_to");
        goto out_kf;
    }
    if (key_from < first[rec_from] || key_from > first[rec_to]) {
        PyErr_SetString(PyExc_ValueError, "key_from is outside the records' keys");
        goto out_kf;
    }
    if (column(args[4], "key_hash", 4, first[rec_to], &kh) < 0)
        goto out_kf;
    if (column(args[5], "pos", 8, rec_to, &pos) < 0)
        goto out_kh;
    if (column(args[6], "store_timestamp", 8, rec_to, &ts) < 0)
        goto out_pos;
    struct mqs_index_batch b = {buf.buf, slots, entries, first, kh.buf, pos.buf, ts.buf, base};
    const char *err = NULL;
    int64_t next = mqs_index_put_keys(&b, rec_from, rec_to, key_from, &err);
    if (next < 0)
        PyErr_SetString(PyExc_ValueError, err);
    else
        res = PyLong_FromLongLong(next);
    PyBuffer_Release(&ts);
out_pos:
    PyBuffer_Release(&pos);
out_kh:
    PyBuffer_Release(&kh);
out_kf:
    PyBuffer_Release(&kf);
out_buf:
    PyBuffer_Release(&buf);
    return res;
}
