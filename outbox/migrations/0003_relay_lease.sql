-- The relay lease: which relay publishes {{.Table}}. One row per outbox
-- table, in one table per schema ({{.Lease}}), shared by the outbox tables of
-- that schema. A relay takes the row when it is absent or expired (epoch + 1),
-- renews it while active, and deletes published rows only in a transaction
-- that still finds its owner and epoch here. producer_id, drawn once per
-- outbox table, names the relay's Kafka transactional id, so a newer holder
-- fences an older one's producer.
create table if not exists {{.Lease}} (
    outbox      text        primary key,
    owner       uuid        not null,
    holder      text        not null,
    epoch       bigint      not null,
    since       timestamptz not null,
    renewed_at  timestamptz not null,
    expires_at  timestamptz not null,
    producer_id uuid        not null default gen_random_uuid()
);
