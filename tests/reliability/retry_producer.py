"""A producer that retries every put until PUT_OK with the client's own helper.

`python -m tests.reliability.retry_producer DIR TAG N OUT` attaches and puts messages
0..N-1 of producer TAG (SYNC_FLUSH, each with the client's next UNIQ_KEY): the first try
with `put`, then, unless it answered PUT_OK, `put_until_ok` with the same key (which
re-attaches to a restarted supervisor). One line per message goes to OUT:
`<index> <physical_offset> <uniq_key> <first status> <final reason> <first reason>`; `DONE` last.
"""

from __future__ import annotations

import sys

from mqstore import StoreClient
from mqstore.ipc.results import PutMessageStatus
from tests.reliability.workload import message

OK = PutMessageStatus.PUT_OK


def main(store_dir: str, tag: str, n: int, out_path: str) -> None:
    with StoreClient.attach(store_dir, timeout_s=60) as client, open(out_path, "w") as out:
        for i in range(n):
            m = message(tag, i)
            props = {"UNIQ_KEY": client.new_uniq_key()}
            args = (m["topic"], m["body"])
            kw = {
                "tags": m["tags"],
                "keys": m["keys"],
                "queue_id": m["queue_id"],
                "properties": props,
            }
            first = client.put(*args, **kw)  # type: ignore[arg-type]
            final = first
            if first.status is not OK:
                final = client.put_until_ok(*args, **kw, timeout_s=None)  # type: ignore[arg-type]
            assert final.status is OK, final
            reason = final.reason.split(":")[0].replace(" ", "_") or "-"
            why = "_".join(first.reason.split()) or "-"
            out.write(
                f"{i} {final.physical_offset} {final.uniq_key} {first.status.value} {reason} "
                f"{why}\n"
            )
            out.flush()
        out.write("DONE\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
