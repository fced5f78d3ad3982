"""End-to-end encrypted sync (issue 33 item 12), on real files and a real shared folder: with a
[sync] passphrase (or $AOKUN_SYNC_KEY) every changeset is AES-256-GCM under a key from scrypt, so
the folder holds none of the text; the devices with that passphrase merge as before; a wrong
passphrase, none, or an unencrypted file while one is set is one line and nothing applied."""

import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from test_sync import memories

import aokun

pytestmark = pytest.mark.slow  # scrypt and a child process: about 2 s

SECRET = "Alice's locker code is 4711; 小王的护照号码是 E12345678"


def device(open_mem, tmp: Path, name: str, passphrase: str = ""):
    ini = tmp / f"{name}.ini"
    ini.write_text(f"[sync]\npassphrase = {passphrase}\npassphrase_env = AOKUN_TEST_NO_KEY\n",
                   encoding="utf-8")
    return open_mem(tmp / f"{name}.db", cfg=aokun.Config(ini))


def skipped(report: dict, name: str) -> str:
    return {x["file"]: x["reason"] for x in report["skipped"]}[name]


def test_an_encrypted_folder_holds_no_text_and_needs_the_passphrase(tmp_path, open_mem):
    share = tmp_path / "share"
    share.mkdir()
    a = device(open_mem, tmp_path, "a", "correct horse battery")
    uid = a.memorize(SECRET, {"tags": ["locker"]})["uid"]
    name = a.sync(share)["written"]
    head, _, payload = (share / name).read_bytes().partition(b"\n")
    h = json.loads(head)
    assert h["encryption"]["cipher"] == "AES-256-GCM" and h["encryption"]["kdf"] == "scrypt"
    for needle in ("4711", "locker", "护照", "Alice"):
        assert needle.encode() not in payload and needle not in head.decode()
    with pytest.raises(zlib.error):
        zlib.decompress(payload)
    for key, why in (("", "encrypted: set [sync] passphrase or $AOKUN_SYNC_KEY"),
                     ("Correct horse battery", "cannot be decrypted with this device's sync "
                                               "passphrase")):
        other = device(open_mem, tmp_path, f"wrong{len(key)}", key)
        other.memorize(f"written where the key is {key!r}")
        with pytest.raises(aokun.AokunError, match=re.escape(why)) as e:
            other.sync(share)  # nothing written: sealed wrongly, or plain, it would be stranded
        assert "\n" not in str(e.value) and "nothing sent" in str(e.value)
        assert uid not in memories(other) and [f.name for f in share.iterdir()] == [name]
    b = device(open_mem, tmp_path, "b", "correct horse battery")
    r = b.sync(share)
    assert r["applied"] == [name] and memories(b)[uid] == SECRET
    # altered (its checksum made again), or copied under another device's id: not decrypted
    (share / name).unlink()
    flipped = payload[:-1] + bytes([payload[-1] ^ 1])
    stranger = "0b6f9c1e-0000-4000-8000-00000000000c"
    for file, head2, body in (("y.changeset", h | {"sha256": aokun.hashlib.sha256(
            flipped).hexdigest()}, flipped), ("z.changeset", h | {"device": stranger}, payload)):
        (share / file).write_bytes(json.dumps(head2).encode() + b"\n" + body)
    c = device(open_mem, tmp_path, "c", "correct horse battery")
    with pytest.raises(aokun.AokunError, match="cannot be decrypted"):
        c.sync(share)  # what it cannot read, it does not answer
    assert uid not in memories(c) and len(list(share.iterdir())) == 2


def test_an_unencrypted_file_is_not_applied_where_a_passphrase_is_set(tmp_path, open_mem):
    share = tmp_path / "share"
    share.mkdir()
    plain = device(open_mem, tmp_path, "plain")
    uid = plain.memorize("Written by a device without a passphrase", {})["uid"]
    name = plain.sync(share)["written"]
    payload = (share / name).read_bytes().split(b"\n", 1)[1]
    assert b"without a passphrase" in zlib.decompress(payload)
    keyed = device(open_mem, tmp_path, "keyed", "s3cret words")
    with pytest.raises(aokun.AokunError, match="not encrypted, but this device has a sync pass"):
        keyed.sync(share)
    assert uid not in memories(keyed) and [f.name for f in share.iterdir()] == [name]


def test_the_passphrase_from_the_environment_in_the_cli(tmp_path):
    """`sync` in child processes, the passphrase in $AOKUN_SYNC_KEY: a wrong one is one line on
    stderr, no traceback, nothing applied; the right one applies."""
    share = tmp_path / "share"
    share.mkdir()
    ini = tmp_path / "aokun.ini"
    ini.write_text("[embedding]\nprovider = none\n[backup]\ndaily = false\n"
                   "[conversations]\nwatch = false\n", encoding="utf-8")

    def cli(db: str, key: str, *args, rc: int = 0) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AOKUN_")}
        r = subprocess.run([sys.executable, aokun.__file__, "--db", str(tmp_path / db),
                            "--config", str(ini), *args], env=env | {"AOKUN_SYNC_KEY": key},
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert r.returncode == rc and "Traceback" not in r.stderr, r.stderr
        return r
    cli("a.db", "k1 k1", "memorize", SECRET)
    cli("a.db", "k1 k1", "sync", str(share))
    cli("b.db", "k2", "memorize", "b's own memory")
    wrong = cli("b.db", "k2", "sync", str(share), rc=1)
    [line] = [x for x in wrong.stderr.splitlines() if x.startswith("Error")]
    assert "cannot be decrypted" in line and len(list(share.iterdir())) == 1
    assert "4711" not in cli("b.db", "k2", "list").stdout
    assert "applied 1 file(s)" in cli("b.db", "k1 k1", "sync", str(share)).stdout
    assert "4711" in cli("b.db", "k1 k1", "list").stdout
    cli("a.db", "k1 k1", "sync", str(share))  # b's memory, written under the wrong key, arrives
    assert "b's own memory" in cli("a.db", "k1 k1", "list").stdout
