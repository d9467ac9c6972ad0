/* The record scanner: the twin of engine/scan.py's scan_records_py. Each record is
 * checked as engine/record.py's check_record checks it (the comments name its steps),
 * then its fields, tags code, filler bit and index-key hashes go into the columns. */
#include "mqs_scan.h"

#include <stdlib.h>
#include <string.h>

#include "mqs_be.h"
#include "mqs_crc32.h"
#include "mqs_record.h"

#define MQS_MIN_RECORD 91         /* record_length(0, 0, 0) */
#define MQS_FILLER_FLAG 0x4D514649 /* engine.filler.FILLER_FLAG */

const uint8_t MQS_SCAN_WIDTH[MQS_NCOLS] = {8, 4, 4, 8, 8, 4, 4, 8, 8, 8, 8, 4, 8, 4, 8, 4, 1};

#define MQS_MAX_DELAY_LEVELS 64 /* conf.settings.parse_delay_levels' most */

/* RocketMQ's default messageDelayLevel (engine.record.DELAY_LEVEL_MS), levels 1..18. */
static const int64_t DELAY_LEVEL_MS[18] = {
    1000,   5000,   10000,  30000,  60000,  120000,  180000,  240000,  300000,
    360000, 420000, 480000, 540000, 600000, 1200000, 1800000, 3600000, 7200000,
};

static uint32_t jstep(uint32_t h, uint32_t unit)
{
    return 31u * h + unit;
}

/* One code point's UTF-16 units into the hash. */
static uint32_t jcode_point(uint32_t h, uint32_t cp)
{
    if (cp < 0x10000)
        return jstep(h, cp);
    cp -= 0x10000;
    return jstep(jstep(h, 0xD800 + (cp >> 10)), 0xDC00 + (cp & 0x3FF));
}

/* 31^k mod 2^32, k = 8 .. 1 */
static const uint32_t POW31[8] = {2487512833u, 1742810335u, 887503681u, 28629151u,
                                  923521u,     29791u,      961u,       31u};

uint32_t mqs_java_hash_utf8(uint32_t h, const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint64_t w;
        if (i + 8 <= n && (memcpy(&w, s + i, 8), (w & 0x8080808080808080u) == 0)) {
            /* 8 ASCII bytes: the 8 steps 31h + c, unrolled (mod 2^32, the same sum), so
             * that the multiplications do not wait on each other (most keys are ASCII,
             * and a UNIQ_KEY is 32 bytes: issue 23's dispatcher CPU) */
            const uint8_t *c = s + i;
            h = h * POW31[0] + c[0] * POW31[1] + c[1] * POW31[2] + c[2] * POW31[3] +
                c[3] * POW31[4] + c[4] * POW31[5] + c[5] * POW31[6] + c[6] * POW31[7] + c[7];
            i += 8;
            continue;
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            h = jstep(h, c);
            i++;
            continue;
        }
        size_t surrogate = mqs_java_surrogate_len(s, i, n);
        if (surrogate) { /* one U+FFFD, as Java decodes it */
            h = jstep(h, 0xFFFD);
            i += surrogate;
            continue;
        }
        size_t need;
        uint32_t cp;
        uint8_t lo = 0x80, hi = 0xBF; /* the second byte's range narrows for some leads */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1, cp = c & 0x1Fu;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2, cp = c & 0x0Fu;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3, cp = c & 0x07u;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            h = jstep(h, 0xFFFD);
            i++;
            continue;
        }
        size_t k = 1;
        for (; k <= need && i + k < n; k++) {
            uint8_t b = s[i + k];
            if (b < lo || b > hi)
                break;
            cp = (cp << 6) | (b & 0x3Fu);
            lo = 0x80, hi = 0xBF;
        }
        /* a sequence cut short is one U+FFFD for its lead and the good bytes after it */
        h = k <= need ? jstep(h, 0xFFFD) : jcode_point(h, cp);
        i += k;
    }
    return h;
}

