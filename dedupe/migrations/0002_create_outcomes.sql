-- Outcome counters: deliveries by (scope, topic, partition) and outcome,
-- incremented in the same transaction as the records they count, so they are
-- exact across crashes and redeliveries (the duplicate-rate diagnostic and
-- the chaos checker read them). One row per partition: no hot row shared by
-- concurrent partition workers.
create table {{.Outcomes}} (
    scope         text        not null,
    topic         text        not null,
    partition     integer     not null,
    applied       bigint      not null default 0,
    duplicate     bigint      not null default 0,
    dead_lettered bigint      not null default 0,
    updated_at    timestamptz not null default now(),
    primary key (scope, topic, partition)
);
