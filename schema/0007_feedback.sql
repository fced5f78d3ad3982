-- Schema 7: what memory_feedback records. Ranking's frequency term counts use, not retrieval:
-- useful_count is how often the assistant said a memory helped an answer (memory_feedback with
-- useful = true), last_useful_at when it last did. access_count/last_access_at keep recording
-- retrieval (every recall's hits), which only slows the daily importance decay.
alter table documents add column useful_count real not null default 0;
alter table documents add column last_useful_at text;