/* --- the columns ------------------------------------------------------------------- */

static int grow(void **p, int64_t cap, size_t width)
{
    void *q = realloc(*p, (size_t)cap * width);
    if (q == NULL)
        return -1;
    *p = q;
    return 0;
}

/* Room for a row past the current one; the first allocation has `first` rows. */
static int reserve_row(struct mqs_scan *s, int64_t first)
{
    if (s->key_first == NULL) {
        if (grow((void **)&s->key_first, first, sizeof(int32_t)) < 0)
            return -1;
        s->key_first[0] = 0;
    }
    if (s->count + 1 < s->cap)
        return 0;
    int64_t cap = s->cap ? 2 * s->cap : first;
    for (int c = 0; c < MQS_NCOLS; c++)
        if (grow(&s->col[c], cap, MQS_SCAN_WIDTH[c]) < 0)
            return -1;
    if (grow((void **)&s->key_first, cap + 1, sizeof(int32_t)) < 0)
        return -1;
    s->cap = cap;
    return 0;
}

static void put64(struct mqs_scan *s, int c, int64_t v)
{
    ((int64_t *)s->col[c])[s->count] = v;
}

static void put32(struct mqs_scan *s, int c, int32_t v)
{
    ((int32_t *)s->col[c])[s->count] = v;
}

static int push_key(struct mqs_scan *s, uint32_t h)
{
    if (s->nkeys == s->key_cap) {
        int64_t cap = s->key_cap ? 2 * s->key_cap : 2048;
        if (grow((void **)&s->key_hash, cap, sizeof(int32_t)) < 0)
            return -1;
        s->key_cap = cap;
    }
    int32_t v = (int32_t)h; /* indexfile.key_hash: abs, abs(MIN_VALUE) -> 0 */
    s->key_hash[s->nkeys++] = v == INT32_MIN ? 0 : (v < 0 ? -v : v);
    return 0;
}

static int push_fixup(struct mqs_scan *s)
{
    if (s->nfixup == s->fixup_cap) {
        int64_t cap = s->fixup_cap ? 2 * s->fixup_cap : 16;
        if (grow((void **)&s->fixup, cap, sizeof(int64_t)) < 0)
            return -1;
        s->fixup_cap = cap;
    }
    s->fixup[s->nfixup++] = s->count;
    return 0;
}

void mqs_scan_free(struct mqs_scan *s)
{
    for (int c = 0; c < MQS_NCOLS; c++)
        free(s->col[c]);
    free(s->key_first);
    free(s->key_hash);
    free(s->fixup);
    memset(s, 0, sizeof *s);
}

/* --- one record -------------------------------------------------------------------- */

/* What the properties say, as record.decode_properties reads them (last pair wins). */
struct props {
    struct mqs_span tags, keys, uniq, delay, filler_value;
    int pairs;       /* pairs kept */
    int other_pairs; /* pairs kept whose name is not MQSTORE_FILLER */
};

static int name_is(struct mqs_span name, const char *want)
{
    size_t n = strlen(want);
    return name.n == n && memcmp(name.p, want, n) == 0;
}

int mqs_props_next(const uint8_t **at, const uint8_t *end, struct mqs_span *name,
                   struct mqs_span *value)
{
    for (const uint8_t *p = *at; p < end;) {
        const uint8_t *sep = memchr(p, 0x02, (size_t)(end - p));
        const uint8_t *stop = sep ? sep : end;
        const uint8_t *eq = memchr(p, 0x01, (size_t)(stop - p));
        const uint8_t *next = sep ? sep + 1 : end;
        if (eq != NULL && eq > p && eq < stop - 1) {
            *name = (struct mqs_span){p, (size_t)(eq - p)};
            *value = (struct mqs_span){eq + 1, (size_t)(stop - eq - 1)};
            *at = next;
            return 1;
        }
        p = next;
    }
    *at = end;
    return 0;
}

