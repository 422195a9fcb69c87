-- Parking: a row the relay can never publish (too large for its topic, an
-- illegal or forbidden topic, a policy violation) is marked here instead of
-- halting the relay. The relay skips parked rows and every later row of the
-- same (topic, key), so per-key order holds; "exactly outbox retry" clears
-- the mark, "exactly outbox drop" deletes the row.
alter table {{.Table}}
    add column parked_at   timestamptz,
    add column park_reason text;
-- Parked rows are few: the relay's "no parked row of my key" check and the
-- listing read them through this partial index.
create index on {{.Table}} (topic, key) where parked_at is not null;
