package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReplayOptions selects the dead letters Replay re-publishes.
type ReplayOptions struct {
	// Topic is the dead-letter topic to read; required.
	Topic string
	// Key, when non-nil, selects only records with exactly this key.
	Key []byte
	// Since and Until, when non-zero, select records dead-lettered at or
	// after Since and before Until (by the HeaderDeadLetteredAt header, or
	// the record's timestamp when the header is absent or unparsable).
	Since, Until time.Time
	// Limit, when positive, stops after that many records were replayed.
	Limit int
	// DryRun selects and counts but publishes nothing.
	DryRun bool
	// KafkaOptions are extra franz-go client options (TLS, SASL, …).
	KafkaOptions []kgo.Opt
	// Selected, when set, is called with each dead letter selected for
	// replay (with DryRun, each that would be replayed), in the order read;
	// `exactly replay -dry-run` lists them with it.
	Selected func(dead *kgo.Record)
}

// ReplayResult counts what Replay did.
type ReplayResult struct {
	// Read is the number of dead-letter records read.
	Read int
	// Replayed is the number re-published (or, with DryRun, that would be).
	Replayed int
	// Filtered is the number that did not match Key, Since or Until.
	Filtered int
	// Invalid is the number lacking a HeaderOriginalTopic header; they are
	// left alone.
	Invalid int
	// Truncated is the number refused because DeadLetters cut them to fit
	// (HeaderTruncated): replaying them would publish a corrupt record.
	// Their original is identified by the HeaderOriginalTopic,
	// HeaderOriginalPartition, HeaderOriginalOffset and HeaderOriginalSHA256
	// headers.
	Truncated int
	// Held is the number of dead letters not republished because a
	// truncated dead letter of the same original topic and key came before
	// them: republishing them would put them ahead of it, out of per-key
	// order. Recover the truncated original first, then replay them (for
	// instance with Since set after the truncated one).
	Held int
}

// Replay reads opts.Topic from its beginning up to its end as of the call
// (a direct consumer: no group, no committed offsets, nothing changes in the
// dead-letter topic), and re-publishes each selected record to its original
// topic (the HeaderOriginalTopic header) with its key, value and headers,
// minus the dead-letter headers and HeaderOutboxID. Records keep their
// message-id header (the original record's, when it had one: DeadLetters
// keeps it), so a downstream exactly consumer that already applied one
// treats its replay as a duplicate, and replaying twice is harmless. Dead
// letters DeadLetters truncated (HeaderTruncated) are refused and counted in
// ReplayResult.Truncated, never republished; so are, counted in
// ReplayResult.Held, the later dead letters of a refused one's original
// topic and key (a dead letter whose key was cut is tied to its key by
// HeaderOriginalKeySHA256). Order within a dead-letter partition is kept,
// and so is per-key order. (A dead letter whose key DeadLetters cut may sit
// in another dead-letter partition than the later ones of its key; those
// read before it are republished.)
//
// It fails when opts.Topic is empty or does not exist, when the brokers
// cannot be reached, or when publishing fails; the result then counts what
// was replayed before the failure (records are acknowledged in fetch-sized
// batches, so a failed batch may have been partly published).
func Replay(ctx context.Context, brokers []string, opts ReplayOptions) (ReplayResult, error) {
	var res ReplayResult
	if opts.Topic == "" {
		return res, errors.New("outbox: replay: no dead-letter topic")
	}
	if len(brokers) == 0 {
		return res, errors.New("outbox: replay: no Kafka brokers")
	}
	base := append(append([]kgo.Opt{}, opts.KafkaOptions...), kgo.SeedBrokers(brokers...))
	admin, err := kgo.NewClient(base...)
	if err != nil {
		return res, fmt.Errorf("outbox: replay: creating Kafka client: %w", err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	starts, err := adm.ListStartOffsets(ctx, opts.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return res, fmt.Errorf("outbox: replay: listing start offsets of %s: %w", opts.Topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, opts.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return res, fmt.Errorf("outbox: replay: listing end offsets of %s: %w", opts.Topic, err)
	}
	if len(ends[opts.Topic]) == 0 {
		return res, fmt.Errorf("outbox: replay: dead-letter topic %s does not exist", opts.Topic)
	}
	// Partitions still to read, with the offset that ends them.
	pending := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	for p, e := range ends[opts.Topic] {
		s, _ := starts.Lookup(opts.Topic, p)
		if e.Offset > s.Offset {
			pending[p] = e.Offset
			from[p] = kgo.NewOffset().At(s.Offset)
		}
	}
	if len(pending) == 0 {
		return res, nil
	}
	cl, err := kgo.NewClient(append(base,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{opts.Topic: from}),
		// Control records (a transaction's commit or abort marker) come
		// too: a partition that ends in one is done once its offset is
		// reached, instead of waiting for it until ctx ends.
		kgo.KeepControlRecords(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.AllowAutoTopicCreation(),
	)...)
	if err != nil {
		return res, fmt.Errorf("outbox: replay: creating Kafka client: %w", err)
	}
	defer cl.Close()

	var held heldKeys
	for len(pending) > 0 && (opts.Limit <= 0 || res.Replayed < opts.Limit) {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("outbox: replay: reading %s: %w", opts.Topic, err)
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("partition %d: %w", p, err))
		})
		if ferr != nil {
			return res, fmt.Errorf("outbox: replay: reading %s: %w", opts.Topic, ferr)
		}
		var out []*kgo.Record
		fetches.EachRecord(func(rec *kgo.Record) {
			end, ok := pending[rec.Partition]
			if !ok || rec.Offset >= end {
				return // past the end as of the call
			}
			if rec.Offset+1 >= end {
				delete(pending, rec.Partition)
			}
			if rec.Attrs.IsControl() {
				return // a transaction marker, not a dead letter
			}
			if opts.Limit > 0 && res.Replayed >= opts.Limit {
				return
			}
			res.Read++
			target, r := replayRecord(rec, opts)
			if r == replayOK && held.holds(target.Topic, rec) {
				r = replayHeld
			}
			switch r {
			case replayInvalid:
				res.Invalid++
			case replayFiltered:
				res.Filtered++
			case replayTruncated:
				res.Truncated++
				held.add(target.Topic, rec)
			case replayHeld:
				res.Held++
			default:
				res.Replayed++
				out = append(out, target)
				if opts.Selected != nil {
					opts.Selected(rec)
				}
			}
		})
		if len(out) == 0 || opts.DryRun {
			continue
		}
		if err := cl.ProduceSync(ctx, out...).FirstErr(); err != nil {
			res.Replayed -= len(out)
			return res, fmt.Errorf("outbox: replay: re-publishing %d records from %s: %w", len(out), opts.Topic, err)
		}
	}
	return res, nil
}