/* Fill `out` from the pairs kept (the last pair of a name wins); the
 * names compared are ASCII, so a name equals one iff its bytes do. */
static void parse_props(const uint8_t *p, size_t n, struct props *out)
{
    memset(out, 0, sizeof *out);
    struct mqs_span name, value;
    for (const uint8_t *end = p + n; mqs_props_next(&p, end, &name, &value);) {
        out->pairs++;
        if (name_is(name, "MQSTORE_FILLER"))
            out->filler_value = value;
        else
            out->other_pairs++;
        if (name_is(name, "TAGS"))
            out->tags = value;
        else if (name_is(name, "KEYS"))
            out->keys = value;
        else if (name_is(name, "UNIQ_KEY"))
            out->uniq = value;
        else if (name_is(name, "DELAY"))
            out->delay = value;
    }
}

/* int(value) for an ASCII value, as Python reads it: optional ASCII whitespace around, a
 * sign, decimal digits with single underscores between them. Returns 1 and the level
 * (capped at 64, the most levels a table has: tags_code caps it at its table's last) or 0
 * for what int() refuses; -1 when the value is not ASCII (the caller leaves it to the
 * reference). */
static int delay_level(struct mqs_span v, int *level)
{
    for (size_t i = 0; i < v.n; i++)
        if (v.p[i] >= 0x80)
            return -1;
    size_t i = 0, n = v.n;
    while (i < n && (v.p[i] == ' ' || (v.p[i] >= 0x09 && v.p[i] <= 0x0D)))
        i++;
    while (n > i && (v.p[n - 1] == ' ' || (v.p[n - 1] >= 0x09 && v.p[n - 1] <= 0x0D)))
        n--;
    int neg = 0;
    if (i < n && (v.p[i] == '+' || v.p[i] == '-'))
        neg = v.p[i++] == '-';
    if (i == n)
        return 0;
    int64_t value = 0;
    for (int digit_before = 0; i < n; i++) {
        uint8_t c = v.p[i];
        if (c >= '0' && c <= '9') {
            value = value * 10 + (c - '0');
            if (value > MQS_MAX_DELAY_LEVELS) /* past every table's last level */
                value = MQS_MAX_DELAY_LEVELS;
            digit_before = 1;
        } else if (c == '_' && digit_before && i + 1 < n && v.p[i + 1] >= '0' &&
                   v.p[i + 1] <= '9') {
            digit_before = 0;
        } else {
            return 0;
        }
    }
    *level = neg ? -(int)value : (int)value;
    return 1;
}

/* check_record's tags code: the TAGS value's Java hash, or on the schedule topic with a
 * positive DELAY level, the delivery time by the scan's delay table (ScheduleMessageService
 * .computeDeliverTimestamp: the level capped at the table's last). Returns -1 when the
 * reference must say. */
static int tags_code(const struct mqs_scan *s, const struct props *pr, struct mqs_span topic,
                     int64_t store_ts, int64_t *code)
{
    *code = pr->tags.p ? (int32_t)mqs_java_hash_utf8(0, pr->tags.p, pr->tags.n) : 0;
    if (pr->delay.p == NULL || !name_is(topic, "SCHEDULE_TOPIC_XXXX"))
        return 0;
    int level = 0;
    int rc = delay_level(pr->delay, &level);
    if (rc < 0)
        return -1;
    const int64_t *table = s->delay_ms ? s->delay_ms : DELAY_LEVEL_MS;
    int n = s->delay_ms ? s->ndelay : 18;
    if (level > n)
        level = n;
    if (rc > 0 && level > 0) /* a long add in Java: it wraps */
        *code = (int64_t)((uint64_t)store_ts + (uint64_t)table[level - 1]);
    return 0;
}

/* The index keys of IndexService.build_index, in its order: topic#UNIQ_KEY, then
 * topic#k for each non-empty KEYS token split on ' '. */
