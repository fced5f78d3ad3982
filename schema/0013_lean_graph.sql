-- Schema 13: the graph-entry keyword index keeps no copy of its text (issue 14).
-- graph_entries.text is the entry's text; graph_entries_fts held a second copy of it, segmented,
-- that nothing reads (only bm25 ranks and rowids are used). A contentless FTS5 table
-- (content = '') with contentless_delete = 1 (SQLite 3.43+) keeps the index alone and still
-- deletes by rowid. The index itself is copied over unchanged: the segmented text is read from
-- the old table once, so no re-segmentation is needed.
-- In the sqlite3 shell a contentless table answers MATCH, rank and rowid; its column reads NULL.
create virtual table graph_entries_fts_lean using fts5(
    segmented, content = '', contentless_delete = 1, tokenize = 'porter unicode61 remove_diacritics 2');
insert into graph_entries_fts_lean(rowid, segmented) select rowid, segmented from graph_entries_fts;
drop table graph_entries_fts;
alter table graph_entries_fts_lean rename to graph_entries_fts;

-- The graph tables lose their uid, created_at and updated_at columns: the graph is derived from
-- the memories (rebuild --graph re-derives it; export and sync never carry it), so its rows need no
-- identity across files, and nothing read their times. About 1 KB per memory at 100k memories.
-- Dropping a UNIQUE column needs a table rebuild: migrate() runs every migration with
-- foreign_keys off and checks them (foreign_key_check) before committing, SQLite's documented
-- procedure, so dropping the old tables cascades to nothing.
create table graph_nodes_lean (
    id          integer primary key,
    persona_id  text not null default '',
    node_type   text not null check (node_type in ('topic', 'person', 'fact')),
    value       text not null,
    canonical   text not null,
    unique (persona_id, node_type, canonical)
);
insert into graph_nodes_lean(id, persona_id, node_type, value, canonical)
select id, persona_id, node_type, value, canonical from graph_nodes;

create table graph_edges_lean (
    id          integer primary key,
    persona_id  text not null default '',
    document_id integer not null references documents(id) on delete cascade,
    source_id   integer not null references graph_nodes(id) on delete cascade,
    target_id   integer not null references graph_nodes(id) on delete cascade,
    relation    text not null check (relation in ('describes', 'mentioned_in', 'co_occurs_with')),
    confidence  real not null default 0.5,
    weight      real not null default 1.0
);
insert into graph_edges_lean(id, persona_id, document_id, source_id, target_id, relation, confidence, weight)
select id, persona_id, document_id, source_id, target_id, relation, confidence, weight from graph_edges;

create table graph_entries_lean (
    id              integer primary key,
    persona_id      text not null default '',
    session_id      text not null default '',
    document_id     integer not null references documents(id) on delete cascade,
    node_id         integer references graph_nodes(id) on delete cascade,
    edge_id         integer references graph_edges(id) on delete cascade,
    text            text not null,
    confidence      real not null default 0.5,
    archived        integer not null default 0,
    embedding_state text not null default 'pending' check (embedding_state in ('done', 'pending', 'none', 'skip')),
    embedding_error text,
    check ((node_id is null) != (edge_id is null))
);
insert into graph_entries_lean(id, persona_id, session_id, document_id, node_id, edge_id, text, confidence, archived,
                               embedding_state, embedding_error)
select id, persona_id, session_id, document_id, node_id, edge_id, text, confidence, archived, embedding_state,
       embedding_error
from graph_entries;

drop table graph_entries;
drop table graph_edges;
drop table graph_nodes;
alter table graph_nodes_lean rename to graph_nodes;
alter table graph_edges_lean rename to graph_edges;
alter table graph_entries_lean rename to graph_entries;
create index graph_edges_document on graph_edges(document_id);
create index graph_edges_source on graph_edges(source_id);
create index graph_edges_target on graph_edges(target_id);
create index graph_entries_document on graph_entries(document_id);
create index graph_entries_node on graph_entries(node_id);
