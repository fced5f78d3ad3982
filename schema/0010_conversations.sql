-- Schema 10: the conversation layer. Client transcripts (Claude Code, Codex, Copilot CLI, a ChatGPT
-- export) ingested as sessions and turns, kept apart from the curated memories (documents): their
-- own FTS5 index and vectors, so bulk history never drowns what was deliberately memorized.
-- Texts are stored after the per-source rules (rules/ingest/*.toml) and secret redaction
-- (rules/secrets.toml). persona_id separates them like memories.

-- One session (a transcript) of a client. session_id is the client's id.
create table conv_sessions (
    id                 integer primary key,
    uid                text not null unique,
    persona_id         text not null default '',
    source             text not null,                 -- claude-code, codex, copilot, chatgpt
    session_id         text not null,
    project            text not null default '',      -- the working folder (cwd) or project
    title              text not null default '',
    first_user_message text not null default '',
    started_at         text not null,
    ended_at           text not null,
    turn_count         integer not null default 0,
    created_at         text not null,
    updated_at         text not null,
    unique (persona_id, source, session_id)
);
create index conv_sessions_recent on conv_sessions(persona_id, ended_at);

-- What the user said and what the assistant answered, in session order (seq: the record's byte
-- offset in its file, or its place in a ChatGPT conversation). turn_key is the client's record
-- uuid, or 'L<byte offset>' when the record has none: (session, turn_key) is the turn's identity,
-- so ingesting a file again cannot duplicate a turn.
create table conv_turns (
    id              integer primary key,
    uid             text not null unique,
    session_ref     integer not null references conv_sessions(id) on delete cascade,
    persona_id      text not null default '',
    source          text not null,
    turn_key        text not null,
    seq             integer not null,
    role            text not null check (role in ('user', 'assistant')),
    created_at      text not null,
    text            text not null,
    -- 'done' vector stored; 'pending' awaiting one; 'none' provider is none
    embedding_state text not null default 'pending' check (embedding_state in ('done', 'pending', 'none')),
    unique (session_ref, turn_key)
);
create index conv_turns_order on conv_turns(session_ref, seq, id);
create index conv_turns_time on conv_turns(persona_id, created_at);
create index conv_turns_pending on conv_turns(embedding_state) where embedding_state = 'pending';

create virtual table conv_turns_fts using fts5(segmented, tokenize = 'porter unicode61 remove_diacritics 2');

-- The float vector of each turn (float32, meta embedding_dim values); the binary KNN index over
-- them, conv_turn_vec (vec0), is created by aokun.py once the dimension is known (sql/conversations.sql).
create table conv_turn_vectors (
    turn_id   integer primary key references conv_turns(id) on delete cascade,
    embedding blob not null
);

-- How far each transcript file has been ingested: the byte offset read up to, and what identifies
-- the file (size, and a hash of its first head_bytes bytes: a file replaced by another is read
-- from the start). session_id/project carry what earlier records said to the records after them.
create table conv_files (
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
    primary key (persona_id, path)
);
