-- Vector storage (sqlite-vec 0.1.9). The vectors live in plain tables doc_vectors and graph_vectors
-- (schema/0006) as int8, one byte per dimension (schema/0011, meta vector_format = 'int8'): the unit
-- float vector v scaled by 127 / max|v| and rounded (aokun.vector_blob). Cosine does not see the
-- scale, so vec_distance_cosine(vec_int8(embedding), vec_int8(:query_i8)) is the float vectors'
-- within ~1e-3 (LoCoMo: top-10 overlap with float32 0.99), at 384 bytes for 384 dimensions instead of
-- 1,536 (a float32 row took 2,053 bytes of a page, an int8 row ~410). Read one in the shell with
-- vec_to_json(vec_int8(embedding)). doc_vec and graph_vec are vec0 tables holding a binary-quantised
-- copy (one bit per dimension, 48 bytes) with the filter columns as vec0 metadata columns, so
-- filtered KNN happens inside SQL; recall takes the nearest by Hamming distance there and re-scores
-- them by cosine distance from the int8 vectors (sql/recall.sql).
--
-- Bits are taken after subtracting meta('vector_center'), the mean of the stored document vectors
-- (hex of float32; set once 256 exist, recomputed by `python aokun.py rebuild --vectors`): e5-style
-- embeddings share a large common component, so plain sign bits barely separate them (LoCoMo
-- top-10 overlap with exact KNN 0.69 uncentred vs 0.97 centred at 100 candidates). The bits are
-- made from the float vector (:embedding, float32) when it is stored, or re-made from the stored
-- int8 one (aokun turns it back into a unit float32 vector) when the centre changes.
--
-- aokun.py substitutes {dim} with meta('embedding_dim'); in the shell first run
-- `.load <path to vec0>` (python -c "import sqlite_vec; print(sqlite_vec.loadable_path())").
-- vec0 metadata filters accept = != < <= > >= only, so "no session" is stored as ''.

-- name: create_doc_vec
create virtual table if not exists doc_vec using vec0(
    doc_id integer primary key,
    embedding bit[{dim}],
    persona_id text,
    session_id text,
    archived integer
);

-- name: create_graph_vec
create virtual table if not exists graph_vec using vec0(
    entry_id integer primary key,
    embedding bit[{dim}],
    persona_id text,
    session_id text,
    archived integer
);

-- name: put_doc_vector
-- Store one document vector, :stored (int8, see above); index_doc_vector then makes its index row.
insert or replace into doc_vectors(doc_id, embedding) values (:id, :stored);

-- name: index_doc_vector
-- (Re)make document :id's index row from :embedding (float32): put_doc_vector without the store.
delete from doc_vec where doc_id = :id;
insert into doc_vec(doc_id, embedding, persona_id, session_id, archived)
select id, vec_quantize_binary(vec_sub(:embedding, coalesce((select unhex(value) from meta where key = 'vector_center'),
                                                            zeroblob(length(:embedding))))),
       persona_id, session_id, archived
from documents where id = :id;

-- name: put_entry_vector
-- Store one graph-entry vector, :stored (int8); index_entry_vector then makes its index row.
insert or replace into graph_vectors(entry_id, embedding) values (:id, :stored);

-- name: index_entry_vector
-- (Re)make graph entry :id's index row from :embedding (float32).
delete from graph_vec where entry_id = :id;
insert into graph_vec(entry_id, embedding, persona_id, session_id, archived)
select id, vec_quantize_binary(vec_sub(:embedding, coalesce((select unhex(value) from meta where key = 'vector_center'),
                                                            zeroblob(length(:embedding))))),
       persona_id, session_id, archived
from graph_entries where id = :id;

-- name: doc_vector_blobs
-- Every stored document vector (int8; float32 in a file not converted yet): their mean is the
-- quantisation centre.
select doc_id id, embedding from doc_vectors;

-- name: entry_vector_blobs
-- Every stored graph-entry vector (as doc_vector_blobs).
select entry_id id, embedding from graph_vectors;

