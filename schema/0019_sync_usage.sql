-- Schema 19: usage bookkeeping travels (issue 24 item 9). What a record's content hash leaves out
-- (importance, access and use counts, a session's turn count) changes without a new version: the
-- daily decay, a recall's access count. sync_base keeps that usage too, as JSON with the decay day
-- it is as of ({"day": …, "importance": …}), so a change of it is sent (and merged: the larger
-- count, the lower importance) unless the daily decay alone explains it: every device runs that.
-- A row from before has '' here: the next sync sends those records once more.
alter table sync_base add column usage text not null default '';
