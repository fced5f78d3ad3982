-- The atom and graph layers as the write path reads them (Layers, all inside the write
-- transaction): the atoms a new fact may reinforce or supersede, and what one memory contributed
-- to both layers, to undo or refresh it when the memory is edited or deleted.
-- Try one in the shell:  .param set :document_id 12  then paste the query.

-- name: atom_reinforce_candidates
-- The 20 best BM25 matches (:match, an FTS5 expression) among the active atoms of :persona_id of
-- type :atom_type, with their segmented text and slot: Jaccard (in Python) decides which one a new
-- fact reinforces (never one holding the fact's slot with another value or subject).
select a.id, a.atom_type, a.base_ttl_days, a.importance, a.reinforcement_count, a.confidence, a.last_reinforced_at,
       a.expires_at, a.subject, a.slot, a.slot_value, f.segmented
from memory_atoms_fts f join memory_atoms a on a.id = f.rowid
where memory_atoms_fts match :match and a.persona_id = :persona_id and a.state = 'active'
  and a.atom_type = :atom_type
order by rank
limit 20;

-- name: atom_pivot_candidates
-- The segmented text of the active atoms of :persona_id of type :atom_type holding any term of
-- :match (an FTS5 expression), unranked: whether one may be reinforced (Layers._may_reinforce).
select f.segmented
from memory_atoms_fts f join memory_atoms a on a.id = f.rowid
where memory_atoms_fts match :match and a.persona_id = :persona_id and a.state = 'active'
  and a.atom_type = :atom_type;

-- name: atom_by_uid
-- The atom with uid :uid (atom_uid: a memory's fact), with what a reinforcement of it reads.
select id, atom_type, base_ttl_days, importance, reinforcement_count, confidence,
       last_reinforced_at, expires_at, state
from memory_atoms where uid = :uid;

-- name: atom_rivals
-- The other active atoms (not :id) of the same persona and single-valued slot, with their subject:
-- of the same subject's, the ones a new value of the slot supersedes, or is superseded by.
select id, subject, slot_value, created_at from memory_atoms
where persona_id = :persona_id and slot = :slot and state = 'active' and id != :id;

-- name: document_atom_sources
-- The atoms memory :document_id is a source of, with their first source and reinforcement count.
select s.atom_id, a.document_id, a.reinforcement_count
from atom_sources s join memory_atoms a on a.id = s.atom_id
where s.document_id = :document_id;

-- name: document_entry_ids
-- The ids of memory :document_id's graph entries.
select id from graph_entries where document_id = :document_id;

-- name: document_pending_entry_ids
-- The ids of memory :document_id's graph entries still awaiting a vector.
select id from graph_entries where document_id = :document_id and embedding_state = 'pending';

-- name: document_graph_nodes
-- Every graph node memory :document_id uses, through its entries or its edges (column n).
select node_id n from graph_entries where document_id = :document_id and node_id is not null
union
select source_id from graph_edges where document_id = :document_id
union
select target_id from graph_edges where document_id = :document_id;

-- name: document_entry_nodes
-- Memory :document_id's subject and fact entries with their node (type, value, canonical), in entry order.
select e.id, n.node_type, n.value, n.canonical
from graph_entries e join graph_nodes n on n.id = e.node_id
where e.document_id = :document_id and e.edge_id is null
order by e.id;

-- name: edge_only_entries
-- Entries of describes / co_occurs_with edges, which files before graph layout 2 indexed as
-- sentences ("Alice describes …"); they are edges only now (Layers._upgrade_graph_entries).
select e.id from graph_entries e join graph_edges g on g.id = e.edge_id
where g.relation in ('describes', 'co_occurs_with');

-- name: documents_with_entries
select distinct document_id as id from graph_entries order by document_id;

-- name: document_anchor_entry
-- Memory :document_id's anchor entry, which carries its session context (aokun.graph_anchor_text):
-- its first subject's entry, or with no subject its first fact's. The node's value is the spelling of
-- the memory that made the node first; the canonical finds this memory's own (aokun._own_spelling).
select e.id, n.node_type, n.value, n.canonical
from graph_entries e join graph_nodes n on n.id = e.node_id
where e.document_id = :document_id and e.edge_id is null
order by n.node_type = 'fact', e.id
limit 1;
