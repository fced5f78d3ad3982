-- Schema 12: sync between devices through a shared folder (issue 16; aokun.py "Sync" section).
-- The state is private to this file and never written into the shared folder. It lives in the file
-- (not beside it) so every sync step commits together with the memories it changed, and a backup
-- or copy of the file carries the sync state that matches its content.

-- What this file held as of its last sync, per synced record (kind and key as in the JSONL export:
-- the uid, a consolidation's survivor uid), by its stamp (updated_at, a turn's or consolidation's
-- created_at, a tombstone's deleted_at) and the hash of its content (times and usage counts left
-- out). A record whose stamp or hash differs from the one here is a change the next changeset carries.
create table if not exists sync_base (
    kind  text not null,
    uid   text not null,
    stamp text not null,
    hash  text not null,
    primary key (kind, uid)
) without rowid;

-- Changeset files applied here (this device's own included, marked when written), by device id
-- and sequence number; the files of each device are applied in sequence order.
create table if not exists sync_applied (
    device     text not null,
    seq        integer not null,
    applied_at text not null,
    primary key (device, seq)
) without rowid;

-- Versions that lost a conflict: both sides changed the same record since they last synced; the
-- later stamp won and the other version is kept here, whole, for `sync --conflicts`.
create table if not exists sync_conflicts (
    id           integer primary key,
    kind         text not null,
    uid          text not null,
    persona_id   text,
    winner_stamp text not null,
    loser_stamp  text not null,
    loser_from   text not null,                           -- the device id the losing version came from
    loser        text not null check (json_valid(loser)),  -- the losing record, as an export record
    detected_at  text not null,
    unique (kind, uid, loser_stamp)
);
