"""The build of the C extension `mqstore._native` (issue 12); metadata is pyproject.toml's.

It needs a C compiler (gcc or clang) and the Python headers (`python3-dev` on Debian).
`MQSTORE_SANITIZE=1` builds it with AddressSanitizer and UndefinedBehaviorSanitizer
(`make sanitize`); `MQSTORE_NATIVE_DEBUG=1` without optimisation.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

SOURCES = [
    "mqstore/_native.c",
    "engine/native/mqs_engine_py.c",
    "engine/native/mqs_args.c",
    "engine/native/mqs_crc32.c",
    "engine/native/mqs_record.c",
    "engine/native/mqs_record_py.c",
    "ipc/native/mqs_ipc_py.c",
    "ipc/native/mqs_append.c",
    "ipc/native/mqs_crashpoint.c",
    "ipc/native/mqs_futex.c",
    "ipc/native/mqs_live.c",
    "ipc/native/mqs_put.c",
    "ipc/native/mqs_uniq.c",
    "ipc/native/mqs_fields.c",
    "ipc/native/mqs_compress.c",
    "ipc/native/mqs_round.c",
    "ipc/native/mqs_control_py.c",
    "ipc/native/mqs_group_ack.c",
    "engine/native/mqs_scan.c",
    "engine/native/mqs_scan_py.c",
    "engine/native/mqs_pull.c",
    "engine/native/mqs_pull_py.c",
    "engine/native/mqs_index.c",
    "engine/native/mqs_cq.c",
    "engine/native/mqs_dispatch_round.c",
    "engine/native/mqs_verify.c",
    "engine/native/mqs_verify_py.c",
]
NATIVE_DIRS = ["ipc/native", "engine/native"]

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
            include_dirs=NATIVE_DIRS,
            depends=[f"{d}/{n}" for d in NATIVE_DIRS for n in os.listdir(d) if n.endswith(".h")],
            extra_compile_args=cflags,
            extra_link_args=ldflags,
        )
    ]
)
