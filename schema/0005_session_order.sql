-- Schema 5: the order of memories within a session, for recall's session-neighbour step
-- (the memory right before/after a hit is found by one index seek, not a window over the session).
create index documents_session_order on documents(session_id, created_at, id);
-- pinned memories are checked against every query: find them without a scan
create index documents_pinned on documents(persona_id) where pinned = 1;
