-- The conversation layer (schema/0010): sessions and turns of client transcripts, their FTS5 index
-- (conv_turns_fts, jieba-segmented like documents_fts) and their vectors (int8 in conv_turn_vectors,
-- as doc_vectors stores them, and a binary-quantised vec0 copy in conv_turn_vec, centred on meta
-- turn_vector_center once 256 turn vectors exist, like doc_vec: see sql/vectors.sql).
-- Parameters are named; :persona_id '' is the default persona; :source, :session_id '' = any;
-- :since / :until '' = unbounded (ISO-8601 UTC).

-- name: create_turn_vec
create virtual table if not exists conv_turn_vec using vec0(
    turn_id integer primary key,
    embedding bit[{dim}],
    persona_id text,
    source text
);

-- name: put_turn_vector
-- Store one turn vector, :stored (int8); index_turn_vector then makes its index row.
insert or replace into conv_turn_vectors(turn_id, embedding) values (:id, :stored);

-- name: index_turn_vector
-- (Re)make turn :id's index row from :embedding (float32), after the centre changes.
delete from conv_turn_vec where turn_id = :id;
insert into conv_turn_vec(turn_id, embedding, persona_id, source)
select id, vec_quantize_binary(vec_sub(:embedding, coalesce((select unhex(value) from meta where key = 'turn_vector_center'),
                                                            zeroblob(length(:embedding))))),
       persona_id, source
from conv_turns where id = :id;

-- name: turn_vector_blobs
-- Every stored turn vector (int8): their mean is the turn index's quantisation centre.
select turn_id, embedding from conv_turn_vectors;

-- name: conv_session_refresh
-- Recompute a session's summary columns from its turns: count, first and last time, the first
-- thing the user said (cut to :chars), and the title when none was given (that message, cut to :title_chars).
update conv_sessions set
    turn_count = (select count(*) from conv_turns where session_ref = :id),
    started_at = coalesce((select min(created_at) from conv_turns where session_ref = :id), started_at),
    ended_at = coalesce((select max(created_at) from conv_turns where session_ref = :id), ended_at),
    first_user_message = coalesce((select substr(text, 1, :chars) from conv_turns
                                   where session_ref = :id and role = 'user' order by seq, id limit 1), ''),
    updated_at = :now
where id = :id;

-- name: conv_pending_turns
-- Back-fill: the next :n turns awaiting a vector after id :after, by id.
select id, text from conv_turns where embedding_state = 'pending' and id > :after order by id limit :n;

-- name: conv_bm25
-- Turn BM25 over the segmented FTS5 column, filtered in SQL by persona, source, session and time.
-- With :pool > 0 the best :pool matches come first from SQLite's top-N sort of bm25() (a bounded
-- heap over the FTS index alone), then the joins and filters; `complete` is 0 when fewer than :k
-- of them pass and the pool was full (other personas' or sessions' turns crowd it): then
-- ConversationSearch runs it again with :pool = 0, every match joined and filtered before the
-- top-:k sort. Ties go by id either way, so a complete pooled answer is the unbounded one.
with pooled as materialized (
    select rowid, bm25(conv_turns_fts) as raw from conv_turns_fts
    where :pool > 0 and conv_turns_fts match :match
    order by raw, rowid limit max(coalesce(:pool, 0), 0)
),
hits as materialized (
    select * from (
        select t.id, p.raw
        from pooled p
        join conv_turns t on t.id = p.rowid
        join conv_sessions s on s.id = t.session_ref
        where t.persona_id = :persona_id
          and (:source = '' or t.source = :source)
          and (:session_id = '' or s.session_id = :session_id)
          and (:since = '' or t.created_at >= :since)
          and (:until = '' or t.created_at <= :until)
        order by p.raw, t.id limit :k)
    union all
    select * from (
        select t.id, bm25(conv_turns_fts) as raw
        from conv_turns_fts
        join conv_turns t on t.id = conv_turns_fts.rowid
        join conv_sessions s on s.id = t.session_ref
        where not coalesce(:pool > 0, 0) and conv_turns_fts match :match
          and t.persona_id = :persona_id
          and (:source = '' or t.source = :source)
          and (:session_id = '' or s.session_id = :session_id)
          and (:since = '' or t.created_at >= :since)
          and (:until = '' or t.created_at <= :until)
        order by raw, t.id limit :k)
)
select id, 'bm25' as channel, row_number() over (order by raw, id) - 1 as rank, raw,
       not coalesce(:pool > 0, 0) or (select count(*) from hits) >= :k
           or (select count(*) from pooled) < :pool as complete
