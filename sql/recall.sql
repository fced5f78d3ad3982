-- Retrieval channels. Every channel returns the same columns so fusion code is generic:
--   id (documents.id), channel, rank (0-based, best first), raw (the channel's own score:
--   bm25() is negative, more negative = better; distance is cosine distance, lower = better;
--   graph_keyword raw is an aggregated positive score, higher = better), confidence (0..1).
-- Parameters (all named): :match (FTS5 expression, built by aokun.fts_query from quoted tokens),
--   :embedding (float32 blob), :k, :candidates (KNN candidates taken from the binary index), :persona_id ('' = default persona), :session_id ('' = any),
--   :max_archived (0 = live only, 1 = include archived), :as_of ('' = now; ISO-8601 UTC),
--   :expansion (graph_expansion_limit), :extra (boost for each extra entry point, 0.35),
--   :hop (discount for a one-hop graph neighbour), :hub_limit (nodes in more entries are not hopped from),
--   :pool (keyword channels: the best :pool FTS matches are taken before any filter; 0 or null =
--   all matches, best first), :max_hamming (vector channels: candidates from the binary index lie
--   within this Hamming distance; null = no bound).
-- Besides, every channel returns `complete` and `reach`, for Channels._channel_query: complete is 1
--   when the channel took all it asked for (:k entries or documents that pass the filters, or a
--   pool that held every match; :candidates from the binary index), else 0, and then a bound
--   (:pool, :max_hamming) may have cut the answer short: the channel runs again without it. Both
--   bounds are for speed only: whenever complete is 1 the rows are those of the unbounded query.
--   reach is the Hamming distance of the farthest candidate a vector channel took (what Recall
--   learns :max_hamming from), null for the keyword channels.
-- Exact top-k pruning (MaxScore; aokun.maxscore_split; needs aokun_bm25): with :rest set,
--   :match holds only the query's rarer terms and their rows with each common term (so those
--   rows score as under the whole query: :phrases lists its terms in order, sql/fts5_rank.c);
--   the rows holding only common terms (:rest, those NOT the rarer ones) are read only when the
--   pool's worst score does not beat :rest_bound, the most such a row can score. Otherwise
--   :rest, :rest_bound and :phrases are null and :match is the whole query.
-- Try one in the shell:  .param set :match '"coffee"'  then paste the query
--   (with .param set :rest NULL, and :phrases, :rest_bound likewise).