type replayVerdict int

const (
	replayOK replayVerdict = iota
	replayFiltered
	replayInvalid
	replayTruncated
	replayHeld
)

// heldKeys are the original (topic, key)s of the truncated dead letters
// Replay refused: their later dead letters are held. Keyless dead letters
// have no order to keep and hold nothing.
type heldKeys struct {
	keys map[string]bool // topic, NUL, key
	sums map[string]bool // topic, NUL, hex SHA-256 of a key DeadLetters cut
}

func (h *heldKeys) add(topic string, rec *kgo.Record) {
	if sum := headerValue(rec, HeaderOriginalKeySHA256); sum != "" {
		if h.sums == nil {
			h.sums = map[string]bool{}
		}
		h.sums[topic+"\x00"+sum] = true
		return
	}
	if rec.Key == nil {
		return
	}
	if h.keys == nil {
		h.keys = map[string]bool{}
	}
	h.keys[topic+"\x00"+string(rec.Key)] = true
}

// holds reports whether dead letter rec, of original topic, comes after a
// refused one of its (topic, key).
func (h *heldKeys) holds(topic string, rec *kgo.Record) bool {
	if rec.Key == nil {
		return false
	}
	if h.keys[topic+"\x00"+string(rec.Key)] {
		return true
	}
	if len(h.sums) == 0 {
		return false
	}
	sum := sha256.Sum256(rec.Key)
	return h.sums[topic+"\x00"+hex.EncodeToString(sum[:])]
}

// headerValue returns the value of rec's last header named name, or "".
func headerValue(rec *kgo.Record, name string) string {
	for i := len(rec.Headers) - 1; i >= 0; i-- {
		if rec.Headers[i].Key == name {
			return string(rec.Headers[i].Value)
		}
	}
	return ""
}

// replayRecord returns the record to publish for dead letter rec and its
// verdict: replayOK, or why not (nil for an invalid or filtered one; the
// record it would be for a truncated one).
func replayRecord(rec *kgo.Record, opts ReplayOptions) (*kgo.Record, replayVerdict) {
	var topic string
	var at time.Time
	truncated := false
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers))
	for _, h := range rec.Headers {
		switch h.Key {
		case HeaderOriginalTopic:
			topic = string(h.Value)
		case HeaderTruncated:
			truncated = string(h.Value) == "true"
		case HeaderDeadLetteredAt:
			if t, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
				at = t
			}
		}
		if !isDeadLetterHeader(h.Key) && h.Key != HeaderOutboxID {
			hs = append(hs, h)
		}
	}
	if topic == "" {
		return nil, replayInvalid
	}
	if at.IsZero() {
		at = rec.Timestamp
	}
	if opts.Key != nil && string(opts.Key) != string(rec.Key) ||
		!opts.Since.IsZero() && at.Before(opts.Since) ||
		!opts.Until.IsZero() && !at.Before(opts.Until) {
		return nil, replayFiltered
	}
	out := &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: hs}
	if truncated {
		return out, replayTruncated
	}
	return out, replayOK
}
