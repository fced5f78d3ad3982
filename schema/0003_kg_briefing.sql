-- Schema 3: temporal knowledge-graph triples, the session briefing, consolidation history.

-- Entities of the fact store (resolved like graph nodes: case, whitespace, rules/aliases.toml).
create table kg_entities (
    id          integer primary key,
    uid         text not null unique,
    persona_id  text not null default '',
    name        text not null,
    canonical   text not null,
    created_at  text not null,
    updated_at  text not null,
    unique (persona_id, canonical)
);

-- subject —predicate→ object, true from valid_from until valid_to (null = still true).
create table kg_triples (
    id               integer primary key,
    uid              text not null unique,
    persona_id       text not null default '',
    subject_id       integer not null references kg_entities(id),
    predicate        text not null,
    object_id        integer not null references kg_entities(id),
    valid_from       text not null,
    valid_to         text,
    confidence       real not null default 1.0 check (confidence between 0 and 1),
    source_memory_id integer references documents(id) on delete set null,
    created_at       text not null,
    updated_at       text not null,
    check (valid_to is null or valid_to >= valid_from)
);
create index kg_triples_subject on kg_triples(persona_id, subject_id, predicate);
create index kg_triples_object on kg_triples(persona_id, object_id);

-- The pre-built session briefing per persona, served by memory_context() without a topic.
create table briefings (
    persona_id   text primary key,
    text         text not null,
    tokens       integer not null,
    generated_at text not null,
    stale        integer not null default 0
);

-- Consolidation: which memories were merged into which survivor, and the survivor's metadata
-- before the merge, so restore_memory(survivor) can undo it.
create table consolidations (
    survivor_id    integer primary key references documents(id) on delete cascade,
    previous       text not null check (json_valid(previous)),
    members        text not null check (json_valid(members)),
    created_at     text not null
);
alter table documents add column merged_into integer references documents(id) on delete set null;