-- name: recall_bm25
-- Document BM25 over the jieba-segmented FTS5 column, filtered by persona/session/archived in SQL.
-- With :pool > 0 the best :pool matches come first from SQLite's top-N sort of bm25() (a bounded
-- heap: at 100k memories 9.5 ms, against 14.3 ms for FTS5's own ORDER BY rank, which sorts every
-- match), then the filters; when fewer than :k of them pass and the pool was full (another
-- persona's memories crowd it), `complete` is 0. With :pool = 0 FTS5 hands its matches over best
-- first (ORDER BY rank) and the join and the filters stop after :k rows that pass.
with essential as materialized (
    select rowid, bm25(documents_fts /* :phrases */) as raw from documents_fts
    where :pool > 0 and documents_fts match :match
    order by raw, rowid limit max(coalesce(:pool, 0), 0)
),
pooled as materialized (
    select rowid, raw from essential
    union all
    select * from (
        select rowid, bm25(documents_fts) as raw from documents_fts
        where :rest is not null and ((select count(*) from essential) < :pool
                                     or -(select max(raw) from essential) <= :rest_bound)
          and documents_fts match :rest
        order by raw, rowid limit max(coalesce(:pool, 0), 0))
    order by raw, rowid limit max(coalesce(:pool, 0), 0)
),
hits as materialized (
    select * from (
        select d.id, p.raw from pooled p join documents d on d.id = p.rowid
        where d.persona_id = :persona_id
          and (:session_id = '' or d.session_id = :session_id)
          and d.archived <= :max_archived
          and (:as_of = '' or d.created_at <= :as_of)
        order by p.raw, p.rowid limit :k)
    union all
    select * from (
        select d.id, documents_fts.rank as raw
        from documents_fts
        join documents d on d.id = documents_fts.rowid
        where not coalesce(:pool > 0, 0) and documents_fts match :match
          and d.persona_id = :persona_id
          and (:session_id = '' or d.session_id = :session_id)
          and d.archived <= :max_archived
          and (:as_of = '' or d.created_at <= :as_of)
        order by documents_fts.rank
        limit :k)
)
select id, 'bm25' as channel, row_number() over (order by raw) - 1 as rank, raw, 1.0 as confidence,
       not coalesce(:pool > 0, 0) or (select count(*) from hits) >= :k
           or (select count(*) from pooled) < :pool as complete,
       null as reach
from hits order by raw;

-- name: recall_vector
-- Document KNN: the :candidates nearest by Hamming distance in the binary vec0 index, filtered by
-- persona/archived as vec0 metadata constraints (no over-fetching in Python), re-scored by exact
-- cosine distance from the int8 vectors (:query_i8 is the query as int8, see sql/vectors.sql); the
-- best :k. The query's bits use the same centre as the stored ones (meta vector_center).
with coarse as materialized (
    select doc_id, distance from doc_vec
    where embedding match vec_quantize_binary(vec_sub(:embedding, coalesce(
              (select unhex(value) from meta where key = 'vector_center'), zeroblob(length(:embedding)))))
      and k = :candidates and distance <= coalesce(:max_hamming, 1e9)
      and persona_id = :persona_id and archived <= :max_archived
),
knn as (
    select v.doc_id, vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8)) as distance
    from coarse c join doc_vectors v on v.doc_id = c.doc_id
)
select d.id, 'vector' as channel, row_number() over (order by knn.distance) - 1 as rank,
       knn.distance as raw, 1.0 as confidence,
       (select count(*) from coarse) >= :candidates as complete,
       (select max(distance) from coarse) as reach
from knn join documents d on d.id = knn.doc_id
where knn.distance is not null and (:as_of = '' or d.created_at <= :as_of)
order by knn.distance
limit :k;

-- name: recall_vector_session
-- As recall_vector, restricted to one session (vec0 metadata filters cannot be OR-ed away).
with coarse as materialized (
    select doc_id, distance from doc_vec
    where embedding match vec_quantize_binary(vec_sub(:embedding, coalesce(
              (select unhex(value) from meta where key = 'vector_center'), zeroblob(length(:embedding)))))
      and k = :candidates and distance <= coalesce(:max_hamming, 1e9)
      and persona_id = :persona_id and session_id = :session_id and archived <= :max_archived
),
knn as (
    select v.doc_id, vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8)) as distance
    from coarse c join doc_vectors v on v.doc_id = c.doc_id
)
select d.id, 'vector' as channel, row_number() over (order by knn.distance) - 1 as rank,
       knn.distance as raw, 1.0 as confidence,
       (select count(*) from coarse) >= :candidates as complete,
       (select max(distance) from coarse) as reach
from knn join documents d on d.id = knn.doc_id
where knn.distance is not null and (:as_of = '' or d.created_at <= :as_of)
order by knn.distance
limit :k;

