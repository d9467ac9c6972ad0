"""The build of the C extension `mqstore._native` (issue 12); metadata is pyproject.toml's.

It needs a C compiler (gcc or clang) and the Python headers (`python3-dev` on Debian).
`MQSTORE_SANITIZE=1` builds it with AddressSanitizer and UndefinedBehaviorSanitizer
(`make sanitize`); `MQSTORE_NATIVE_DEBUG=1` without optimisation.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

SOURCES = [
    "native/mqs_module.c",
    "native/mqs_args.c",
    "native/mqs_crc32.c",
    "native/mqs_record.c",
    "native/mqs_append.c",
    "native/mqs_crashpoint.c",
    "native/mqs_futex.c",
    "native/mqs_live.c",
]

cflags = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-fno-strict-aliasing"]
ldflags: list[str] = []
if os.environ.get("MQSTORE_SANITIZE") == "1":
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
    cflags = [*cflags, *san, "-fno-omit-frame-pointer", "-O1", "-g"]
    ldflags = san
elif os.environ.get("MQSTORE_NATIVE_DEBUG") == "1":
    cflags = [*cflags, "-O0", "-g"]

setup(
    ext_modules=[
        Extension(
            "mqstore._native",
            sources=SOURCES,
            depends=[f"native/{n}" for n in os.listdir("native") if n.endswith(".h")],
            extra_compile_args=cflags,
            extra_link_args=ldflags,
        )
    ]
)
