-- Counts and consistency checks behind `python aokun.py stats` and `python aokun.py doctor`; what recovery at open
-- and `python aokun.py rebuild` read.
-- Every query runs as-is in the sqlite3 shell (the *_vector_* ones need vec0 loaded).

-- name: stats_counts
-- One row of counts across the three layers, their FTS indexes and the journal.
select
    (select count(*) from documents)                               as documents,
    (select count(*) from documents where archived = 1)            as archived,
    (select count(*) from documents where pinned = 1)              as pinned,
    (select count(*) from documents_fts)                           as documents_fts,
    (select count(*) from documents where embedding_state = 'pending' and embedding_error is null) as documents_awaiting_vectors,
    (select count(*) from documents where embedding_state = 'pending' and embedding_error is not null) as documents_refused_vectors,
    (select count(*) from memory_atoms)                            as atoms,
    (select count(*) from memory_atoms_fts)                        as atoms_fts,
    (select count(*) from graph_nodes)                             as graph_nodes,
    (select count(*) from graph_edges)                             as graph_edges,
    (select count(*) from graph_entries)                           as graph_entries,
    (select count(*) from graph_entries_fts)                       as graph_entries_fts,
    (select count(*) from graph_entries where embedding_state = 'pending' and embedding_error is null) as graph_entries_awaiting_vectors,
    (select count(*) from graph_entries where embedding_state = 'pending' and embedding_error is not null) as graph_entries_refused_vectors,
    (select count(*) from tombstones)                              as tombstones;

-- name: stats_vector_counts
select
    (select count(*) from doc_vectors)   as doc_vectors,
    (select count(*) from graph_vectors) as graph_vectors,
    (select count(*) from doc_vec)       as doc_index_rows,
    (select count(*) from graph_vec)     as graph_index_rows;

-- name: stats_atoms_by_state
select state, count(*) as n from memory_atoms group by state order by state;

-- name: stats_atoms_by_type
select atom_type, count(*) as n from memory_atoms where state = 'active' group by atom_type order by atom_type;

-- name: stats_journal
select status, count(*) as n from memory_write_ops group by status order by status;

-- name: doctor_checks
-- One row per kind of inconsistency; n > 0 is a problem.
select 'documents without an FTS row' as problem,
       count(*) as n from documents where id not in (select rowid from documents_fts)
union all
select 'FTS rows without a document',
       count(*) from documents_fts where rowid not in (select id from documents)
union all
select 'atoms (not forgotten) without an FTS row',
       count(*) from memory_atoms where state != 'forgotten' and id not in (select rowid from memory_atoms_fts)
union all
select 'atom FTS rows without a live atom',
       count(*) from memory_atoms_fts where rowid not in (select id from memory_atoms where state != 'forgotten')
union all
select 'atoms without a source document',
       count(*) from memory_atoms where id not in (select atom_id from atom_sources)
union all
select 'graph entries without an FTS row',
       count(*) from graph_entries where id not in (select rowid from graph_entries_fts)
union all
select 'graph entry FTS rows without an entry',
       count(*) from graph_entries_fts where rowid not in (select id from graph_entries)
union all
select 'graph nodes used by no entry or edge',
       count(*) from graph_nodes n where not exists (select 1 from graph_entries e where e.node_id = n.id)
                                   and not exists (select 1 from graph_edges g where n.id in (g.source_id, g.target_id))
union all
select 'unfinished writes in the journal (finished at next start)',
       count(*) from memory_write_ops where status not in ('done', 'failed')
union all
select 'failed writes in the journal (see memory_write_ops.error)',
       count(*) from memory_write_ops where status = 'failed'
union all
select 'documents awaiting vectors (a running server back-fills them once the embedder answers; '
       || '`python aokun.py rebuild --vectors` re-embeds everything now)',
       count(*) from documents where embedding_state = 'pending' and embedding_error is null;

-- name: vectors_refused
-- The documents and graph entries whose text the embedding provider refused for good (no vector;
-- the reason in embedding_error), the first :n of each kind by id, and how many there are (total).
select 'memory' as kind, id, embedding_error as error, (select count(*) from documents
       where embedding_state = 'pending' and embedding_error is not null) as total
from (select id, embedding_error from documents where embedding_state = 'pending' and embedding_error is not null
      order by id limit :n)
