"""Types of the C extension `mqstore._native` (sources in native/, built by setup.py)."""

from typing_extensions import Buffer

def crc32(data: Buffer, value: int = 0, /) -> int:
    """`zlib.crc32`, folded with PCLMULQDQ where the CPU has it."""

def crc32_slice8(data: Buffer, /) -> int:
    """The portable slicing-by-8 CRC alone (tests compare it with zlib)."""

def crc32_uses_pclmul() -> bool: ...
def encode(
    topic: bytes,
    body: Buffer,
    properties: bytes,
    *,
    queue_id: int = 0,
    flag: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_addr: bytes = ...,
    born_port: int = ...,
    store_addr: bytes = ...,
    store_port: int = ...,
    reconsume_times: int = 0,
    prepared_offset: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    store_timestamp: int = 0,
) -> bytes:
    """One V1 record laid out as `engine.record.encode` does (inputs already validated)."""