static int push_keys(struct mqs_scan *s, const struct props *pr, struct mqs_span topic)
{
    uint32_t base = jstep(mqs_java_hash_utf8(0, topic.p, topic.n), '#');
    if (pr->uniq.p && push_key(s, mqs_java_hash_utf8(base, pr->uniq.p, pr->uniq.n)) < 0)
        return -1;
    const uint8_t *p = pr->keys.p, *end = p + pr->keys.n;
    while (p != NULL && p < end) {
        const uint8_t *sp = memchr(p, ' ', (size_t)(end - p));
        const uint8_t *stop = sp ? sp : end;
        if (stop > p && push_key(s, mqs_java_hash_utf8(base, p, (size_t)(stop - p))) < 0)
            return -1;
        if (sp == NULL)
            break;
        p = sp + 1;
    }
    return 0;
}

/* check_record's field checks on the message record `r` of TOTALSIZE `total` (its magic
 * read, `tl` its topic length's width): 1 OK with the fields' spans in `l`, 0 rejected. */
static int check(const uint8_t *r, int64_t total, int tl, int check_crc, struct mqs_layout *l)
{
    l->total = total;
    int32_t sys_flag = (int32_t)mqs_rd32(r + 36);
    l->fixed = 72 + (sys_flag & MQS_BORN_V6 ? 20 : 8) + (sys_flag & MQS_STORE_V6 ? 20 : 8);
    /* any field that would run past TOTALSIZE makes the fields add up to more */
    if (l->fixed + tl + 2 > total)
        return 0;
    int32_t body_len = (int32_t)mqs_rd32(r + l->fixed - 4);
    l->body_len = body_len > 0 ? body_len : 0;
    if (l->fixed + l->body_len + tl + 2 > total)
        return 0;
    if (body_len > 0 && check_crc &&
        (mqs_crc32(0, r + l->fixed, (size_t)body_len) & 0x7FFFFFFFu) != mqs_rd32(r + 8))
        return 0;
    l->topic_at = l->fixed + l->body_len + tl;
    int topic_len = tl == 1 ? (int8_t)r[l->topic_at - 1] : mqs_rd16(r + l->topic_at - 2);
    l->topic_len = topic_len > 0 ? topic_len : 0;
    l->props_at = l->topic_at + l->topic_len + 2;
    if (l->props_at > total)
        return 0;
    int props_len = mqs_rd16(r + l->props_at - 2);
    l->props_len = props_len > 0 ? props_len : 0;
    if (l->props_at + l->props_len != total)
        return 0;
    /* the torn-end rule: properties never end in a zero byte */
    return !(l->props_len > 0 && r[total - 1] == 0);
}

int mqs_scan_check(const uint8_t *buf, int64_t pos, int64_t end, int check_crc,
                   struct mqs_layout *l)
{
    if (end - pos < 8)
        return MQS_CHECK_CORRUPT; /* fewer than 8 bytes left */
    int64_t total = (int32_t)mqs_rd32(buf + pos);
    uint32_t magic = mqs_rd32(buf + pos + 4);
    if (magic == MQS_BLANK_MAGIC) {
        l->total = total;
        return MQS_CHECK_BLANK;
    }
    int tl = magic == MQS_MESSAGE_MAGIC ? 1 : magic == MQS_MESSAGE_MAGIC_V2 ? 2 : 0;
    if (tl == 0 || total < MQS_MIN_RECORD || total > end - pos ||
        !check(buf + pos, total, tl, check_crc, l))
        return MQS_CHECK_CORRUPT;
    return MQS_CHECK_OK;
}

/* engine.filler.is_filler, from the record's flag, born time and properties. */
static int is_filler(int32_t flag, int64_t born, const struct props *pr)
{
    return flag == MQS_FILLER_FLAG && born == 0 &&
           (pr->pairs == 0 || (pr->other_pairs == 0 && pr->filler_value.n == 1 &&
                               pr->filler_value.p[0] == '1'));
}

