-- Schema 20: a memory knows its project (issue 36). documents.project is the root of the
-- repository or folder the memory belongs to (a POSIX path, aokun.project_of), '' for a global
-- memory: what is about the user or people, and every memory from before. Recall prefers the
-- current project's memories and the global ones; the others only when none of those is relevant.
alter table documents add column project text not null default '';
create index documents_project on documents(persona_id, project) where project != '';
