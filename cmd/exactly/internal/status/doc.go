// Package status gathers what an operator of an exactly deployment asks
// about, for the CLI's status and inspect commands and the status page:
//
//   - per consumer group: its state and members, and its lag (the headline
//     lag leaves out stopped, Empty or Dead, groups); per group, topic and
//     partition: committed offset, end offset and lag (franz-go's kadm),
//     sampled twice to see whether a partition stalls (lag at both samples,
//     no commit between them);
//   - who holds the outbox's relay (its lease, or its advisory lock's
//     session);
//   - the outbox: backlog, age of the oldest unpublished row, parked rows
//     with their reason, size and the rows held behind them;
//   - the guard table: row count and the oldest row against retention;
//   - dead-letter topic sizes (end minus start offsets) and their latest
//     dead letters (through cmd/exactly/internal/deadletters);
//   - the duplicate ratio from the outcome counters, overall and over the
//     sampling interval;
//   - a history of the last HistorySize samples (lag, throughput, outbox
//     backlog), drawn on the page as inline SVG;
//   - Jaeger links from trace ids when Config.JaegerURL is set;
//   - for one key (Inspect): its guard row, dead-letter mark and outbox rows.
//
// Each part is read on its own: a part that cannot be read (the database
// or the broker down) is unknown, a problem, and the others are still
// read. Every problem says what to do and names its section of
// docs/operations.md. Listings show keys and texts through ShowKey,
// ShowText and ShowError: quoted, bounded, binary keys as hex:….
//
// Everything is read in read-only transactions and with Kafka admin
// requests that list and describe; nothing here writes. The SQL lives in
// queries.go, and columns added by later migrations (the guard's state,
// partition, offset, trace id and handler; the outbox's parked mark) are
// used only when the table has them.
//
// Page serves a Report as a small server-rendered HTML page (html/template,
// escaped; no JavaScript) that refreshes itself, sampled in the background
// every refresh while served; CheckListenAddr refuses
// non-loopback addresses unless explicitly allowed, and Serve answers only
// Host headers that name the page (its address, loopback names with its
// port, names given to Page.AllowHosts): any other gets 421, a guard
// against DNS rebinding.
package status
