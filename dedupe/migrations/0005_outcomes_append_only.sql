-- Outcome counters become append-only: each batch inserts one row per scope
-- (the deltas it counts), in the pipeline that flushes its outbox rows,
-- instead of updating its partition's row. An insert costs no index lookup
-- and leaves no dead tuple behind; readers sum the rows, as before. The
-- pruner rolls the rows of each (scope, topic, partition) up into one.
do $$
declare
    pk text;
begin
    select conname into pk from pg_constraint
    where conrelid = '{{.Outcomes}}'::regclass and contype = 'p';
    if pk is not null then
        execute format('alter table {{.Outcomes}} drop constraint %I', pk);
    end if;
end
$$;
create index on {{.Outcomes}} (scope, topic, partition);
