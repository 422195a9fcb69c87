-- The guard becomes a set of generations: {{.Table}} is the current
-- generation, the only one claims insert into; the Pruner rotates it (renames
-- it to a sealed generation and creates an empty {{.Table}} like it) when it
-- is older than the generation span, and drops a sealed generation whole once
-- its newest row is older than the retention: no delete, no dead rows.
-- Claims check every sealed generation (through the view {{.Sealed}}) before
-- they insert, so one key has one effect across generations.
--
-- {{.Generations}} lists the generations: name (the table's name, in the
-- guard's schema), since (when it became current), until (when it was
-- sealed; null for the current generation), counted (its self-counted
-- applied rows were moved into the outcome counters, so readers no longer
-- count them), legacy (the table this migration found: it keeps its
-- row-by-row pruning until it is dropped) and row_count (its rows, counted
-- when counted was set).
--
-- Online: this migration creates a small table and a view and leaves the
-- guard table, which keeps serving as the current generation; the first
-- rotation happens one span after it.
create table {{.Generations}} (
    name      text        primary key,
    since     timestamptz not null,
    until     timestamptz,
    counted   boolean     not null default false,
    legacy    boolean     not null default false,
    row_count bigint
);
insert into {{.Generations}} (name, since, legacy) values ({{.TableName}}, now(), true);
-- The sealed generations, one union all branch each (none yet).
create view {{.Sealed}} as
select null::text as scope, null::text as key, null::text as state, null::text as topic,
    null::integer as kafka_partition, null::bigint as kafka_offset, null::text as trace_id,
    null::text as handler, null::boolean as self_counted, null::timestamptz as processed_at,
    null::text as generation, null::boolean as counted
where false;
