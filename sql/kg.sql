-- Temporal knowledge-graph triples. Times are ISO-8601 UTC text; a fact holds at :as_of when
-- valid_from <= :as_of and (valid_to is null or valid_to > :as_of).

-- name: kg_facts_at
-- Facts about an entity (as subject or object) valid at :as_of, optionally one predicate.
select t.id, t.uid, s.name as subject, t.predicate, o.name as object, t.valid_from, t.valid_to,
       t.confidence, t.source_memory_id
from kg_triples t
join kg_entities s on s.id = t.subject_id
join kg_entities o on o.id = t.object_id
where t.persona_id = :persona_id
  and (:entity_id = 0 or t.subject_id = :entity_id or t.object_id = :entity_id)
  and (:predicate = '' or t.predicate = :predicate)
  and t.valid_from <= :as_of
  and (t.valid_to is null or t.valid_to > :as_of)
order by t.valid_from, t.id;

-- name: kg_timeline
-- Every fact ever recorded about an entity, oldest first (history included).
select t.id, t.uid, s.name as subject, t.predicate, o.name as object, t.valid_from, t.valid_to,
       t.confidence, t.source_memory_id
from kg_triples t
join kg_entities s on s.id = t.subject_id
join kg_entities o on o.id = t.object_id
where t.persona_id = :persona_id and (t.subject_id = :entity_id or t.object_id = :entity_id)
order by t.valid_from, t.id;

-- name: kg_stats
select
    (select count(*) from kg_entities where persona_id = :persona_id) as entities,
    (select count(*) from kg_triples where persona_id = :persona_id) as triples,
    (select count(*) from kg_triples where persona_id = :persona_id
        and (valid_to is null or valid_to > :now) and valid_from <= :now) as active,
    (select count(*) from kg_triples where persona_id = :persona_id and valid_to <= :now) as expired,
    (select count(distinct predicate) from kg_triples where persona_id = :persona_id) as predicates;

-- name: kg_triple
-- One fact by id (:id) of :persona_id with its entities' names (another persona's id: no row).
select t.id, t.uid, s.name subject, t.predicate, o.name object, t.valid_from, t.valid_to, t.confidence,
       t.source_memory_id
from kg_triples t join kg_entities s on s.id = t.subject_id join kg_entities o on o.id = t.object_id
where t.id = :id and t.persona_id = :persona_id;

-- name: kg_entity_facts
-- The ids of the facts an entity is the subject or object of (kg_delete_entity deletes them with it).
select id from kg_triples
where persona_id = :persona_id and (subject_id = :entity_id or object_id = :entity_id)
order by id;

-- name: kg_same_open_fact
-- The open fact (no valid_to) subject —predicate→ object that already holds at :valid_from:
-- kg_add returns it instead of recording the fact again.
select id from kg_triples
where persona_id = :persona_id and subject_id = :subject_id and predicate = :predicate and object_id = :object_id
  and valid_to is null and valid_from <= :valid_from;

-- name: kg_rival_facts
-- For a single-valued predicate: the facts of the same subject and predicate with another object
-- not ended by :valid_from. kg_add closes those begun by then at :valid_from; one that begins later
-- ends the new fact where it begins.
select id, valid_from from kg_triples
where persona_id = :persona_id and subject_id = :subject_id and predicate = :predicate and object_id != :object_id
  and (valid_to is null or valid_to > :valid_from);

-- name: kg_entities_in_text
-- Up to 20 entities of :persona_id whose canonical name (2+ characters) occurs in :text (case-folded,
-- whitespace collapsed): the facts recall and memory_context add are about them.
select id from kg_entities
where persona_id = :persona_id and length(canonical) >= 2 and instr(:text, canonical) > 0
limit 20;
