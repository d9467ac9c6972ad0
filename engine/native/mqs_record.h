/* The RocketMQ V1 commit-log record, written in place. The layout table and the
 * reference encoder are engine/record.py (`encode`); tests/native/test_record_diff.py
 * compares this encoder with it byte for byte. Big-endian; BH / SH are 8 (IPv4) or
 * 20 (IPv6) bytes, chosen by the address length, which also sets sysflag bits
 * 0x10 / 0x20. */
#ifndef MQS_RECORD_H
#define MQS_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define MQS_MESSAGE_MAGIC 0xDAA320A7u
#define MQS_MESSAGE_MAGIC_V2 0xDAA320ABu
#define MQS_BLANK_MAGIC 0xCBD43194u
#define MQS_BORN_V6 0x10
#define MQS_STORE_V6 0x20
#define MQS_END_FILE_MIN_BLANK 8 /* a segment ends with a BLANK of at least this */

struct mqs_host {
    const uint8_t *addr; /* 4 or 16 bytes */
    int addr_len;
    int32_t port;
};

/* Everything of one record except its three appender fields. */
struct mqs_message {
    const uint8_t *body;
    size_t body_len;
    uint32_t body_crc; /* mqs_body_crc(body) */
    const uint8_t *topic;
    size_t topic_len; /* 1..127, checked by the caller */
    const uint8_t *props;
    size_t props_len; /* 0..32767, checked by the caller */
    int32_t queue_id;
    int32_t flag;
    int32_t sys_flag; /* host bits are set from the hosts */
    int64_t born_timestamp;
    struct mqs_host born;
    struct mqs_host store;
    int32_t reconsume_times;
    int64_t prepared_offset;
};

/* RocketMQ's calMsgLength for this message. */
size_t mqs_record_length(const struct mqs_message *m);

/* RocketMQ's body CRC: crc32(body) & 0x7FFFFFFF, 0 for an empty body. */
uint32_t mqs_body_crc(const uint8_t *body, size_t len);

/* Write the record's header (everything before the body) at dst; return its length. */
size_t mqs_record_write_head(uint8_t *dst, const struct mqs_message *m, int64_t queue_offset,
                             int64_t physical_offset, int64_t store_timestamp);

/* Write the tail (topic length, topic, properties length, properties) at dst. */
void mqs_record_write_tail(uint8_t *dst, const struct mqs_message *m);

/* The whole record, mqs_record_length(m) bytes, at dst. */
void mqs_record_write(uint8_t *dst, const struct mqs_message *m, int64_t queue_offset,
                      int64_t physical_offset, int64_t store_timestamp);

/* The 8-byte BLANK that ends a segment: TOTALSIZE = `size`, the BLANK magic. */
void mqs_blank_write(uint8_t *dst, int32_t size);

#endif