int mqs_scan_is_filler(const uint8_t *r, const struct mqs_layout *l)
{
    struct props pr;
    parse_props(r + l->props_at, (size_t)l->props_len, &pr);
    return is_filler((int32_t)mqs_rd32(r + 16), mqs_rd64(r + 40), &pr);
}

static int add_row(struct mqs_scan *s, const uint8_t *buf, int64_t pos, const struct mqs_layout *l)
{
    int64_t total = l->total;
    const uint8_t *r = buf + pos;
    int32_t sys_flag = (int32_t)mqs_rd32(r + 36), flag = (int32_t)mqs_rd32(r + 16);
    int64_t born = mqs_rd64(r + 40);
    int64_t store_ts = mqs_rd64(r + 48 + (sys_flag & MQS_BORN_V6 ? 20 : 8));
    struct mqs_span topic = {r + l->topic_at, (size_t)l->topic_len};
    struct props pr;
    parse_props(r + l->props_at, (size_t)l->props_len, &pr);
    int filler = is_filler(flag, born, &pr);
    int64_t code;
    if (tags_code(s, &pr, topic, store_ts, &code) < 0 && push_fixup(s) < 0)
        return -1;
    put64(s, MQS_COL_POS, pos);
    put32(s, MQS_COL_SIZE, (int32_t)total);
    put32(s, MQS_COL_QUEUE_ID, (int32_t)mqs_rd32(r + 12));
    put64(s, MQS_COL_QUEUE_OFFSET, mqs_rd64(r + 20));
    put64(s, MQS_COL_PHYSICAL_OFFSET, mqs_rd64(r + 28));
    put32(s, MQS_COL_SYS_FLAG, sys_flag);
    put32(s, MQS_COL_FLAG, flag);
    put64(s, MQS_COL_BORN_TIMESTAMP, born);
    put64(s, MQS_COL_STORE_TIMESTAMP, store_ts);
    put64(s, MQS_COL_TAGS_CODE, code);
    put64(s, MQS_COL_BODY_POS, pos + l->fixed);
    put32(s, MQS_COL_BODY_LEN, (int32_t)l->body_len);
    put64(s, MQS_COL_TOPIC_POS, pos + l->topic_at);
    put32(s, MQS_COL_TOPIC_LEN, (int32_t)l->topic_len);
    put64(s, MQS_COL_PROPS_POS, pos + l->props_at);
    put32(s, MQS_COL_PROPS_LEN, (int32_t)l->props_len);
    ((uint8_t *)s->col[MQS_COL_BITS])[s->count] =
        MQS_BIT_BODY_CRC_OK | (filler ? MQS_BIT_FILLER : 0);
    if (!filler && push_keys(s, &pr, topic) < 0)
        return -1;
    s->count++;
    s->key_first[s->count] = (int32_t)s->nkeys;
    return 0;
}

/* Without the CRC, ask for the log's lines MQS_SCAN_AHEAD bytes ahead of the walk: each
 * record's header and tail are dependent loads (TOTALSIZE says where the next record
 * starts, its lengths where its topic and properties are), each a miss on a log that is
 * not in the caches, as the body between them is never read (a cold 300 MB log: 155 ->
 * 85 ns per 1 KiB record). The CRC reads every body byte in order, which the hardware
 * streams on its own (there asking too was 15% slower). The distance grows with the
 * bytes walked since `start` (a scan of one or two records asks for nothing past them).
 * `*ahead` is where the asking stopped; a prefetch never faults, and only buf[..end) is
 * asked for. */
#define MQS_SCAN_AHEAD 8192

