"""The settings reference page, `docs/settings.md`, generated from `conf.settings`.

    python -m mqstore.conf.reference > docs/settings.md

A test fails when the committed page and the settings part ways.
"""

from __future__ import annotations

from mqstore.conf.settings import settings_reference_markdown

HEADER = """# Settings reference

Generated from `conf/settings.py` (`python -m mqstore.conf.reference > docs/settings.md`); a test
keeps it in step. Names carry their unit. Defaults are RocketMQ 4.9.8's, except the sizes
marked LAPTOP, which are small enough for a laptop. A setting comes from, lowest precedence
first: its default; a TOML file (`[store]` table, these names) or a RocketMQ `broker.conf`
(the RocketMQ key; 4.x's `maped` spelling is accepted); the environment
(`MQSTORE_<NAME>`, upper case). `mqstore config show DIR` prints the effective values and
where each came from. Values out of range are refused with the key, the value, its source
and what is allowed; so are unknown keys (with the closest known ones: a `broker.conf` may
hold any RocketMQ key, see [broker-conf.md](broker-conf.md)), an `MQSTORE_` variable that is
neither a setting nor one of the fault and test switches (`conf/load.py`'s
`NON_SETTING_ENV`), and a config file that cannot be read. `mqstore start` and
`config show` exit 3 on any of them.

Four settings are the store's geometry, which its files are laid out by:
`segment_size_bytes`, `consume_queue_file_size_bytes`, `max_hash_slot_num` and
`max_index_num`. The store records them in `config/geometry.json` at its first start
(`engine/geometry.py`; a RocketMQ store gets the record at the first start that opens it,
once its files agree with the settings), and from then on a start with another value
exits 3 naming the setting, the recorded value and the value given (a worker restarted
after the config file changed warns and keeps the recorded value).
Clients take them from the supervisor; `check`, `dump`, `recover` and the offline readers
read the record, whatever the settings say. See [durability.md](durability.md#the-trust-model).

"""


def page() -> str:
    return HEADER + settings_reference_markdown()


if __name__ == "__main__":
    print(page(), end="")
