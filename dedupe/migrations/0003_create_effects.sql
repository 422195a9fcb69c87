-- External effects (dedupe.Effects): one row per (scope, key) whose call to
-- an external system was started ("started", committed in its own
-- transaction before the call, by CallReconciled) or whose result is
-- recorded ("done", written in the handler's transaction, by Call and
-- CallReconciled). {{.Effects}} is the sanitized, possibly schema-qualified
-- identifier: the guard table's name with the suffix "_effects".
create table {{.Effects}} (
    scope      text        not null,
    key        text        not null,
    state      text        not null check (state in ('started', 'done')),
    result     bytea,
    attempts   integer     not null default 0,
    started_at timestamptz,
    done_at    timestamptz,
    primary key (scope, key),
    check ((state = 'done') = (done_at is not null))
);
-- Pruning deletes done rows by age; operators list started rows by age.
create index on {{.Effects}} (done_at);
create index on {{.Effects}} (started_at) where state = 'started';