-- name: recall_graph_keyword
-- Graph entries hit by the query (FTS5), then one hop: other memories sharing a hit node, and
-- memories whose edges touch a hit node (each hop capped by :expansion). Per memory the best
-- contribution counts in full and each extra entry point adds :extra times its score.
-- The best :k entries that pass the filters come from the FTS pool, or from FTS5 best first, as
-- in recall_bm25 (at 100k memories 45 ms against 74 ms: most of this channel's time).
with essential as materialized (
    select rowid, bm25(graph_entries_fts /* :phrases */) as raw from graph_entries_fts
    where :pool > 0 and graph_entries_fts match :match
    order by raw, rowid limit max(coalesce(:pool, 0), 0)
),
pooled as materialized (
    select rowid, raw from essential
    union all
    select * from (
        select rowid, bm25(graph_entries_fts) as raw from graph_entries_fts
        where :rest is not null and ((select count(*) from essential) < :pool
                                     or -(select max(raw) from essential) <= :rest_bound)
          and graph_entries_fts match :rest
        order by raw, rowid limit max(coalesce(:pool, 0), 0))
    order by raw, rowid limit max(coalesce(:pool, 0), 0)
),
hits as materialized (
    select * from (
        select e.id as entry_id, e.document_id, e.node_id, e.confidence, -p.raw as s
        from pooled p join graph_entries e on e.id = p.rowid
        where e.persona_id = :persona_id
          and (:session_id = '' or e.session_id = :session_id)
          and e.archived <= :max_archived
        order by p.raw, p.rowid limit :k)
    union all
    select * from (
        select e.id as entry_id, e.document_id, e.node_id, e.confidence, -graph_entries_fts.rank as s
        from graph_entries_fts
        join graph_entries e on e.id = graph_entries_fts.rowid
        where not coalesce(:pool > 0, 0) and graph_entries_fts match :match
          and e.persona_id = :persona_id
          and (:session_id = '' or e.session_id = :session_id)
          and e.archived <= :max_archived
        order by graph_entries_fts.rank
        limit :k)
),
hop_from as materialized (
    -- the hit nodes that are no hub: a node in more than :hub_limit entries (a speaker in every
    -- turn) says nothing about which memory is meant, and hopping from it would scan them all
    select h.document_id, h.node_id, h.s from hits h
    where h.node_id is not null
      and (select count(*) from (select 1 from graph_entries x where x.node_id = h.node_id
                                 limit :hub_limit + 1)) <= :hub_limit
),
via_node as (
    select e2.document_id, h.s * :hop as s, e2.confidence
    from hop_from h cross join graph_entries e2 on e2.node_id = h.node_id and e2.document_id != h.document_id
    order by h.s desc
    limit :expansion
),
via_edge as (
    select * from (
        select g.document_id, h.s * :hop as s, g.confidence
        from hop_from h cross join graph_edges g on g.source_id = h.node_id and g.document_id != h.document_id
        union all
        select g.document_id, h.s * :hop as s, g.confidence
        from hop_from h cross join graph_edges g on g.target_id = h.node_id and g.document_id != h.document_id)
    order by s desc
    limit :expansion
),
points as (
    select document_id, s, confidence from hits
    union all select document_id, s, confidence from via_node
    union all select document_id, s, confidence from via_edge
),
per_doc as (
    select document_id as id, max(s) + :extra * (sum(s) - max(s)) as raw, max(confidence) as confidence
    from points group by document_id
)
select p.id, 'graph_keyword' as channel, row_number() over (order by p.raw desc) - 1 as rank,
       p.raw, p.confidence,
       not coalesce(:pool > 0, 0) or (select count(*) from hits) >= :k
           or (select count(*) from pooled) < :pool as complete,
       null as reach
from per_doc p join documents d on d.id = p.id
where d.persona_id = :persona_id
  and (:session_id = '' or d.session_id = :session_id)
  and d.archived <= :max_archived
  and (:as_of = '' or d.created_at <= :as_of)
order by p.raw desc
limit :k;

-- name: recall_graph_vector
-- KNN over graph-entry vectors (their own index, searched and re-scored as in recall_vector),
-- folded back to source memories: a memory's distance is its nearest entry's.
with coarse as materialized (
    select entry_id, distance from graph_vec
    where embedding match vec_quantize_binary(vec_sub(:embedding, coalesce(
              (select unhex(value) from meta where key = 'vector_center'), zeroblob(length(:embedding)))))
      and k = :candidates and distance <= coalesce(:max_hamming, 1e9)
      and persona_id = :persona_id and archived <= :max_archived
),
per_doc as (
    select e.document_id as id, min(vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8))) as raw,
           max(e.confidence) as confidence
    from coarse c join graph_vectors v on v.entry_id = c.entry_id join graph_entries e on e.id = c.entry_id
    where (:session_id = '' or e.session_id = :session_id)
    group by e.document_id
    having raw is not null
)
select p.id, 'graph_vector' as channel, row_number() over (order by p.raw) - 1 as rank, p.raw, p.confidence,
       (select count(*) from coarse) >= :candidates as complete,
       (select max(distance) from coarse) as reach
