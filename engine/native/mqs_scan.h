/* The record scanner (issue 13): walk whole commit-log records and return their header
 * fields and spans as columns. The reference is engine/scan.py (`scan_records_py`, which
 * is engine/record.py's `check_record` record by record); the column table and their
 * order are `engine.scan.COLUMNS`, and tests/native/test_scan_diff.py compares the two
 * column by column. Pure C: no Python object is touched, so the caller walks without
 * the GIL. */
#ifndef MQS_SCAN_H
#define MQS_SCAN_H

#include <stddef.h>
#include <stdint.h>

enum mqs_scan_stop { MQS_SCAN_LIMIT = 0, MQS_SCAN_BLANK = 1, MQS_SCAN_CORRUPT = 2 };

/* Columns in engine.scan.COLUMNS' order; MQS_SCAN_WIDTH gives each one's element size. */
enum mqs_scan_col {
    MQS_COL_POS, MQS_COL_SIZE, MQS_COL_QUEUE_ID, MQS_COL_QUEUE_OFFSET,
    MQS_COL_PHYSICAL_OFFSET, MQS_COL_SYS_FLAG, MQS_COL_FLAG, MQS_COL_BORN_TIMESTAMP,
    MQS_COL_STORE_TIMESTAMP, MQS_COL_TAGS_CODE, MQS_COL_BODY_POS, MQS_COL_BODY_LEN,
    MQS_COL_TOPIC_POS, MQS_COL_TOPIC_LEN, MQS_COL_PROPS_POS, MQS_COL_PROPS_LEN, MQS_COL_BITS,
    MQS_NCOLS
};

extern const uint8_t MQS_SCAN_WIDTH[MQS_NCOLS];

#define MQS_BIT_BODY_CRC_OK 0x1
#define MQS_BIT_FILLER 0x2

/* One scan's output, grown with realloc as records are accepted. Zero it before use;
 * free it with mqs_scan_free. */
struct mqs_scan {
    int64_t count, cap;
    void *col[MQS_NCOLS];
    int32_t *key_first; /* count + 1 entries */
    int32_t *key_hash;
    int64_t nkeys, key_cap;
    /* Records whose tags code this scanner does not compute: the schedule topic with a
     * DELAY value that is not ASCII (Python's int() reads any Unicode digit). The caller
     * computes those with the reference; everything else about them is filled in. */
    int64_t *fixup;
    int64_t nfixup, fixup_cap;
    /* The store's messageDelayLevel in ms per level 1..ndelay (the schedule topic's
     * delivery time); NULL: RocketMQ's default 18 levels. Set before mqs_scan_run. */
    const int64_t *delay_ms;
    int32_t ndelay;
    int stop;
    int64_t stop_pos;
    int32_t blank_size;
};

/* Walk buf[pos:end] (end <= the buffer's length, 0 <= pos) as the reference does:
 * stop at `end`, after `max_records` (< 0: no cap), at a BLANK or at a record
 * check_record rejects. Returns 0, or -1 when memory ran out (the scan is then partial). */
int mqs_scan_run(struct mqs_scan *s, const uint8_t *buf, int64_t pos, int64_t end, int check_crc,
                 int64_t max_records);

void mqs_scan_free(struct mqs_scan *s);

/* One record's layout as check_record reads it; positions are from the record's start. */
struct mqs_layout {
    int64_t total;    /* TOTALSIZE (a BLANK's too) */
    int64_t fixed;    /* the body length field ends here: 72 + BH + SH; the body starts */
    int64_t body_len; /* 0 when the stored length is negative */
    int64_t topic_at, topic_len, props_at, props_len;
};

enum mqs_check { MQS_CHECK_OK = 0, MQS_CHECK_BLANK = 1, MQS_CHECK_CORRUPT = 2 };

/* check_record's verdict on the record at buf[pos:end] (0 <= pos, end <= the buffer's
 * length): OK with `l` filled in, BLANK (l->total is its TOTALSIZE) or CORRUPT. */
int mqs_scan_check(const uint8_t *buf, int64_t pos, int64_t end, int check_crc,
                   struct mqs_layout *l);

/* A span of bytes in a record. */
struct mqs_span {
    const uint8_t *p;
    size_t n;
};

/* The next properties pair that engine.record.decode_properties keeps, from *at (< end):
 * a 0x02-separated pair whose first 0x01 is neither its first nor its last character
 * (the separators are ASCII and end any bad UTF-8 sequence, so splitting the bytes first
 * decodes alike). Returns 1 with its name and value (*at moves past it), 0 when none is
 * left. The caller lets the last pair of a name win. */
int mqs_props_next(const uint8_t **at, const uint8_t *end, struct mqs_span *name,
                   struct mqs_span *value);

/* engine.filler.is_filler of the record `r` that mqs_scan_check accepted with `l`. */
int mqs_scan_is_filler(const uint8_t *r, const struct mqs_layout *l);

/* 0 unless s[i] starts an encoded surrogate (ED A0..BF), which Java's UTF-8 decoder makes
 * one U+FFFD of where Python's "replace" makes one per byte (engine.recordcodes.
 * _java_replace); else that U+FFFD's bytes: the lead, the second byte and a continuation
 * byte after them if there is one. `i` < `n`. */
static inline size_t mqs_java_surrogate_len(const uint8_t *s, size_t i, size_t n)
{
    if (s[i] != 0xED || i + 1 >= n || s[i + 1] < 0xA0 || s[i + 1] > 0xBF)
        return 0;
    return i + 2 < n && (s[i + 2] & 0xC0) == 0x80 ? 3 : 2;
}

/* Java's String.hashCode, continued from `h`, over the UTF-16 code units of `s` decoded
 * as Java decodes it (engine.recordcodes.decode_utf8: U+FFFD per maximal invalid subpart
 * but one for an encoded surrogate, ED A0..BF and a continuation byte; surrogate pairs
 * above U+FFFF). */
uint32_t mqs_java_hash_utf8(uint32_t h, const uint8_t *s, size_t n);

/* What the dispatcher asks of every record of a scanned batch, in one pass (the twin of
 * engine.scan.scan_summary_py): `flags` ORs MQS_SUMMARY_FILLER (a record is a filler),
 * MQS_SUMMARY_TX (a PREPARED or ROLLBACK part: sys_flag & 0xC is neither 0 nor 0x8) and
 * MQS_SUMMARY_NEG_QUEUE (a negative queue id). With nbuckets > 0, each record's lag
 * max(0, now_ms - store_ts) counts in hist[min(bit_length(lag), nbuckets - 1)] and adds
 * to the 128-bit sum {sum_hi, sum_lo} (a hostile store time may be any int64). The
 * columns are native-endian int64, uint8, int32, int32, read unaligned. */
#define MQS_SUMMARY_FILLER 0x1
#define MQS_SUMMARY_TX 0x2
#define MQS_SUMMARY_NEG_QUEUE 0x4

struct mqs_summary {
    int flags;
    uint64_t sum_hi, sum_lo;
};

void mqs_scan_summary(const void *store_ts, const uint8_t *bits, const void *sys_flag,
                      const void *queue_id, int64_t n, int64_t now_ms, int64_t *hist,
                      int nbuckets, struct mqs_summary *out);

#endif
