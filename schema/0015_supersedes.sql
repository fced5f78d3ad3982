-- Schema 15: memorize(supersedes=[ids]) archives the memories a new one replaces and links each
-- to it (issue 22), as consolidation's merged_into links a merged memory to its survivor
-- (schema 3). superseded_by is the newer memory's id; deleting that memory clears the link (the
-- older one stays archived); restore_memory of the older one clears it too. The partial index
-- answers "what does memory N supersede" (get_memory) without reading every row.
alter table documents add column superseded_by integer references documents(id) on delete set null;
create index documents_superseded_by on documents(superseded_by) where superseded_by is not null;
