-- The atom TTL state machine (seed: Forgetting & Lifecycle, atom level), one sweep at :now:
--   active → expired (past expires_at) → forgotten (:forget_delay_days later; row kept, FTS row
--   removed, never retrieved) → purged (:purge_delay_days later; row deleted).
--   A superseded atom stays superseded (never served; the seed forgot it like an expired one): it
--   is what says an older memory was replaced (sql recall.sql replacements), and the value
--   that is current again when the newer memory goes. active ↔ dormant when every source memory
--   is archived / when one is live again. An atom holding a single-valued slot (where someone
--   lives, works, what they prefer; rules/predicates.toml), unless planned, does not expire with
--   age: it stays current until a newer value supersedes it (its TTL still weighs its rank).

-- name: lifecycle_expire
update memory_atoms set state = 'expired', state_changed_at = :now, updated_at = :now
where state in ('active', 'dormant') and expires_at <= :now
  and (slot = '' or atom_type = 'planned');

-- name: lifecycle_dormant
update memory_atoms set state = 'dormant', state_changed_at = :now, updated_at = :now
where state = 'active' and not exists (
    select 1 from atom_sources s join documents d on d.id = s.document_id
    where s.atom_id = memory_atoms.id and d.archived = 0);

-- name: lifecycle_wake
update memory_atoms set state = 'active', state_changed_at = :now, updated_at = :now
where state = 'dormant' and (expires_at > :now or slot != '' and atom_type != 'planned')
  and exists (
    select 1 from atom_sources s join documents d on d.id = s.document_id
    where s.atom_id = memory_atoms.id and d.archived = 0);

-- name: lifecycle_forget_ids
select id from memory_atoms
where state = 'expired' and julianday(:now) - julianday(state_changed_at) >= :forget_delay_days;

-- name: lifecycle_purge_ids
select id from memory_atoms
where state = 'forgotten'
  and julianday(:now) - julianday(state_changed_at) >= :purge_delay_days;

-- name: atom_states
select id, persona_id, state from memory_atoms;
