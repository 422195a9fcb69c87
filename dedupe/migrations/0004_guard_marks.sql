-- Guard rows say how their record ended and where it came from:
--   state: 'applied' (the effect committed) or 'dead_lettered' (the record
--   was sent to the dead-letter topic in the transaction that wrote the row;
--   a redelivery of the same record is then a duplicate, and a record of the
--   same key at other coordinates takes the row over once);
--   topic, kafka_partition, kafka_offset: the record that claimed the key;
--   trace_id: its trace, when it carried one; handler: the handler's name.
-- Written by the consumer in its one claim statement; NULL for rows claimed
-- through Guard.Claim/ClaimBatch and for rows older than this migration.
-- The columns have constant defaults, so adding them rewrites nothing.
alter table {{.Table}}
    add column state           text    not null default 'applied',
    add column topic           text,
    add column kafka_partition integer,
    add column kafka_offset    bigint,
    add column trace_id        text,
    add column handler         text;
