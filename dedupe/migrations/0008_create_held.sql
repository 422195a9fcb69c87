-- What a consumer's partitions wait on, for `exactly status` and `exactly
-- inspect` (which read only the database). The consumer writes these rows
-- only when something waits (a failed attempt, a paused partition), from a
-- writer goroutine of the partition's worker (never the goroutine that
-- runs its records), outside any transaction, best effort: a write that
-- fails is logged and the rows may then lag behind the process. The owner of a
-- partition deletes its rows when the partition is assigned to it and when
-- it is revoked, so rows a killed process left are cleared by the next
-- owner.
--
-- {{.Held}} (the guard table's name with the suffix "_held"): one row per
-- record whose handler failed an attempt and that waits for its retry.
-- scope and key are the record's dedupe scope and key (null when the record
-- could not be keyed); last_error is the last failure, redacted of
-- connection secrets and bounded in length as log lines are; held_since is
-- the first failure, retry_at when the record runs again.
create table {{.Held}} (
    consumer_group text        not null,
    topic          text        not null,
    partition      integer     not null,
    record_offset  bigint      not null,
    scope          text,
    key            text,
    handler        text        not null,
    attempts       integer     not null,
    last_error     text        not null,
    held_since     timestamptz not null default now(),
    retry_at       timestamptz not null,
    primary key (consumer_group, topic, partition, record_offset)
);
-- `exactly inspect <key>` looks a key up.
create index on {{.Held}} (key);
-- {{.Paused}} (the guard table's name with the suffix "_paused"): one row
-- per partition whose fetching key concurrency paused because of held
-- records: reason 'held_limit' (consumer.Config.KeyConcurrency records are
-- held) or 'offset_gap' (its lowest unfinished record, lowest_unfinished, is
-- held and the partition reached consumer.Config.MaxOffsetGap offsets past
-- it). A partition that reaches the offset gap only because it has a
-- backlog (its lowest record runs) is not listed: that is flow control.
create table {{.Paused}} (
    consumer_group    text        not null,
    topic             text        not null,
    partition         integer     not null,
    reason            text        not null check (reason in ('held_limit', 'offset_gap')),
    lowest_unfinished bigint      not null,
    handler           text        not null,
    paused_since      timestamptz not null default now(),
    primary key (consumer_group, topic, partition)
);
