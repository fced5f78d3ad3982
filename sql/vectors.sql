-- Vector tables (sqlite-vec 0.1.9 vec0). aokun.py substitutes {dim} with the embedding dimension
-- recorded in meta('embedding_dim') before running these; everything else runs as-is in the shell
-- after `.load <path to vec0>` (python -c "import sqlite_vec; print(sqlite_vec.loadable_path())").
-- Filter columns are vec0 metadata columns so filtered KNN happens inside SQL. vec0 metadata
-- filters accept = != < <= > >= only, so "no session" is stored as ''.

-- name: create_doc_vec
create virtual table if not exists doc_vec using vec0(
    doc_id integer primary key,
    embedding float[{dim}] distance_metric=cosine,
    persona_id text,
    session_id text,
    archived integer
);

-- name: create_graph_vec
create virtual table if not exists graph_vec using vec0(
    entry_id integer primary key,
    embedding float[{dim}] distance_metric=cosine,
    persona_id text,
    session_id text,
    archived integer
);
