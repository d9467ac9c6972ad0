"""Body compression as RocketMQ's producer does it, and its undoing on every read.

RocketMQ 5.x's producer (`DefaultMQProducerImpl.tryToCompressMessage`) compresses a
single message's body of at least `compressMsgBodyOverHowmuch` bytes (4 KiB) with the
codec `rocketmq.message.compressType` (ZLIB by default) at `rocketmq.message.compressLevel`
(5), and marks the record's sysFlag: `COMPRESSED_FLAG` (0x1) and the codec in bits 8-10
(`MessageSysFlag.COMPRESSION_TYPE_COMPARATOR` 0x700: LZ4 0x100, ZSTD 0x200, ZLIB 0x300).
A record with 0x1 and no codec bits is 4.x's, which only knew zlib
(`CompressionType.findByValue(0)` is ZLIB). The stream formats, as its compressors write
and read them (`common/compression/`):

- ZLIB: `DeflaterOutputStream(Deflater(level))`, a zlib stream (RFC 1950: 2-byte header,
  deflate, Adler-32); here `zlib.compress(body, level)`.
- LZ4: lz4-java's `LZ4FrameOutputStream`, an LZ4 frame of independent 4 MiB blocks
  without checksums or content size (the level is not used); here `lz4.frame.compress`
  with the same frame options. `LZ4FrameInputStream` reads no dependent blocks.
- ZSTD: zstd-jni's `ZstdOutputStream(out, level)`, one zstd frame; here
  `zstandard.ZstdCompressor(level).compress` (its frame also records the content size,
  which `ZstdInputStream` reads).

In mqstore the store's settings (`compress_type`, `compress_level`,
`compress_msg_body_over_howmuch_bytes`) decide, and the C put applies them
(`ipc/native/mqs_compress.c`: one call of the codec's C function per body, the functions
made by `compressor` here). One deliberate difference: a body whose compressed form is
not smaller is stored as given, uncompressed and unflagged (RocketMQ stores the larger
form); its readers get the same bytes either way. Batches are compressed message by
message (RocketMQ's producer leaves its `MessageBatch` alone; mqstore's batch is a list
of records, each with its own sysFlag).

`compress_reference` is the Python reference of the C put's step, for the differential
tests only. `decompress` undoes any of the three, as `MessageDecoder.decode(...,
deCompressBody=true)` does.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import zlib
from collections.abc import Callable
from typing import Any, Final, TypeVar

import lz4.frame
import zstandard

from mqstore.engine.record import (
    COMPRESSION_LZ4,
    COMPRESSION_TYPE_MASK,
    COMPRESSION_ZLIB,
    COMPRESSION_ZSTD,
    SysFlag,
)
from mqstore.engine.record_decode import RecordFields, RecordView

_R = TypeVar("_R", bound=RecordFields)

COMPRESSED_FLAG: Final = int(SysFlag.COMPRESSED)
DEFAULT_OVER_BYTES: Final = 4 * 1024  # compressMsgBodyOverHowmuch
DEFAULT_LEVEL: Final = 5  # rocketmq.message.compressLevel
# The levels each codec takes (java.util.zip.Deflater: -1 default, 0-9; zstd-jni: the
# library's range; LZ4: RocketMQ ignores it, lz4's frame API reads 0-16).
LEVELS: Final[dict[str, tuple[int, int]]] = {"ZLIB": (-1, 9), "LZ4": (0, 16), "ZSTD": (-7, 22)}


class Codec(enum.Enum):
    """A codec and its sysFlag bits (`CompressionType.getCompressionFlag`)."""

    LZ4 = COMPRESSION_LZ4
    ZSTD = COMPRESSION_ZSTD
    ZLIB = COMPRESSION_ZLIB

    @property
    def flag(self) -> int:
        """The sysFlag bits of a body compressed with it: COMPRESSED_FLAG | type."""
        return COMPRESSED_FLAG | self.value


class CompressedBodyError(ValueError):
    """A body flagged compressed that its codec cannot inflate (or an unknown codec)."""


def codec_of(sys_flag: int) -> Codec | None:
    """The codec of a record's body (None: not compressed), as
    `MessageSysFlag.getCompressionType`: no type bits is 4.x's zlib. Raises
    CompressedBodyError for type bits RocketMQ does not know (4-7)."""
    if not sys_flag & COMPRESSED_FLAG:
        return None
    bits = sys_flag & COMPRESSION_TYPE_MASK
    if bits == 0:
        return Codec.ZLIB
    try:
        return Codec(bits)
    except ValueError:
        raise CompressedBodyError(f"unknown compression type {bits >> 8} in sysFlag") from None


def compression_name(sys_flag: int) -> str | None:
    """ "zlib", "lz4" or "zstd" for a compressed record, else None (unknown: "unknown")."""
    try:
        c = codec_of(sys_flag)
    except CompressedBodyError:
        return "unknown"
    return None if c is None else c.name.lower()


def compressor(codec: Codec, level: int) -> Callable[[bytes | memoryview], bytes]:
    """The codec's own C function, with RocketMQ's stream format and `level`: what the C
    put calls once per body (all three are C-implemented callables)."""
    if codec is Codec.ZLIB:
        return functools.partial(zlib.compress, level=level)
    if codec is Codec.LZ4:
        return functools.partial(
            lz4.frame.compress,
            compression_level=level,
            block_size=lz4.frame.BLOCKSIZE_MAX4MB,
            block_linked=False,
            content_checksum=False,
            block_checksum=False,
            store_size=False,
        )
    return zstandard.ZstdCompressor(level=level).compress


INFLATE_LIMIT: Final = 1 << 30
"""The most any body is inflated to, whatever the caller's bound: a flagged body set by
its caller can be a bomb (4 MiB of zstd inflate to over 100 GiB), and every reader,
the scheduler (a store process) among them, inflates what it reads."""


def _too_big(limit: int) -> ValueError:
    return ValueError(f"inflates past {limit} bytes")


def _inflate_zstd(body: bytes | memoryview, limit: int) -> bytes:
    # RocketMQ's ZstdOutputStream frames carry no content size: the output is bounded
    # by `max_output_size` (allocated lazily); a header that names a size is checked.
    if zstandard.frame_content_size(body) > limit:
        raise _too_big(limit)
    out: bytes = zstandard.ZstdDecompressor().decompress(body, max_output_size=limit)
    return out


def _inflate_lz4(body: bytes | memoryview, limit: int) -> bytes:
    d = lz4.frame.LZ4FrameDecompressor()
    out: bytes = d.decompress(body, max_length=limit + 1)
    if len(out) > limit:
        raise _too_big(limit)
    if not d.eof:
        raise RuntimeError("truncated LZ4 frame")
    return out


def _inflate_zlib(body: bytes | memoryview, limit: int) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(body, limit + 1)
    if len(out) > limit:
        raise _too_big(limit)
    if not d.eof:
        raise zlib.error("truncated zlib stream")
    return out


_INFLATE: Final[dict[Codec, Callable[[bytes | memoryview, int], bytes]]] = {
    Codec.ZLIB: _inflate_zlib,
    Codec.LZ4: _inflate_lz4,
    Codec.ZSTD: _inflate_zstd,
}


def decompress(
    body: bytes | memoryview, sys_flag: int, limit: int = INFLATE_LIMIT
) -> bytes | memoryview:
    """The original bytes of a record's body (the body itself when it is not flagged
    compressed). Raises CompressedBodyError when it does not inflate, or inflates past
    `limit` bytes (at most INFLATE_LIMIT): no producer's put stores such a body
    compressed, mqstore's and RocketMQ's both bound the body before they compress it."""
    codec = codec_of(sys_flag)
    if codec is None:
        return body
    try:
        return _INFLATE[codec](body, min(limit, INFLATE_LIMIT))
    except Exception as e:  # each codec raises its own error type
        raise CompressedBodyError(
            f"{codec.name.lower()} body does not inflate: {type(e).__name__}: {e}"
        ) from None


def compress_reference(
    body: bytes, sys_flag: int, codec: Codec | None, level: int, over: int
) -> tuple[bytes, int]:
    """The C put's compression step in Python (tests only): (body, sys_flag) as stored.
    A body of at least `over` bytes, not already flagged compressed by its caller, is
    compressed when that makes it smaller."""
    if codec is None or sys_flag & COMPRESSED_FLAG or len(body) < over:
        return body, sys_flag
    packed = compressor(codec, level)(body)
    if len(packed) >= len(body):
        return body, sys_flag
    return packed, (sys_flag & ~COMPRESSION_TYPE_MASK) | codec.flag


def inflate(rec: _R) -> _R:
    """`rec` with its body's original bytes (a view's body becomes a view of them); the
    record itself when its body is not compressed. A flagged body that does not inflate
    (only a caller that set the flag itself can have stored one) is left as stored:
    `mqstore check` reports it."""
    if not rec.sys_flag & COMPRESSED_FLAG:
        return rec
    try:
        body = decompress(rec.body, rec.sys_flag)
    except CompressedBodyError:
        return rec
    if isinstance(rec, RecordView):
        return dataclasses.replace(rec, body=memoryview(body))
    return dataclasses.replace(rec, body=bytes(body))


def inflate_all(recs: list[Any]) -> None:
    """`inflate` every record of `recs`, in place."""
    for i, rec in enumerate(recs):
        if rec.sys_flag & COMPRESSED_FLAG:
            recs[i] = inflate(rec)