from per_doc p join documents d on d.id = p.id
where (:as_of = '' or d.created_at <= :as_of)
order by p.raw
limit :k;

-- name: recall_candidates
-- The fields the scores need, for every candidate (ids given as a JSON array in :ids), with the
-- graph route's temporal factor at :ref (ISO time; :historical = 1 for as_of recall): the best
-- TTL factor of the memory's atoms, as aokun.ttl_factor computes it (seed: Retrieval IV):
--   0 unless active (historical: unless it existed at :ref; superseded ones end when superseded),
--   0 from expires_at on; 'step' decay (:step_types) 1 until then; else exp(-age/ttl), age from
--   last_reinforced_at, ttl = expires_at - last_reinforced_at.
-- A memory without atoms ages like one atom of the default type (:default_ttl days × (0.5 +
-- importance) from created_at; :default_step = 1 when that type decays by step).
-- useful_count/last_useful_at (memory_feedback) feed the frequency term; access_count (recall's
-- own touches) is not read here: being returned must not raise a memory's rank.
with factors as (
    select s.document_id as id, max(
        case
            when :historical = 0 and a.state != 'active' then 0.0
            when :historical = 1 and julianday(:ref) < julianday(a.created_at) then 0.0
            when julianday(:ref) >= julianday(case when :historical = 1 and a.state = 'superseded'
                                              then min(a.expires_at, a.state_changed_at) else a.expires_at end) then 0.0
            when a.atom_type in (select value from json_each(:step_types)) then 1.0
            else exp(-max(0.0, julianday(:ref) - julianday(a.last_reinforced_at))
                     / max(1e-9, julianday(a.expires_at) - julianday(a.last_reinforced_at)))
        end) as factor
    from atom_sources s join memory_atoms a on a.id = s.atom_id
    where s.document_id in (select value from json_each(:ids))
    group by s.document_id
)
select d.id, d.source, d.project, d.importance, d.created_at, d.event_at, d.event_end, d.useful_count,
       d.last_useful_at,
       coalesce(f.factor, case
           when :historical = 1 and julianday(:ref) < julianday(d.created_at) then 0.0
           when julianday(:ref) - julianday(d.created_at) >= :default_ttl * (0.5 + d.importance) then 0.0
           when :default_step = 1 then 1.0
           else exp(-max(0.0, julianday(:ref) - julianday(d.created_at)) / (:default_ttl * (0.5 + d.importance)))
       end) as temporal_factor
from documents d left join factors f on f.id = d.id
where d.id in (select value from json_each(:ids));

-- name: recall_documents
-- The fields MMR and the answer need, for the best candidates only.
select d.id, d.persona_id, d.session_id, d.content, d.summary, d.topics, d.participants, d.source,
       d.importance, d.created_at, d.event_at, d.pinned, d.archived, f.segmented
from documents d join documents_fts f on f.rowid = d.id
where d.id in (select value from json_each(:ids));

-- name: recall_time_window
-- The newest memories created within the question's time window [:window_start, :window_end)
-- (ISO UTC, from aokun.time_window; only run when the question has time words), or whose event
-- time [event_at, event_end) overlaps it (schema 16: "next Wednesday" in a memory written last
-- week), so that they can be candidates even when no other word of the question finds them.
-- Filtered like the channels. Each half reads its own index (documents_created, documents_event).
with hits as (
    select d.id, d.created_at from documents d
    where d.persona_id = :persona_id and d.created_at >= :window_start and d.created_at < :window_end
    union
    select d.id, d.created_at from documents d
    where d.persona_id = :persona_id and d.event_at is not null
      and d.event_at <= :window_end and d.event_end > :window_start
)
select d.id, 'time_window' as channel, row_number() over (order by d.created_at desc, d.id desc) - 1 as rank,
       0.0 as raw, 1.0 as confidence
