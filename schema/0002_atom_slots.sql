-- Schema 2: single-valued slots on atoms, for rule-based supersession.
-- An atom that matches a single-valued predicate of rules/predicates.toml (lives_in, works_at…)
-- records it; a newer atom of the same persona, subject and slot with another value supersedes it.
alter table memory_atoms add column slot text not null default '';
alter table memory_atoms add column slot_value text not null default '';
create index memory_atoms_slot on memory_atoms(persona_id, subject, slot) where slot != '';