from hits order by raw, id;

-- name: conv_vector
-- Turn KNN: the :candidates nearest in the binary index (persona as a vec0 metadata filter),
-- re-scored by exact cosine distance from the float vectors, time-filtered; the best :k.
-- :max_hamming, `complete` and `reach` as in recall_vector (sql/recall.sql): a bound learnt from
-- earlier searches, and when fewer than :candidates lie within it the query runs again without.
with coarse as materialized (
    select turn_id, distance from conv_turn_vec
    where embedding match vec_quantize_binary(vec_sub(:embedding, coalesce(
              (select unhex(value) from meta where key = 'turn_vector_center'), zeroblob(length(:embedding)))))
      and k = :candidates and distance <= coalesce(:max_hamming, 1e9)
      and persona_id = :persona_id
),
knn as (
    select v.turn_id, vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8)) as distance
    from coarse c join conv_turn_vectors v on v.turn_id = c.turn_id
)
select t.id, 'vector' as channel, row_number() over (order by knn.distance) - 1 as rank,
       knn.distance as raw, (select count(*) from coarse) >= :candidates as complete,
       (select max(distance) from coarse) as reach
from knn join conv_turns t on t.id = knn.turn_id
where knn.distance is not null and (:since = '' or t.created_at >= :since) and (:until = '' or t.created_at <= :until)
order by knn.distance
limit :k;

-- name: conv_vector_source
-- As conv_vector, for one source (vec0 metadata filters cannot be OR-ed away).
with coarse as materialized (
    select turn_id, distance from conv_turn_vec
    where embedding match vec_quantize_binary(vec_sub(:embedding, coalesce(
              (select unhex(value) from meta where key = 'turn_vector_center'), zeroblob(length(:embedding)))))
      and k = :candidates and distance <= coalesce(:max_hamming, 1e9)
      and persona_id = :persona_id and source = :source
),
knn as (
    select v.turn_id, vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8)) as distance
    from coarse c join conv_turn_vectors v on v.turn_id = c.turn_id
)
select t.id, 'vector' as channel, row_number() over (order by knn.distance) - 1 as rank,
       knn.distance as raw, (select count(*) from coarse) >= :candidates as complete,
       (select max(distance) from coarse) as reach
from knn join conv_turns t on t.id = knn.turn_id
where knn.distance is not null and (:since = '' or t.created_at >= :since) and (:until = '' or t.created_at <= :until)
order by knn.distance
limit :k;

-- name: conv_vector_session
-- Exact cosine over one session's turn vectors (a session is small: no index needed).
select t.id, 'vector' as channel,
       row_number() over (order by vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8))) - 1 as rank,
       vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8)) as raw
from conv_turns t
join conv_sessions s on s.id = t.session_ref
join conv_turn_vectors v on v.turn_id = t.id
where s.session_id = :session_id and t.persona_id = :persona_id
  and vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_i8)) is not null
  and (:source = '' or t.source = :source)
  and (:since = '' or t.created_at >= :since) and (:until = '' or t.created_at <= :until)
order by raw
limit :k;

-- name: conv_hits
-- The turns in the JSON array :ids with their session, FTS text and int8 vector (for relevance).
select t.id, t.role, t.created_at, t.text, t.seq, t.source, t.embedding_state, s.session_id, s.title, s.project,
       f.segmented, v.embedding
from conv_turns t
join conv_sessions s on s.id = t.session_ref
join conv_turns_fts f on f.rowid = t.id
left join conv_turn_vectors v on v.turn_id = t.id
where t.id in (select value from json_each(:ids));

