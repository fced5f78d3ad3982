-- Sync between devices (aokun.py "Sync" section): this file's side of the changeset files in a
-- shared folder. Records are keyed by (kind, uid) as in the JSONL export; see schema/0012_sync.sql.

-- name: sync_base_all
-- Every synced record's stamp, hash and usage hash as of the last sync: what the next changeset is
-- computed against.
select kind, uid, stamp, hash, usage from sync_base;

-- name: sync_base_set
-- Record that (kind, uid) is at version (:stamp, :hash) with usage :usage here and there (sent, or
-- received and merged).
insert into sync_base(kind, uid, stamp, hash, usage) values (:kind, :uid, :stamp, :hash, :usage)
on conflict(kind, uid) do update
set stamp = excluded.stamp, hash = excluded.hash, usage = excluded.usage;

-- name: sync_base_drop
delete from sync_base where kind = :kind and uid = :uid;

-- name: sync_applied_all
-- The changeset files applied here (this device's own included), (device, seq, sha256 of the payload;
-- '' from before schema 18: any content of that number).
select device, seq, sha256 from sync_applied;

-- name: sync_applied_add
insert or ignore into sync_applied(device, seq, sha256, applied_at) values (:device, :seq, :sha256, :now);

-- name: sync_conflict_add
-- A losing version; one row per (kind, uid, losing stamp), so applying a file again adds nothing.
insert or ignore into sync_conflicts(kind, uid, persona_id, winner_stamp, loser_stamp, loser_from, loser, detected_at)
values (:kind, :uid, :persona_id, :winner_stamp, :loser_stamp, :loser_from, :loser, :now);

-- name: sync_conflicts_list
-- The kept losing versions, newest first; :persona null = every persona (a tombstone names none).
select id, kind, uid, persona_id, winner_stamp, loser_stamp, loser_from, loser, detected_at
from sync_conflicts
where :persona is null or persona_id = :persona
order by detected_at desc, id desc
limit :limit;

-- name: sync_consolidation_drop
-- A consolidation undone on another device: gone here too unless this file recorded another since.
delete from consolidations
where survivor_id = (select id from documents where uid = :uid) and created_at = :stamp;

-- name: sync_twin
-- The memory of :persona other than :uid whose content has hash :hash (a persona holds a text
-- once): the twin here of a memory of that text another device wrote apart.
select id, uid from documents where persona_id = :persona and content_hash = :hash and uid != :uid;
