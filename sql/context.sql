-- Memory for a prompt (Briefing): the stored session briefing and memory_context's pinned memories.
-- Try one in the shell:  .param set :persona_id ''  then paste the query.

-- name: briefing_key_memories
-- The briefing's "Key memories": up to 30 live memories of :persona_id that are pinned, have
-- importance ≥ :min_importance or state a current single-valued fact (an active atom holding a
-- slot, not a plan: where someone lives, works, what they prefer), pinned first, then by
-- importance, newest first. With a :project ('' none), the global memories and that project's
-- only (so in every query below).
select id, content, created_at from documents d
where persona_id = :persona_id and archived = 0 and (pinned = 1 or importance >= :min_importance
  or exists (select 1 from atom_sources s join memory_atoms a on a.id = s.atom_id
             where s.document_id = d.id and a.state = 'active' and a.slot != ''
               and a.atom_type != 'planned'))
  and (:project = '' or project in ('', :project))
order by pinned desc, importance desc, created_at desc
limit 30;

-- name: briefing_recent_memories
-- The briefing's "Recent": the :n newest live memories of :persona_id created at or after :since.
select id, content, created_at from documents
where persona_id = :persona_id and archived = 0 and created_at >= :since
  and (:project = '' or project in ('', :project))
order by created_at desc
limit :n;

-- name: stale_briefings
-- The personas whose stored briefing is stale and was generated at or before :cutoff.
select persona_id from briefings where stale = 1 and generated_at <= :cutoff;

-- name: context_pinned
-- memory_context with a topic starts with these: up to 20 live memories of :persona_id that are
-- pinned or tagged 'directive', pinned first, then by importance.
select id, content from documents
where persona_id = :persona_id and archived = 0 and (:project = '' or project in ('', :project))
  and (pinned = 1 or exists (select 1 from json_each(tags) where value = 'directive'))
order by pinned desc, importance desc
limit 20;
