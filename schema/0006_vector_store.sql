-- Float vectors move out of vec0 into plain tables; the vec0 tables doc_vec/graph_vec become a
-- binary-quantised KNN index over them (see sql/vectors.sql). Reading one vec0 row by id costs
-- ~0.2 ms in sqlite-vec 0.1.9, a plain table row ~3 µs, and re-scoring needs a few hundred.
-- aokun.py copies the vectors of a file made before this version (Memory._upgrade_vector_index).
-- Each embedding is float32 little-endian, embedding_dim (meta) values.

create table doc_vectors (
    doc_id    integer primary key references documents(id) on delete cascade,
    embedding blob not null
);

create table graph_vectors (
    entry_id  integer primary key references graph_entries(id) on delete cascade,
    embedding blob not null
);
