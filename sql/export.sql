-- Export: every base-table row a lossless JSONL export holds, references as uids (ids differ per
-- file). :persona null = every persona; :since null = everything, else rows changed at or after it.
-- Ordered by uid within each kind, so two files with the same content export the same lines.

-- name: export_documents
select d.*, m.uid as merged_into_uid, s.uid as superseded_by_uid
from documents d left join documents m on m.id = d.merged_into
left join documents s on s.id = d.superseded_by
where (:persona is null or d.persona_id = :persona) and (:since is null or d.updated_at >= :since)
order by d.uid;

-- name: export_atoms
-- An atom with its first source's uid, every source's uid (sorted) and what superseded it.
select a.*, d.uid as document_uid, s.uid as superseded_by_uid,
       (select json_group_array(uid) from (select sd.uid from atom_sources x join documents sd on sd.id = x.document_id
                                           where x.atom_id = a.id order by sd.uid)) as source_uids
from memory_atoms a join documents d on d.id = a.document_id left join memory_atoms s on s.id = a.superseded_by
where (:persona is null or a.persona_id = :persona) and (:since is null or a.updated_at >= :since)
order by a.uid;

-- name: export_entities
select * from kg_entities
where (:persona is null or persona_id = :persona) and (:since is null or updated_at >= :since)
order by uid;

-- name: export_triples
select t.*, s.uid as subject_uid, o.uid as object_uid, d.uid as source_memory_uid
from kg_triples t join kg_entities s on s.id = t.subject_id join kg_entities o on o.id = t.object_id
left join documents d on d.id = t.source_memory_id
where (:persona is null or t.persona_id = :persona) and (:since is null or t.updated_at >= :since)
order by t.uid;

-- name: export_sessions
select * from conv_sessions
where (:persona is null or persona_id = :persona) and (:since is null or updated_at >= :since)
order by uid;

-- name: export_turns
-- The turns of the sessions export_sessions gives (a session changed since :since comes whole).
select t.*, s.uid as session_uid
from conv_turns t join conv_sessions s on s.id = t.session_ref
where (:persona is null or s.persona_id = :persona) and (:since is null or s.updated_at >= :since)
order by s.uid, t.seq, t.uid;

-- name: export_consolidations
select c.previous, c.members, c.created_at, d.uid as survivor_uid
from consolidations c join documents d on d.id = c.survivor_id
where (:persona is null or d.persona_id = :persona) and (:since is null or c.created_at >= :since)
order by d.uid;

-- name: export_member_uids
-- The uids of documents whose ids are in the JSON array :ids (a consolidation's members).
select uid from documents where id in (select value from json_each(:ids)) order by uid;

-- name: export_tombstones
select * from tombstones where (:since is null or deleted_at >= :since) order by uid;
