-- Schema 11: a leaner file (issue 14).
-- 1. A write's journal payload (the whole memory, what recovery rebuilds an unfinished write from)
--    moves to memory_write_payloads and is deleted when the write is done: recovery reads only
--    unfinished rows' payloads, and deleted rows free whole pages that the next writes reuse (a
--    payload shrunk in place would leave its page mostly empty). memory_write_ops keeps op, status,
--    ids and times, with payload '{}' (valid JSON, as the column's check wants). Failed writes keep
--    their payload row (what was refused, for a person to look at).
-- 2. Vectors become int8 (one byte per dimension, see sql/vectors.sql): that needs a per-vector
--    scale SQL cannot compute, so aokun.py rewrites the float32 rows of doc_vectors/graph_vectors
--    when it opens the file (Vectors._compact_vectors, one transaction, meta vector_format = 'int8').
-- Both leave free pages behind: `python aokun.py vacuum` returns them to the file system.
create table if not exists memory_write_payloads (
    op_id   integer primary key references memory_write_ops(id) on delete cascade,
    payload text not null check (json_valid(payload))
);
insert or ignore into memory_write_payloads(op_id, payload)
select id, payload from memory_write_ops where status != 'done';
update memory_write_ops set payload = '{}';
