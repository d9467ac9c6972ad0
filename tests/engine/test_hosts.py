"""`parse_host` and `format_host` against their `ipaddress` reference (the code they had).

`parse_host` reads an address spelled as `inet_ntop` writes it with `inet_pton`, and
only any other spelling with `ipaddress` (imported then, off a producer's start); these
check that the two ways agree byte for byte, errors included, on addresses in every
spelling and on arbitrary text."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from hypothesis import example, given
from hypothesis import strategies as st

from mqstore.engine import recordcodes


def reference_parse_host(host: str) -> tuple[bytes, int, bool]:
    if host.startswith("["):
        end = host.find("]")
        if end < 0 or host[end + 1 : end + 2] != ":":
            raise ValueError(f"bad host {host!r}: expected [ipv6]:port")
        addr_s, port_s = host[1:end], host[end + 2 :]
    else:
        addr_s, sep, port_s = host.rpartition(":")
        if not sep:
            raise ValueError(f"bad host {host!r}: expected ip:port")
    try:
        addr = ipaddress.ip_address(addr_s)
        port = int(port_s)
    except ValueError as e:
        raise ValueError(f"bad host {host!r}: {e}") from None
    if not -(2**31) <= port < 2**31:
        raise ValueError(f"bad host {host!r}: port out of range")
    return addr.packed, port, addr.version == 6


def reference_format_host(addr: bytes, port: int) -> str:
    ip = ipaddress.ip_address(bytes(addr))
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _outcome(f: Callable[[str], object], host: str) -> object:
    try:
        return f(host)
    except ValueError as e:
        return ("ValueError", str(e))


v4 = st.binary(min_size=4, max_size=4)
v6 = st.binary(min_size=16, max_size=16) | st.builds(
    lambda b: bytes(10) + b"\xff\xff" + b, v4
)  # | IPv4-mapped, written with a dotted quad
ports = st.integers(-(2**31) - 2, 2**31 + 1).map(str) | st.sampled_from(["", "x", " 1", "1_0"])


@st.composite
def spelled(draw: st.DrawFn) -> str:
    """An address in one of its spellings: ipaddress's, exploded, upper case, with leading
    zeros or a zone; or text near one."""
    packed = draw(v4 | v6)
    ip = ipaddress.ip_address(packed)
    text = draw(
        st.sampled_from([str(ip), ip.exploded, str(ip).upper(), str(ip) + "%eth0"])
        | st.just(".".join(f"{b:03d}" for b in packed) if len(packed) == 4 else ip.exploded)
    )
    if draw(st.booleans()):
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.sampled_from(["", ".", ":", "0", "::", "\x00", " "])) + text[i:]
    port = draw(ports)
    return f"[{text}]:{port}" if ip.version == 6 and draw(st.booleans()) else f"{text}:{port}"


@given(spelled() | st.text(max_size=50))
@example("1.2.3.4:10911")
@example("[::1]:10911")
@example("[::ffff:1.2.3.4]:1")
@example("[::1.2.3.4]:1")
@example("01.2.3.4:1")
@example("[fe80::1%eth0]:1")
@example("1.2.3.4\x00:1")
def test_parse_host_is_its_ipaddress_reference(host: str) -> None:
    assert _outcome(recordcodes.parse_host, host) == _outcome(reference_parse_host, host)


@given(v4 | v6, st.integers(-(2**31), 2**31 - 1))
def test_format_host_is_its_ipaddress_reference(addr: bytes, port: int) -> None:
    assert recordcodes.format_host(addr, port) == reference_format_host(addr, port)
