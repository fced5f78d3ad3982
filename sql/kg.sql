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