union all
select 'graph entry', id, embedding_error, (select count(*) from graph_entries
       where embedding_state = 'pending' and embedding_error is not null)
from (select id, embedding_error from graph_entries where embedding_state = 'pending' and embedding_error is not null
      order by id limit :n);

-- name: doctor_vector_checks
select 'documents marked embedded without a vector' as problem,
       count(*) as n from documents where embedding_state = 'done' and id not in (select doc_id from doc_vectors)
union all
select 'document vectors missing from the KNN index (run `python aokun.py rebuild --vectors`)',
       count(*) from doc_vectors where doc_id not in (select doc_id from doc_vec)
union all
select 'KNN index rows without a document vector',
       count(*) from doc_vec where doc_id not in (select doc_id from doc_vectors)
union all
select 'graph entries marked embedded without a vector',
       count(*) from graph_entries where embedding_state = 'done' and id not in (select entry_id from graph_vectors)
union all
select 'graph vectors missing from the KNN index (run `python aokun.py rebuild --vectors`)',
       count(*) from graph_vectors where entry_id not in (select entry_id from graph_vec)
union all
select 'graph KNN index rows without an entry vector',
       count(*) from graph_vec where entry_id not in (select entry_id from graph_vectors)
union all
-- a NaN, infinite or all-zero vector (int8: all zeros) compares with nothing: its distance is NULL
select 'unusable (NaN or all-zero) document vectors, never found by meaning '
       || '(run `python aokun.py rebuild --vectors`)',
       count(*) from doc_vectors where vec_distance_cosine(vec_int8(embedding), vec_int8(embedding)) is null
union all
select 'unusable (NaN or all-zero) graph entry vectors, never found by meaning '
       || '(run `python aokun.py rebuild --vectors`)',
       count(*) from graph_vectors where vec_distance_cosine(vec_int8(embedding), vec_int8(embedding)) is null;

-- name: journal_unfinished
-- Recovery at open (Journal.recover, also behind `python aokun.py rebuild --fts`) reads this and the three
-- *_missing_fts queries. This one: the journal rows of writes not finished yet (crashed, or still
-- running in another process), oldest first, with their payload (memory_write_payloads since schema
-- 11; rows written before it kept theirs in memory_write_ops).
select w.id, w.op, w.document_id, w.persona_id, w.status, w.retries, w.error, w.created_at, w.updated_at,
       w.owner, coalesce(p.payload, w.payload) as payload
from memory_write_ops w left join memory_write_payloads p on p.op_id = w.id
where w.status not in ('done', 'failed') order by w.id;

-- name: documents_missing_fts
-- Documents without an FTS row (re-segmented by recovery; `rebuild --fts` empties the FTS tables).
select * from documents where id not in (select rowid from documents_fts);

-- name: graph_entries_missing_fts
-- Graph entries without an FTS row.
select * from graph_entries where id not in (select rowid from graph_entries_fts);

-- name: atoms_missing_fts
-- Atoms (not forgotten: those have none on purpose) without an FTS row.
select * from memory_atoms where state != 'forgotten' and id not in (select rowid from memory_atoms_fts);

-- name: conv_turns_missing_fts
-- Conversation turns without an FTS row (a salvaged file's; `rebuild --fts`).
select * from conv_turns where id not in (select rowid from conv_turns_fts);

-- name: all_document_ids
-- Every document, by id (`rebuild --graph` re-derives each one's atoms and graph).
select id from documents order by id;

-- name: restore_only_in_previous
-- During a restore: the memories of the current file (main) that the backup about to replace it
-- (attached as `restored`) lacks (added after the backup) or holds in another version (changed
-- after it); they stay only in the safety copy. In the shell: attach 'backup.db' as restored;
select p.id, case when r.id is null then 'added' else 'changed' end as change
from main.documents p
left join restored.documents r on r.uid = p.uid
where r.id is null or r.updated_at is not p.updated_at
order by p.id;

-- name: pending_vectors
-- What /health reports as pending_vectors: memories and graph entries waiting for a vector that the
-- back-fill can still make (pending, not refused by the provider).
select (select count(*) from documents where embedding_state = 'pending' and embedding_error is null)
     + (select count(*) from graph_entries where embedding_state = 'pending' and embedding_error is null);
