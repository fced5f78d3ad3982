-- Schema 9: why a vector could not be made. An embedding endpoint that refuses an input for good
-- (an HTTP 4xx about the request, not 408/429) leaves the row's embedding_state 'pending' with the
-- endpoint's answer here; back-fill skips such rows, so one bad input never blocks the others, until
-- the text changes (an edit, a new session context) or `aokun rebuild --vectors` tries them again.
-- Independent of schema 8: only adds columns.
alter table documents add column embedding_error text;
alter table graph_entries add column embedding_error text;
