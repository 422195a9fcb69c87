package consumer

// RedactDatabaseURLForTest exposes redactDatabaseURL to the external tests.
func RedactDatabaseURLForTest(s string) string { return redactDatabaseURL(s) }