-- name: session_context
-- The :n memories right before a memory in its session (session order: created_at, then id),
-- nearest first: the context its vector is computed with. :id is the memory's id; 2^62 for one not
-- stored yet (it comes after every stored memory of the same time). One seek in
-- documents_session_order: the unary + keeps the planner off documents_created (persona_id,
-- created_at), which would walk every earlier memory of the persona until one is in this session.
-- A memory whose text the provider refused (embedding_error) is no one's context: its text would
-- get each neighbour's vector text refused too, or computed from an input the provider rejects.
select created_at, content from documents
where session_id = :session_id and +persona_id = :persona_id
  and (created_at, id) < (:created_at, :id) and embedding_error is null
order by created_at desc, id desc
limit :n;

-- name: session_successors
-- The :n memories right after memory :id (at :created_at) in its session, in session order: the
-- memories whose vector context contains it (one seek in documents_session_order, as above).
select id from documents
where session_id = :session_id and +persona_id = :persona_id
  and (created_at, id) > (:created_at, :id)
order by created_at, id
limit :n;

-- name: pending_documents
-- Back-fill: the next :n documents awaiting a vector after id :after (only those in the JSON array
-- :ids unless it is null), by id, with what their vector text is made of. Those whose text the
-- provider refused (embedding_error) are left out.
select id, content, persona_id, session_id, created_at, topics, tags, sentiment
from documents
where embedding_state = 'pending' and embedding_error is null and id > :after
  and (:ids is null or id in (select value from json_each(:ids)))
order by id
limit :n;

-- name: documents_to_embed
-- `rebuild --vectors`: the next :n documents after id :after, by id, with what their vector text
-- is made of (as pending_documents, for every document).
select id, content, persona_id, session_id, created_at, topics, tags, sentiment
from documents where id > :after order by id limit :n;

-- name: fact_entries_to_embed
-- `rebuild --vectors`: the next :n fact entries (the graph entries that get a vector) after id
-- :after, by id, with their node text t and what decides whether their memory's vector is reused
-- (as pending_entries_by_id).
select e.id, n.value t, d.content, d.id doc_id, d.persona_id, d.session_id, d.created_at
from graph_entries e
join graph_nodes n on n.id = e.node_id
join documents d on d.id = e.document_id
where n.node_type = 'fact' and e.id > :after
order by e.id
limit :n;

-- name: stored_fact_vector
-- The stored vector of a fact entry of persona :persona_id whose node has the key :canonical (the
-- same fact text up to case and whitespace), if one has a vector: a new entry of that node takes it
-- instead of embedding the same text again.
select v.embedding
from graph_nodes n
join graph_entries e on e.node_id = n.id
join graph_vectors v on v.entry_id = e.id
where n.persona_id = :persona_id and n.node_type = 'fact' and n.canonical = :canonical
limit 1;

-- name: pending_entry_ids
-- Back-fill: the first :n graph entries awaiting a vector (not refused by the provider), by id.
select id from graph_entries where embedding_state = 'pending' and embedding_error is null order by id limit :n;

-- name: pending_entries_of_documents
-- The graph entries awaiting a vector of the memories in the JSON array :ids, by id: each entry's
-- node text (t) and what decides whether the memory's own vector can be reused for it.
select e.id, n.value t, d.content, d.embedding_state, d.id doc_id, d.persona_id, d.session_id, d.created_at
from graph_entries e
join graph_nodes n on n.id = e.node_id
join documents d on d.id = e.document_id
where e.embedding_state = 'pending' and e.document_id in (select value from json_each(:ids))
order by e.id;

-- name: pending_entries_by_id
-- As pending_entries_of_documents, for the graph entries in the JSON array :ids.
select e.id, n.value t, d.content, d.embedding_state, d.id doc_id, d.persona_id, d.session_id, d.created_at
from graph_entries e
join graph_nodes n on n.id = e.node_id
join documents d on d.id = e.document_id
where e.embedding_state = 'pending' and e.id in (select value from json_each(:ids))
order by e.id;
