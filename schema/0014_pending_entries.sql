-- Schema 14: graph entries awaiting a vector are found through a partial index (as documents'
-- are, documents_embedding_state), not by reading every entry: `stats` and the vector back-fill
-- counted them with a scan of graph_entries (53 ms each at 100k memories, 530k entries).
create index if not exists graph_entries_pending on graph_entries(embedding_state) where embedding_state = 'pending';
