"""Body compression against RocketMQ's formats: the golden compressed records (which
RocketMQ's decoder inflates to `body-16k.json`), bodies compressed by RocketMQ's own
compressors (which mqstore inflates), the sysFlag bits, and the reference's rule."""

from __future__ import annotations

import dataclasses
import zlib

import lz4.frame
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from mqstore.engine import compression, record
from mqstore.engine.compression import Codec, CompressedBodyError
from tests.engine import compression_golden as golden


@pytest.mark.parametrize("codec", list(Codec))
def test_golden_compressed_record_is_byte_exact_and_inflates_to_the_original(codec: Codec) -> None:
    raw = golden.record_path(codec).read_bytes()
    original = golden.BODY.read_bytes()
    assert original == golden.golden_body() and len(original) == 16 * 1024
    rec = record.decode(raw, 0)  # as stored
    assert (
        rec.sys_flag
        == codec.flag
        == {Codec.ZLIB: 0x301, Codec.LZ4: 0x101, Codec.ZSTD: 0x201}[codec]
    )
    assert rec.crc_ok and rec.compression == codec.name.lower()
    # the framing around the stored body is the encoder's (the body's bytes come from the
    # codec's library, whose exact output may differ between library versions)
    assert raw == golden.record_of(codec, rec.body)
    assert record.decode(raw, 0, decompress=True).body == original
    assert compression.decompress(golden.build_body(codec), codec.flag) == original
    if codec is Codec.ZLIB:  # the goal: 16 KiB of JSON at least 3x smaller
        assert len(raw) * 3 <= len(original)


@pytest.mark.parametrize("codec", list(Codec))
def test_bodies_compressed_by_rocketmqs_compressors_inflate(codec: Codec) -> None:
    """`body-16k.rocketmq-*.bin`: the golden body compressed at level 5 by RocketMQ's
    ZlibCompressor, Lz4Compressor (lz4-java) and ZstdCompressor (zstd-jni, no content size
    in the frame)."""
    packed = (golden.GOLDEN / f"body-16k.rocketmq-{codec.name.lower()}.bin").read_bytes()
    assert compression.decompress(packed, codec.flag) == golden.BODY.read_bytes()


def test_a_4x_record_flagged_compressed_without_a_type_is_zlib() -> None:
    body = b"4.x" * 2000
    assert compression.decompress(zlib.compress(body), 0x1) == body
    assert compression.codec_of(0x1) is Codec.ZLIB and compression.compression_name(0x1) == "zlib"
    assert compression.codec_of(0x300) is None  # type bits without the flag: not compressed


@pytest.mark.parametrize("flag", [0x401, 0x501, 0x601, 0x701])
def test_unknown_type_bits_are_an_error_not_a_guess(flag: int) -> None:
    with pytest.raises(CompressedBodyError, match="unknown compression type"):
        compression.decompress(b"x", flag)
    assert compression.compression_name(flag) == "unknown"


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("cut", [0, 1, 5, -1])
def test_a_damaged_body_raises_compressed_body_error(codec: Codec, cut: int) -> None:
    packed = compression.compressor(codec, 5)(golden.BODY.read_bytes())
    bad = packed[:cut] if cut >= 0 else packed[:-3]
    with pytest.raises(CompressedBodyError):
        compression.decompress(bad, codec.flag)
    with pytest.raises(CompressedBodyError):
        compression.decompress(b"\xff" * 64 + packed, codec.flag)


@given(
    body=st.binary(max_size=3000) | st.integers(0, 3000).map(lambda n: b"ab" * n),
    codec=st.sampled_from([None, *Codec]),
    over=st.sampled_from([0, 100, 4096]),
    flag=st.sampled_from([0, 0x1, 0x4, 0x8, 0x300]),
)
def test_the_reference_rule(body: bytes, codec: Codec | None, over: int, flag: int) -> None:
    got, got_flag = compression.compress_reference(body, flag, codec, 5, over)
    if codec is None or flag & 1 or len(body) < over or got == body:
        assert (got, got_flag) == (body, flag)
    else:
        assert len(got) < len(body)
        assert got_flag == (flag & ~0x700) | codec.flag
        assert compression.decompress(got, got_flag) == body


def _bomb(codec: Codec, size: int) -> bytes:
    """`size` zero bytes as the codec's stream, made a MiB at a time (a flagged body of
    a caller's own: the put takes it as compressed already)."""
    zero = bytes(1 << 20)
    if codec is Codec.ZLIB:
        z = zlib.compressobj(9)
        return b"".join(z.compress(zero) for _ in range(size >> 20)) + z.flush()
    if codec is Codec.LZ4:
        c = lz4.frame.LZ4FrameCompressor(block_size=lz4.frame.BLOCKSIZE_MAX4MB)
        return c.begin() + b"".join(c.compress(zero) for _ in range(size >> 20)) + c.flush()
    w = zstandard.ZstdCompressor(level=1, write_content_size=False).compressobj()
    return b"".join(w.compress(zero) for _ in range(size >> 20)) + w.flush()


@pytest.mark.parametrize("codec", list(Codec))
def test_a_body_that_inflates_past_the_limit_is_an_error_not_an_allocation(
    codec: Codec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body whose caller set the compressed flag can be a bomb (a few KiB of any codec
    inflating to GiBs), and every reader inflates what it reads: the scheduler, a store
    process, inflates each delayed message. Nothing inflates past INFLATE_LIMIT (1 GiB;
    4 MiB here) or a caller's lower limit: CompressedBodyError, and a read gives the
    body as stored. (Before, it inflated whatever the stream held.)"""
    limit = 4 << 20
    monkeypatch.setattr(compression, "INFLATE_LIMIT", limit, raising=False)
    assert len(compression.decompress(_bomb(codec, limit), codec.flag)) == limit
    bomb = _bomb(codec, 64 << 20)
    assert len(bomb) < 1 << 20
    with pytest.raises(CompressedBodyError):  # zstd's own words: not the full frame
        compression.decompress(bomb, codec.flag)
    with pytest.raises(CompressedBodyError):
        compression.decompress(_bomb(codec, limit), codec.flag, 1 << 20)
    stored = record.decode(golden.record_path(codec).read_bytes(), 0)
    rec = dataclasses.replace(stored, body=bomb)
    assert compression.inflate(rec) is rec  # a read gives it as stored