static void prefetch_ahead(const uint8_t *buf, int64_t start, int64_t pos, int64_t end,
                           int64_t *ahead)
{
    int64_t dist = pos - start < MQS_SCAN_AHEAD ? pos - start : MQS_SCAN_AHEAD;
    int64_t want = end - pos > dist ? pos + dist : end;
    if (*ahead < pos)
        *ahead = pos;
    for (; *ahead < want; *ahead += 64)
        __builtin_prefetch(buf + *ahead);
}

int mqs_scan_run(struct mqs_scan *s, const uint8_t *buf, int64_t pos, int64_t end, int check_crc,
                 int64_t max_records)
{
    s->stop = MQS_SCAN_LIMIT;
    /* First rows: 1024, or for a capped walk (the dispatcher's rounds) as many as it can
     * take (at most 64Ki), so that a round of 1,024-4,096 records does not copy its
     * columns as they double (~100 instructions a record; issue 23) */
    int64_t first = 1024;
    if (max_records > 0) {
        int64_t fit = (end - pos) / MQS_MIN_RECORD + 1;
        first = (max_records < fit ? max_records : fit) + 1;
        first = first < 16 ? 16 : first > 65536 ? 65536 : first;
    }
    if (reserve_row(s, first) < 0)
        return -1;
    int64_t start = pos, ahead = pos;
    while (pos < end && s->count != max_records) {
        s->stop_pos = pos;
        if (!check_crc)
            prefetch_ahead(buf, start, pos, end, &ahead);
        struct mqs_layout l;
        int verdict = mqs_scan_check(buf, pos, end, check_crc, &l);
        if (verdict != MQS_CHECK_OK) {
            s->stop = verdict == MQS_CHECK_BLANK ? MQS_SCAN_BLANK : MQS_SCAN_CORRUPT;
            if (verdict == MQS_CHECK_BLANK)
                s->blank_size = (int32_t)l.total;
            return 0;
        }
        if (reserve_row(s, first) < 0 || add_row(s, buf, pos, &l) < 0)
            return -1;
        pos += l.total;
    }
    s->stop_pos = pos;
    return 0;
}

/* --- the dispatcher's pass over a batch (engine.scan.scan_summary_py) -------------------- */

void mqs_scan_summary(const void *store_ts, const uint8_t *bits, const void *sys_flag,
                      const void *queue_id, int64_t n, int64_t now_ms, int64_t *hist,
                      int nbuckets, struct mqs_summary *out)
{
    const uint8_t *ts_at = store_ts, *sf_at = sys_flag, *q_at = queue_id;
    uint8_t any_bits = 0;
    int32_t all_tx = 0, min_queue = 0;
    uint64_t hi = 0, lo = 0;
    for (int64_t i = 0; i < n; i++) {
        any_bits |= bits[i];
        /* 0x4 set: PREPARED (0x4) or ROLLBACK (0xC); 0x0 and COMMIT (0x8) are plain */
        int32_t sf, q;
        memcpy(&sf, sf_at + 4 * i, sizeof sf);
        memcpy(&q, q_at + 4 * i, sizeof q);
        all_tx |= sf;
        min_queue = q < min_queue ? q : min_queue;
        if (nbuckets > 0) {
            /* now_ms - ts in 64 unsigned bits: exact, as ts < now_ms and both are int64 */
            int64_t ts;
            memcpy(&ts, ts_at + 8 * i, sizeof ts);
            uint64_t age = ts < now_ms ? (uint64_t)now_ms - (uint64_t)ts : 0;
            int b = age ? 64 - __builtin_clzll(age) : 0;
            hist[b < nbuckets ? b : nbuckets - 1]++;
            lo += age;
            hi += lo < age;
        }
    }
    out->flags = (any_bits & MQS_BIT_FILLER ? MQS_SUMMARY_FILLER : 0) |
                 (all_tx & 0x4 ? MQS_SUMMARY_TX : 0) | (min_queue < 0 ? MQS_SUMMARY_NEG_QUEUE : 0);
    out->sum_hi = hi;
    out->sum_lo = lo;
}
