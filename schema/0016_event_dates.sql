-- Schema 16: a memory's event time, the first date its text names (rules/dates.toml, resolved
-- against its own created_at): [event_at, event_end) in ISO UTC, end exclusive; null when the text
-- names no date. Derived from content and created_at at every write (import and sync re-derive
-- it like the FTS text), so the export does not carry it. Memories stored before this schema get
-- theirs when rewritten (`aokun rebuild --fts`).
alter table documents add column event_at text;
alter table documents add column event_end text;
create index documents_event on documents(persona_id, event_at) where event_at is not null;
