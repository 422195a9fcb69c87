-- The guard table: one row per (scope, key) whose effect has committed.
-- {{.Table}} is the sanitized, possibly schema-qualified table identifier.
{{if .Schema}}create schema if not exists {{.Schema}};
{{end}}create table {{.Table}} (
    scope        text        not null,
    key          text        not null,
    processed_at timestamptz not null default now(),
    primary key (scope, key)
);
-- Pruning deletes by age; the index name is chosen by PostgreSQL.
create index on {{.Table}} (processed_at);
