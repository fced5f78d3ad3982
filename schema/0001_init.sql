-- Aokun schema 1: documents, memory atoms, knowledge graph, FTS5 indexes, write journal, meta.
-- Forward-only: never edit a released migration, add 0002_*.sql instead.
-- Times are ISO-8601 UTC text ('2026-11-30T08:15:00Z'); importance/confidence are 0..1.
-- FTS5 tables index text that Python pre-segmented with jieba (tokens joined by spaces), using the
-- built-in 'porter unicode61' tokenizer, so the sqlite3 shell can query them with MATCH.
-- The two vec0 tables (doc_vec, graph_vec) are created by aokun.py once the embedding dimension is
-- known (see sql/vectors.sql); they are not part of this ladder.

create table meta (
    key   text primary key,
    value text not null
);

-- Layer 1: one row per memory.
create table documents (
    id              integer primary key,
    uid             text not null unique,
    persona_id      text not null default '',
    session_id      text not null default '',
    content         text not null,
    content_hash    text not null,            -- sha256 of normalised content
    summary         text not null default '',
    topics          text not null default '[]' check (json_valid(topics)),
    key_facts       text not null default '[]' check (json_valid(key_facts)),
    participants    text not null default '[]' check (json_valid(participants)),
    tags            text not null default '[]' check (json_valid(tags)),
    sentiment       text not null default '',
    source          text not null default '',
    importance      real not null default 0.5 check (importance between 0 and 1),
    pinned          integer not null default 0 check (pinned in (0, 1)),
    archived        integer not null default 0 check (archived in (0, 1)),
    created_at      text not null,            -- when the remembered thing happened (metadata timestamp or insert time)
    updated_at      text not null,
    last_access_at  text,
    access_count    real not null default 0,
    -- 'done' vector stored; 'pending' awaiting (re)embedding; 'none' provider is none
    embedding_state text not null default 'pending' check (embedding_state in ('done', 'pending', 'none')),
    embedding_truncated integer not null default 0,
    unique (persona_id, content_hash)
);
create index documents_created on documents(persona_id, created_at);
create index documents_embedding_state on documents(embedding_state) where embedding_state = 'pending';

create virtual table documents_fts using fts5(segmented, tokenize = 'porter unicode61 remove_diacritics 2');

-- Layer 2: fine-grained facts with a type, a TTL and a state.
create table memory_atoms (
    id                  integer primary key,
    uid                 text not null unique,
    persona_id          text not null default '',
    document_id         integer not null references documents(id) on delete cascade,  -- first source
    atom_type           text not null check (atom_type in
                            ('factual', 'preference', 'relational', 'episodic', 'planned', 'emotional')),
    content             text not null,
    subject             text not null default '',
    confidence          real not null default 0.5 check (confidence between 0 and 1),
    importance          real not null default 0.5 check (importance between 0 and 1),
    base_ttl_days       real not null,
    reinforcement_count integer not null default 0,
    state               text not null default 'active' check (state in
                            ('active', 'dormant', 'expired', 'forgotten', 'superseded')),
    created_at          text not null,
    updated_at          text not null,
    last_reinforced_at  text not null,        -- TTL is measured from here
    expires_at          text not null,        -- last_reinforced_at + effective TTL
    state_changed_at    text not null,
    superseded_by       integer references memory_atoms(id) on delete set null
);
create index memory_atoms_state on memory_atoms(persona_id, state);
create index memory_atoms_document on memory_atoms(document_id);

-- Every document that stated (or reinforced) an atom. An atom lives while it has a source.
create table atom_sources (
    atom_id     integer not null references memory_atoms(id) on delete cascade,
    document_id integer not null references documents(id) on delete cascade,
    primary key (atom_id, document_id)
) without rowid;
create index atom_sources_document on atom_sources(document_id);

create virtual table memory_atoms_fts using fts5(segmented, tokenize = 'porter unicode61 remove_diacritics 2');

-- Layer 3: knowledge graph. Nodes are shared per persona; edges and entries belong to one document.
create table graph_nodes (
    id          integer primary key,
    uid         text not null unique,
    persona_id  text not null default '',
    node_type   text not null check (node_type in ('topic', 'person', 'fact')),
    value       text not null,
    canonical   text not null,
    created_at  text not null,
    updated_at  text not null,
    unique (persona_id, node_type, canonical)
);

create table graph_edges (
    id          integer primary key,
    uid         text not null unique,
    persona_id  text not null default '',
    document_id integer not null references documents(id) on delete cascade,
    source_id   integer not null references graph_nodes(id) on delete cascade,
    target_id   integer not null references graph_nodes(id) on delete cascade,
    relation    text not null check (relation in ('describes', 'mentioned_in', 'co_occurs_with')),
    confidence  real not null default 0.5,
    weight      real not null default 1.0,
    created_at  text not null,
    updated_at  text not null
);
create index graph_edges_document on graph_edges(document_id);
create index graph_edges_source on graph_edges(source_id);
create index graph_edges_target on graph_edges(target_id);

-- Searchable text for a node or an edge, tied back to its source memory.
create table graph_entries (
    id          integer primary key,
    uid         text not null unique,
    persona_id  text not null default '',
    session_id  text not null default '',
    document_id integer not null references documents(id) on delete cascade,
    node_id     integer references graph_nodes(id) on delete cascade,
    edge_id     integer references graph_edges(id) on delete cascade,
    text        text not null,
    confidence  real not null default 0.5,
    archived    integer not null default 0,
    embedding_state text not null default 'pending' check (embedding_state in ('done', 'pending', 'none', 'skip')),
    created_at  text not null,
    updated_at  text not null,
    check ((node_id is null) != (edge_id is null))
);
create index graph_entries_document on graph_entries(document_id);
create index graph_entries_node on graph_entries(node_id);

create virtual table graph_entries_fts using fts5(segmented, tokenize = 'porter unicode61 remove_diacritics 2');

-- The write journal: one row per memorize/edit, advancing through the pipeline stages.
create table memory_write_ops (
    id          integer primary key,
    op          text not null check (op in ('insert', 'edit')),
    document_id integer,
    persona_id  text not null default '',
    payload     text not null check (json_valid(payload)),
    status      text not null check (status in
                    ('pending', 'docs_done', 'atoms_done', 'graph_done', 'done', 'failed')),
    retries     integer not null default 0,
    error       text not null default '',
    created_at  text not null,
    updated_at  text not null
);
create index memory_write_ops_open on memory_write_ops(status) where status not in ('done', 'failed');

-- Deleted user rows, so two copies of the file can later be merged.
create table tombstones (
    uid         text primary key,
    table_name  text not null,
    deleted_at  text not null
);
