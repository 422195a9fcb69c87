package schemaregistry

// SubjectNameStrategy names the subject under which an encoder registers
// (or looks up) the schema of a record value for topic, whose record (or
// message) type has the fully qualified name recordName. The three of
// Confluent's serializers are [TopicNameStrategy] (the default),
// [RecordNameStrategy] and [TopicRecordNameStrategy].
type SubjectNameStrategy func(topic, recordName string) string

// TopicNameStrategy names the subject "<topic>-value": one schema (and its
// versions) per topic.
func TopicNameStrategy(topic, _ string) string { return topic + "-value" }

// RecordNameStrategy names the subject after the record type
// ("shop.OrderPaid"): a type shares one schema history across topics, and
// a topic may carry several types.
func RecordNameStrategy(_, recordName string) string { return recordName }

// TopicRecordNameStrategy names the subject "<topic>-<record type>": a
// topic may carry several types, each with its own history per topic.
func TopicRecordNameStrategy(topic, recordName string) string { return topic + "-" + recordName }
