-- Schema 9 (issue 14): a graph edge is a row of graph_edges only. Before, every edge was also a
-- searchable graph entry restating it ("Alice describes <fact>", "<fact> mentioned in <fact>"):
-- 54% of all entries, each indexing the fact's words again, so that a 3-word query matched a fifth
-- of graph_entries_fts. Recall hops along the edges themselves (sql/recall.sql via_edge).
-- Edge entries never had vectors (embedding_state 'skip'); their FTS rows go with them.
delete from graph_entries_fts where rowid in (select id from graph_entries where edge_id is not null);
delete from graph_vectors where entry_id in (select id from graph_entries where edge_id is not null);
delete from graph_entries where edge_id is not null;
insert into graph_entries_fts(graph_entries_fts) values ('optimize');
