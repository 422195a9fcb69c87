// Package migrate is a tiny versioned migration runner for the SQL schemas
// the exactly framework owns (the dedupe guard table, the outbox).
//
// A component (for example `dedupe:"public"."exactly_guard"`) owns an ordered
// list of [Migration]s, usually loaded with [Load] from an embedded directory
// of files named NNNN_name.sql. Each file is a text/template executed with
// component-specific data (typically the quoted table identifier produced by
// pgx.Identifier.Sanitize), so configured names are never spliced raw into SQL.
//
// [Apply] records applied versions in the exactly_schema_migrations table
// (created on first use, in the search_path's first schema), takes a
// transaction-scoped advisory lock so concurrent migrators serialize, and
// applies every missing version in a single transaction: either all of them
// commit, or none does. Running Apply again is a no-op. Versions present in the
// database but unknown to the caller (a newer binary migrated already) are
// left alone, so an older binary can still start during a rolling deploy.
//
// Given the component's main table ([WithTable]), Apply also re-creates a
// table that was dropped after it was migrated (a schema dropped with
// cascade, a test fixture reset, a partial restore): when versions are
// recorded but the table does not exist, it forgets them and applies every
// migration again, in the same transaction, and reports it in
// [Result.Recreated].
//
// The component string should include the configured table name, so two
// tables of the same kind with different names are migrated independently.
package migrate
