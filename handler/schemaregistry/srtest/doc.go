// Package srtest serves an in-memory Confluent Schema Registry for tests,
// as Confluent's mock:// registry does for its clients: franz-go's srfake
// (the REST endpoints the registry clients use: schemas by id, subjects and
// their versions, registration, lookup, compatibility), with outages on
// demand and a count of the requests served, so that a test can take the
// registry down mid-run and check what a consumer asked it.
package srtest
