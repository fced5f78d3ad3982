-- Schema 17: a transcript's progress is kept per source (issue 24). Keyed by path alone, a Codex
-- rollout that `ingest claude-code DIR` read (its name fits *.jsonl) and found no turn in was
-- marked read for every source, so `ingest codex DIR` never read it. The key is now (persona,
-- source, path): each source keeps its own offset in a file. A row kept from before stays its
-- source's; another source reads the file from the start (its turns are stored once each).
create table conv_files_17 (
    persona_id  text not null default '',
    path        text not null,
    source      text not null,
    size        integer not null,
    mtime_ns    integer not null,
    inode       integer not null default 0,
    head_bytes  integer not null,
    head_hash   text not null,
    offset      integer not null,
    session_id  text not null default '',
    project     text not null default '',
    updated_at  text not null,
    primary key (persona_id, source, path)
);
insert into conv_files_17(persona_id, path, source, size, mtime_ns, inode, head_bytes, head_hash, offset,
                          session_id, project, updated_at)
    select persona_id, path, source, size, mtime_ns, inode, head_bytes, head_hash, offset, session_id, project,
           updated_at from conv_files;
drop table conv_files;
alter table conv_files_17 rename to conv_files;
