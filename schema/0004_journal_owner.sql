-- Schema 4: the journal row's owner (host:pid), so a process that starts while another is still
-- writing leaves that write alone and only finishes writes whose process is gone.
alter table memory_write_ops add column owner text not null default '';
