-- The outbox table: one row per message committed by a transaction and not
-- yet published by the relay. {{.Table}} is the sanitized, possibly
-- schema-qualified table identifier.
{{if .Schema}}create schema if not exists {{.Schema}};
{{end}}create table {{.Table}} (
    id         bigserial   primary key,
    message_id uuid        not null default gen_random_uuid(),
    topic      text        not null,
    key        bytea,
    value      bytea,
    headers    jsonb,
    txid       xid8        not null default pg_current_xact_id(),
    created_at timestamptz not null default now()
);
-- Backlog reads the oldest row by age; the relay reads by id (the primary key).
create index on {{.Table}} (created_at);
