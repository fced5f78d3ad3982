-- Schema 18: a changeset file is known by its header, not its name (issue 24 item 6). Two copies of
-- one file that both wrote under one device id, or a sync tool that renamed a file
-- (…-00000002.sync-conflict-….changeset), make the (device, seq) of a name ambiguous: a file applied
-- here is now recorded with the SHA-256 its header names. A row from before has '' there and
-- stands for every content of its (device, seq).
create table sync_applied_18 (
    device     text not null,
    seq        integer not null,
    sha256     text not null default '',
    applied_at text not null,
    primary key (device, seq, sha256)
) without rowid;
insert into sync_applied_18(device, seq, sha256, applied_at)
    select device, seq, '', applied_at from sync_applied;
drop table sync_applied;
alter table sync_applied_18 rename to sync_applied;