from hits h join documents d on d.id = h.id
where (:session_id = '' or d.session_id = :session_id)
  and d.archived <= :max_archived
  and (:as_of = '' or d.created_at <= :as_of)
order by d.created_at desc, d.id desc
limit :k;

-- name: recall_pinned
-- Pinned memories and their cosine distance to the query: included whenever similar enough.
select d.id, vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8)) as distance
from documents d join doc_vectors v on v.doc_id = d.id
where d.pinned = 1 and d.persona_id = :persona_id and d.archived <= :max_archived
  and vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8)) is not null
  and (:session_id = '' or d.session_id = :session_id)
  and (:as_of = '' or d.created_at <= :as_of);

-- name: search_atoms
-- Atom BM25 over active atoms of one persona; the TTL factor is applied in Python. A fact of two
-- slots is two atoms (aokun.Layers._fact_slots), shown once.
select a.id, a.document_id, a.atom_type, a.content, a.confidence, a.importance, a.reinforcement_count,
       a.created_at, a.last_reinforced_at, a.expires_at, a.base_ttl_days, a.slot,
       bm25(memory_atoms_fts) as raw
from memory_atoms_fts
join memory_atoms a on a.id = memory_atoms_fts.rowid
where memory_atoms_fts match :match
  and a.persona_id = :persona_id
  and a.state = 'active'
  and not exists (select 1 from memory_atoms b where b.document_id = a.document_id
                  and b.content = a.content and b.state = 'active' and b.id < a.id)
order by raw
limit :k;

-- name: touch_documents
-- Bookkeeping after a recall: refresh last_access_at and count the access. Only the daily decay
-- reads them (decay.sql decay_day: recently accessed memories lose importance slower); ranking
-- does not, so what was merely returned gains no rank.
update documents set last_access_at = :at, access_count = access_count + 1
where id in (select value from json_each(:ids));

-- name: feedback_atoms
-- memory_feedback(useful = true) reinforces the atoms a memory states or reinforced, like a
-- repeat of it would (Layers._stage_atoms): the active ones of :document_id not reinforced since
-- :since (ISO time), so repeated feedback stretches an atom's shelf life at most once a day.
select a.id, a.atom_type, a.base_ttl_days, a.importance, a.reinforcement_count, a.expires_at
from atom_sources s join memory_atoms a on a.id = s.atom_id
where s.document_id = :document_id and a.state = 'active' and a.last_reinforced_at < :since
order by a.id;

