-- Reading memories (Store) and the write path's reads of a memory (Journal).
-- Try one in the shell:  .param set :document_id 12  then paste the query.

-- name: document_atoms
-- The atoms memory :document_id is a source of (stated or reinforced), by atom id.
select a.id, a.atom_type, a.content, a.state, a.confidence, a.reinforcement_count, a.expires_at
from atom_sources s join memory_atoms a on a.id = s.atom_id
where s.document_id = :document_id
order by a.id;

-- name: document_graph_texts
-- The text of memory :document_id's graph entries, in entry order.
select text from graph_entries where document_id = :document_id order by id;

-- name: list_memories
-- Memories newest first (created_at, then id): :limit of them after skipping :offset. :persona_id
-- and :session_id and :project null = any; :include_archived 0 = live only. content cut to 500
-- characters.
select id, uid, persona_id, session_id, substr(content, 1, 500) content, summary, importance, pinned,
       archived, source, created_at, updated_at, project
from documents
where (:persona_id is null or persona_id = :persona_id)
  and (:session_id is null or session_id = :session_id)
  and (:project is null or project = :project)
  and (:include_archived or archived = 0)
order by created_at desc, id desc
limit :limit offset :offset;

-- name: document_layer_counts
-- One row: how many atoms and graph entries memory :document_id has (a write's result).
select (select count(*) from atom_sources where document_id = :document_id) atoms,
       (select count(*) from graph_entries where document_id = :document_id) graph_entries;

-- name: same_content_elsewhere
-- A memory of :persona_id other than :id with exactly this content (:content_hash): an edit of
-- memory :id to that content is refused.
select id from documents where persona_id = :persona_id and content_hash = :content_hash and id != :id;

-- name: document_history
-- Memory :document_id's history, oldest first: every journalled write of it (its insert, each edit,
-- graph rebuilds: op, status, when, error) and, when it survived a consolidation, that merge (the
-- merged memories' ids).
select 'write' as kind, op as what, status, created_at as at, error, null as members
from memory_write_ops where document_id = :document_id
union all
select 'merge', 'consolidated', 'done', created_at, '', members
from consolidations where survivor_id = :document_id
order by at, kind desc;

-- name: slot_rivals_of_document
-- Memories whose atom an atom of memory :document_id superseded by its single-valued slot (same
-- persona, subject and slot, another value; rules/predicates.toml), not archived, newest first:
-- the slot signal of memorize's may_update.
select distinct d.id, d.content
from memory_atoms n
join memory_atoms o on o.persona_id = n.persona_id and o.slot = n.slot and o.slot != ''
                   and o.superseded_by = n.id
join documents d on d.id = o.document_id
where n.document_id = :document_id and n.slot != '' and d.persona_id = :persona_id
  and d.archived = 0 and d.id != :document_id
order by d.id desc
limit :k;

-- name: document_atom_texts
-- The active atoms memory :document_id states, with their segmented text (_retire_contradicted).
select a.id, f.segmented
from atom_sources s join memory_atoms a on a.id = s.atom_id and a.state = 'active'
join memory_atoms_fts f on f.rowid = a.id
where s.document_id = :document_id;

-- name: superseded_atom_texts
-- The active atoms of the memories :document_id supersedes (documents.superseded_by, memorize's
-- supersedes) that it does not state itself, with their segmented text: what it may contradict.
select distinct a.id, f.segmented
from documents d join atom_sources s on s.document_id = d.id
join memory_atoms a on a.id = s.atom_id and a.state = 'active'
join memory_atoms_fts f on f.rowid = a.id
where d.superseded_by = :document_id
  and not exists (select 1 from atom_sources t where t.atom_id = a.id and t.document_id = :document_id);

-- name: document_retired_atoms
-- How many atoms memory :document_id states that another memory's atom superseded.
select count(*) from atom_sources s join memory_atoms a on a.id = s.atom_id
where s.document_id = :document_id and a.state = 'superseded';

-- name: reactivate_atoms
-- Superseded atoms current again: those memory :document_id states (restore_memory), or those
-- atom :atom_id superseded (it is deleted), if unexpired at :now or holding a slot and not
-- planned (such an atom does not expire, sql/lifecycle.sql). Give the other id as -1.
update memory_atoms set state = 'active', superseded_by = null, state_changed_at = :now, updated_at = :now
where state = 'superseded' and (expires_at > :now or slot != '' and atom_type != 'planned')
  and (superseded_by = :atom_id
       or id in (select atom_id from atom_sources where document_id = :document_id));

-- name: event_rivals
-- may_update's event signal: the best BM25 matches (:match, an FTS5 expression) among the memories
-- of :persona_id other than :document_id, not archived, with their segmented text.
select d.id, d.content, f.segmented
from documents_fts f join documents d on d.id = f.rowid
where documents_fts match :match and d.persona_id = :persona_id and d.id != :document_id
  and d.archived = 0
order by rank
limit :k;

-- name: event_same_day
-- may_update's day signal: the live older memories of the persona of memory :document_id whose
-- event time starts on the day [:at, :end) it says a plan changed from (the first date it
-- names; its own event_at is the last, the new day), newest first; none when that memory states a
-- single-valued slot ("Moved to Lyon on May 2" is a move, no event's).
select o.id, o.content from documents n join documents o on o.persona_id = n.persona_id
  and o.event_at = :at and o.id != n.id and o.created_at <= n.created_at
where n.id = :document_id and o.archived = 0 and o.superseded_by is null
  and :end <= strftime('%Y-%m-%dT%H:%M:%SZ', :at, '+25 hours')  -- one day
  and not exists (select 1 from atom_sources s join memory_atoms a on a.id = s.atom_id
                  where s.document_id = n.id and a.slot != '')
order by o.created_at desc, o.id desc limit 2;

-- name: near_rival
-- may_update's meaning signal: the content of memory :id, and whether it agrees with memory
-- :document_id: each states an active atom of one subject, slot and value (or the same atom),
-- or each states a slot of someone else (my brother lives in Perth; I moved to Adelaide).
with pairs as (
    select n.subject = o.subject as same_subject, o.slot_value = n.slot_value as same_value,
           o.state = 'active' as active
    from atom_sources s join memory_atoms n on n.id = s.atom_id and n.slot != ''
    join memory_atoms o on o.persona_id = n.persona_id and o.slot = n.slot
    join atom_sources t on t.atom_id = o.id and t.document_id = :id
    where s.document_id = :document_id)
select d.content,
       exists (select 1 from pairs where same_subject and same_value and active)
       or exists (select 1 from pairs) and not exists (select 1 from pairs where same_subject)
       as agrees
from documents d where d.id = :id;
