-- Daily importance decay and auto-archival (seed: Forgetting & Lifecycle, document level).
-- Run once per calendar day (aokun.py catches up missed days one at a time, each in its own
-- transaction together with meta('decay_last_run')). Also the snapshot decay reports its changes
-- from, and consolidation's reads.
-- Parameters: :decay_rate (0.01/day), :window_start (ISO time; accesses after it count as recent),
--   :access_multiplier (0.5), :cutoff (ISO time), :importance_threshold.

-- name: decay_day
-- effective_rate = decay_rate × max(0.3, 1 − 0.1 × min(recent_access_count, 10))
-- importance     = max(0.05, importance × (1 − effective_rate)); pinned memories are immune, and a
-- memory already at or below the 0.05 floor is left as it is. access_count then halves.
update documents set
    importance = max(0.05, importance * (1 - :decay_rate * max(0.3, 1 - 0.1 * min(
        case when last_access_at >= :window_start then access_count else 0 end, 10)))),
    access_count = access_count * :access_multiplier
where pinned = 0 and importance > 0.05;

-- name: decay_day_access_only
-- Memories at the floor or pinned keep their importance but their access count still fades.
update documents set access_count = access_count * :access_multiplier
where (pinned = 1 or importance <= 0.05) and access_count > 0;

-- name: auto_archive_candidates
-- Old, unimportant, unpinned, live memories: archived (kept, out of automatic recall).
select id, importance, created_at from documents
where archived = 0 and pinned = 0 and created_at < :cutoff and importance < :importance_threshold
order by id;

-- name: document_states
-- Every memory's importance and archived flag: the before/after snapshot a decay, auto-archival
-- or preview reports its changes from (lifecycle.sql atom_states is the atoms' half).
select id, persona_id, importance, archived from documents;

-- name: consolidate_documents
-- Consolidation (clusters of near-duplicate live memories of one persona) starts from these: the
-- live memories of :persona_id, by id, with their segmented FTS text.
select d.id, d.content, d.created_at, f.segmented
from documents d join documents_fts f on f.rowid = d.id
where d.persona_id = :persona_id and d.archived = 0
order by d.id;

-- name: consolidate_fts_candidates
-- The :k best BM25 matches of :match (a memory's own tokens) among all memories: near-duplicate
-- candidates, checked by Jaccard in Python (which also drops other personas and archived ones).
select rowid from documents_fts where documents_fts match :match order by rank limit :k;
