-- From this version on, a guard row claimed by ClaimRecords (the consumer's
-- claim) counts its own applied delivery: the claim sets self_counted, and
-- readers add the applied rows that have it to the counters, so a batch
-- whose records were all applied writes no counter row. Rows without it
-- (claimed before, or by an older binary still running during a rolling
-- deploy) were counted in the counter rows and are not counted again.
alter table {{.Table}} add column self_counted boolean;