-- name: recall_session_neighbours
-- For each candidate memory that belongs to a session, the memories right before and after it in
-- that session (ordered by created_at, then id), under the same filters as the channels; each is
-- one seek in documents_session_order (the unary + keeps the planner off documents_created, which
-- would walk the persona's memories until one is in the session: sql/vectors.sql session_context).
select c.id,
       (select d.id from documents d
        where d.session_id = c.session_id and +d.persona_id = c.persona_id and d.archived <= :max_archived
          and (:as_of = '' or d.created_at <= :as_of)
          and (d.created_at, d.id) < (c.created_at, c.id)
        order by d.created_at desc, d.id desc limit 1) as prev_id,
       (select d.id from documents d
        where d.session_id = c.session_id and +d.persona_id = c.persona_id and d.archived <= :max_archived
          and (:as_of = '' or d.created_at <= :as_of)
          and (d.created_at, d.id) > (c.created_at, c.id)
        order by d.created_at, d.id limit 1) as next_id
from documents c
where c.id in (select value from json_each(:ids)) and c.session_id != '' and +c.persona_id = :persona_id
  and (:session_id = '' or c.session_id = :session_id);

-- name: recall_vectors_of
-- The stored vectors (int8, see sql/vectors.sql) of the memories in the JSON array :ids (the MMR
-- pool), for their calibrated relevance (cosine similarity to the query, computed in Python).
select doc_id, embedding from doc_vectors where doc_id in (select value from json_each(:ids));

-- name: replacements
-- For each memory of :ids (a JSON array) replaced by a newer one, the newer memory (by) and when
-- it was written: one whose atom superseded an atom this memory states (a new value of its slot,
-- or a fact memorize(supersedes) retired), or the one it is linked to by documents.superseded_by
-- (memorize's supersedes); each of several (Recall.replacements picks one). Recall ranks the newer
-- first and marks this one replaced_by it.
select id, by, created_at || printf(' %012d', by) as newest from (
select s.document_id as id, n.document_id as by, nd.created_at
from atom_sources s
join memory_atoms o on o.id = s.atom_id and o.state = 'superseded'
join memory_atoms n on n.id = o.superseded_by
join documents nd on nd.id = n.document_id
where s.document_id in (select value from json_each(:ids)) and n.document_id != s.document_id
union
select d.id, d.superseded_by, nd.created_at
from documents d join documents nd on nd.id = d.superseded_by
where d.id in (select value from json_each(:ids)))
order by newest;

-- name: replaced_facts
-- The search tokens of the retired facts (atoms superseded by a newer memory's), and of the live
-- ones, of each memory of :ids (a JSON array) with both: one replaced only in part.
select s.document_id as id, group_concat(iif(a.state = 'superseded', f.segmented, null), ' ') as gone,
       group_concat(iif(a.state != 'superseded', f.segmented, null), ' ') as live
from atom_sources s join memory_atoms a on a.id = s.atom_id
join memory_atoms_fts f on f.rowid = a.id
where s.document_id in (select value from json_each(:ids))
  and a.state in ('active', 'dormant', 'superseded')
group by s.document_id
having gone is not null and live is not null;

-- name: recall_people
-- The persona's people (graph person nodes: memories' participants), whose names a question may
-- give (Recall._names).
select value from graph_nodes where persona_id = :persona_id and node_type = 'person';

-- name: recall_kin_memories
-- Up to 50 live memories of :persona_id holding a relative's words (:match, an FTS5 expression):
-- the names they give the relative (Recall._kin_names: "User's wife Carla…").
select d.content from documents_fts f join documents d on d.id = f.rowid
where documents_fts match :match and d.persona_id = :persona_id and d.archived = 0
limit 50;

-- name: recall_slots
-- The single-valued slots (rules/predicates.toml) that the user's atoms of memories :ids fill,
-- `active` when current (Recall._relevant: a question asking for one is answered by them whatever
-- their words, not by another slot's); :subjects (JSON list): 'user' and the words of the name
-- memories call the user by.
select s.document_id as doc_id, a.slot, a.state = 'active' as active
from atom_sources s join memory_atoms a on a.id = s.atom_id
where s.document_id in (select value from json_each(:ids)) and a.slot != ''
  and a.subject in (select value from json_each(:subjects));

-- name: recall_latest_texts
-- The persona's latest :n live memories' texts and search tokens: the name they call the user by,
-- what many of them say (Journal._own_name).
select d.content, f.segmented from documents d join documents_fts f on f.rowid = d.id
where d.persona_id = :persona_id and d.archived = 0 order by d.created_at desc limit :n;

-- name: later_memories
-- recall's _may_replace: the first :n memories of :persona_id stored after memory :after (by id),
-- not archived, with their segmented text (the ones saying an event changed are kept).
select d.id, d.content, d.created_at, f.segmented
from documents d join documents_fts f on f.rowid = d.id
where d.persona_id = :persona_id and d.id > :after and d.archived = 0
order by d.id limit :n;