-- name: conv_session_turns
-- One session's turns in order, :limit from :offset.
select id, seq, role, created_at, text from conv_turns
where session_ref = :session_ref
order by seq, id
limit :limit offset :offset;

-- name: conv_sessions_named
-- The sessions of a persona with this client session id (one per source), newest first.
select * from conv_sessions where persona_id = :persona_id and session_id = :session_id
  and (:source = '' or source = :source)
order by ended_at desc;

-- name: conv_list_sessions
-- Sessions newest first (by their last turn), optionally of one source.
select id, source, session_id, project, title, first_user_message, started_at, ended_at, turn_count
from conv_sessions
where persona_id = :persona_id and (:source = '' or source = :source)
order by ended_at desc, id desc
limit :limit offset :offset;

-- name: conv_recent_sessions
-- The briefing's session digests: sessions of the persona whose last turn is after :since, those of
-- project :project (its folder or one in it; '' none) first, newest first.
select source, session_id, title, first_user_message, ended_at, turn_count from conv_sessions
where persona_id = :persona_id and ended_at >= :since and turn_count > 0
order by :project != '' and (project = :project
                             or substr(project, 1, length(:project) + 1) = :project || '/') desc,
         ended_at desc, id desc
limit :n;

-- name: conv_stats_by_source
-- Per source: sessions, turns, first and last turn time (of one persona).
select s.source, count(distinct s.id) as sessions, count(t.id) as turns,
       min(t.created_at) as first_turn_at, max(t.created_at) as last_turn_at
from conv_sessions s left join conv_turns t on t.session_ref = s.id
where s.persona_id = :persona_id
group by s.source order by s.source;

-- name: conv_expired_sessions
-- Sessions whose last turn is older than :cutoff ([conversations] keep_days), any persona.
select id from conv_sessions where ended_at < :cutoff order by id;

-- name: conv_session_turn_ids
-- The turn ids of a session (what deleting it removes from the FTS and vector indexes).
select id, uid from conv_turns where session_ref = :session_ref order by id;

-- name: stats_conversation_counts
-- The conversation layer's counts for `python aokun.py stats`.
select
    (select count(*) from conv_sessions)                                    as conversation_sessions,
    (select count(*) from conv_turns)                                       as conversation_turns,
    (select count(*) from conv_turns_fts)                                   as conversation_turns_fts,
    (select count(*) from conv_turn_vectors)                                as conversation_turn_vectors,
    (select count(*) from conv_turns where embedding_state = 'pending')     as conversation_turns_awaiting_vectors,
    (select count(*) from conv_files)                                       as conversation_files;

-- name: doctor_conversation_checks
-- The conversation layer's inconsistencies; n > 0 is a problem.
select 'conversation turns without an FTS row' as problem,
       count(*) as n from conv_turns where id not in (select rowid from conv_turns_fts)
union all
select 'conversation FTS rows without a turn',
       count(*) from conv_turns_fts where rowid not in (select id from conv_turns)
union all
select 'conversation turns marked embedded without a vector',
       count(*) from conv_turns where embedding_state = 'done' and id not in (select turn_id from conv_turn_vectors)
union all
select 'conversation sessions whose turn count is wrong',
       count(*) from conv_sessions s where turn_count != (select count(*) from conv_turns t where t.session_ref = s.id)
union all
select 'conversation turns awaiting vectors (the next `python aokun.py ingest` back-fills them)',
       count(*) from conv_turns where embedding_state = 'pending';

-- name: doctor_turn_vector_checks
select 'conversation turn vectors missing from the KNN index' as problem,
       count(*) as n from conv_turn_vectors where turn_id not in (select turn_id from conv_turn_vec)
union all
select 'unusable (NaN or all-zero) conversation turn vectors, never found by meaning '
       || '(run `python aokun.py rebuild --vectors`)',
       count(*) from conv_turn_vectors where vec_distance_cosine(vec_int8(embedding), vec_int8(embedding)) is null;
