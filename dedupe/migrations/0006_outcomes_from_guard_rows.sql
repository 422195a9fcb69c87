-- From this version on, a guard row claimed by ClaimRecords (the consumer's
-- claim, which records the topic) counts its own applied delivery: readers
-- add the applied rows that carry a topic to the counters, and a batch whose
-- records were all applied writes no counter row. The rows claimed before
-- were counted in the counters already, so one correction row per (scope,
-- topic, partition) takes them out again; the totals read do not change.
insert into {{.Outcomes}} (scope, topic, partition, applied, duplicate, dead_lettered)
select scope, topic, kafka_partition, -count(*), 0, 0
from {{.Table}}
where state = 'applied' and topic is not null and kafka_partition is not null
group by scope, topic, kafka_partition;
