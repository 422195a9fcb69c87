// Package deadletters reads dead-letter topics for people: each dead letter
// with the reason, key, original coordinates, attempts and time that
// outbox.DeadLetters put in its headers. It only reads (a direct consumer:
// no group, no committed offsets), so it can run against production.
// `exactly deadletters` and `exactly inspect` use it; the status page can.
package deadletters

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/outbox"
)

// DefaultLatest is how many dead letters per topic Read returns when
// Options.Latest is 0.
const DefaultLatest = 20

// Letter is one dead letter, as its headers describe it.
type Letter struct {
	// Topic, Partition and Offset locate the dead letter itself.
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Key is the record's Kafka key for a person: text when printable,
	// 0x-prefixed hex otherwise, "(null)" when the record had none.
	Key string `json:"key"`
	// RawKey is the key's bytes.
	RawKey []byte `json:"-"`
	// Error is the reason the record was dead-lettered (HeaderError).
	Error string `json:"error"`
	// Handler is the handler that gave up (HeaderHandler), "" if absent.
	Handler string `json:"handler,omitempty"`
	// Attempts is how many times the handler ran, nil if the header is
	// absent or not a number.
	Attempts *int64 `json:"attempts"`
	// OriginalTopic, OriginalPartition and OriginalOffset are where the
	// record was consumed from; the numbers are nil when absent.
	OriginalTopic     string `json:"original_topic"`
	OriginalPartition *int64 `json:"original_partition"`
	OriginalOffset    *int64 `json:"original_offset"`
	// At is when it was dead-lettered (HeaderDeadLetteredAt, or the
	// record's timestamp when the header is absent or unparsable).
	At time.Time `json:"at"`
	// Truncated: DeadLetters cut the record to fit (replay refuses it).
	Truncated bool `json:"truncated,omitempty"`
	// MessageID is the record's message-id header, "" if absent.
	MessageID string `json:"message_id,omitempty"`
	// TraceID is the trace id of the record's W3C traceparent header (32
	// lower-case hex digits), "" if absent or malformed.
	TraceID string `json:"trace_id,omitempty"`
	// TraceURL is the trace in Jaeger; Read leaves it empty, a caller that
	// knows Jaeger's address fills it.
	TraceURL string `json:"trace_url,omitempty"`
}

// TraceIDOf returns the trace id of a W3C traceparent value
// ("00-<32 hex>-<16 hex>-<2 hex>"), "" when v is not one or its trace id
// is all zeros.
func TraceIDOf(v string) string {
	parts := strings.Split(strings.TrimSpace(v), "-")
	if len(parts) < 4 || len(parts[1]) != 32 || strings.Trim(parts[1], "0") == "" {
		return ""
	}
	for _, c := range parts[1] {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return ""
		}
	}
	return parts[1]
}

// Topic is one dead-letter topic and the dead letters read from it.
type Topic struct {
	Topic string `json:"topic"`
	// Records is how many records the topic holds (end minus start
	// offsets, over its partitions).
	Records int64 `json:"records"`
	// Letters are the dead letters read, oldest first (by At, then
	// partition and offset).
	Letters []Letter `json:"letters"`
}

// Options selects what Read reads.
type Options struct {
	// Topics are the dead-letter topics to read; empty means every topic
	// whose name ends with Suffix.
	Topics []string
	// Suffix marks dead-letter topics; "" means outbox.DefaultDeadLetterSuffix.
	Suffix string
	// Latest is how many of the newest dead letters of each topic to
	// return (0: DefaultLatest; negative: all of them). Without Match it
	// reads that many of the last offsets of each partition, so a topic
	// written in Kafka transactions, whose commit markers take offsets too,
	// may give fewer.
	Latest int
	// Match, when set, keeps only the dead letters it returns true for;
	// Read then reads each topic whole, and Latest counts matches.
	Match func(Letter) bool
}

// Read lists the dead-letter topics and reads, up to their end offsets as of
// the call, the latest dead letters of each. Without Match it reads only
// the last Latest records of each partition. It fails when the brokers
// cannot be reached, a named topic does not exist, or a fetch fails; ctx
// bounds the whole read.
func Read(ctx context.Context, cl *kgo.Client, opts Options) ([]Topic, error) {
	if opts.Suffix == "" {
		opts.Suffix = outbox.DefaultDeadLetterSuffix
	}
	if opts.Latest == 0 {
		opts.Latest = DefaultLatest
	}
	adm := kadm.NewClient(cl)
	topics := opts.Topics
	if len(topics) == 0 {
		listed, err := adm.ListTopics(ctx)
		if err != nil {
			return nil, fmt.Errorf("deadletters: listing topics: %w", err)
		}
		for _, t := range listed.Names() {
			if strings.HasSuffix(t, opts.Suffix) {
				topics = append(topics, t)
			}
		}
		if len(topics) == 0 {
			return []Topic{}, nil
		}
	}
	sort.Strings(topics)
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("deadletters: listing start offsets of %q: %w", topics, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("deadletters: listing end offsets of %q: %w", topics, err)
	}
	out := make([]Topic, 0, len(topics))
	for _, t := range topics {
		if len(ends[t]) == 0 {
			return nil, fmt.Errorf("deadletters: topic %s does not exist", t)
		}
		tp := Topic{Topic: t, Letters: []Letter{}}
		// Partitions to read: from where, and the offset that ends them.
		from := map[int32]int64{}
		until := map[int32]int64{}
		for p, e := range ends[t] {
			s, _ := starts.Lookup(t, p)
			tp.Records += e.Offset - s.Offset
			if e.Offset <= s.Offset {
				continue
			}
			first := s.Offset
			if opts.Match == nil && opts.Latest > 0 && e.Offset-int64(opts.Latest) > first {
				first = e.Offset - int64(opts.Latest)
			}
			from[p], until[p] = first, e.Offset
		}
		if len(from) > 0 {
			if tp.Letters, err = readTopic(ctx, cl, t, from, until, opts.Match); err != nil {
				return nil, err
			}
		}
		sort.SliceStable(tp.Letters, func(i, j int) bool {
			a, b := tp.Letters[i], tp.Letters[j]
			if !a.At.Equal(b.At) {
				return a.At.Before(b.At)
			}
			if a.Partition != b.Partition {
				return a.Partition < b.Partition
			}
			return a.Offset < b.Offset
		})
		if opts.Latest > 0 && len(tp.Letters) > opts.Latest {
			tp.Letters = tp.Letters[len(tp.Letters)-opts.Latest:]
		}
		out = append(out, tp)
	}
	return out, nil
}

// readTopic reads topic's partitions from from[p] up to until[p] with a
// direct consumer made from cl's options.
func readTopic(ctx context.Context, cl *kgo.Client, topic string, from, until map[int32]int64, match func(Letter) bool) ([]Letter, error) {
	offs := map[int32]kgo.Offset{}
	for p, o := range from {
		offs[p] = kgo.NewOffset().At(o)
	}
	// Control records (a transaction's commit or abort marker) come too:
	// a partition that ends in one is read once its offset is reached.
	opts := append(cl.Opts(), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offs}), kgo.KeepControlRecords())
	rd, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("deadletters: creating a reader of %s: %w", topic, err)
	}
	defer rd.Close()
	letters := []Letter{}
	for len(until) > 0 {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("deadletters: reading %s: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("partition %d: %w", p, err))
		})
		if ferr != nil {
			return nil, fmt.Errorf("deadletters: reading %s: %w", topic, ferr)
		}
		fs.EachRecord(func(rec *kgo.Record) {
			end, ok := until[rec.Partition]
			if !ok || rec.Offset >= end {
				return
			}
			if rec.Offset+1 >= end {
				delete(until, rec.Partition)
			}
			if rec.Attrs.IsControl() {
				return // a transaction marker, not a dead letter
			}
			l := FromRecord(rec)
			if match == nil || match(l) {
				letters = append(letters, l)
			}
		})
	}
	return letters, nil
}

// FromRecord describes dead letter rec by its headers. Headers that are
// absent leave their fields empty (nil for numbers); it never fails.
func FromRecord(rec *kgo.Record) Letter {
	l := Letter{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Key: Printable(rec.Key), RawKey: rec.Key, At: rec.Timestamp.UTC()}
	for _, h := range rec.Headers {
		v := string(h.Value)
		switch h.Key {
		case outbox.HeaderError:
			l.Error = v
		case outbox.HeaderHandler:
			l.Handler = v
		case outbox.HeaderAttempts:
			l.Attempts = parseInt(v)
		case outbox.HeaderOriginalTopic:
			l.OriginalTopic = v
		case outbox.HeaderOriginalPartition:
			l.OriginalPartition = parseInt(v)
		case outbox.HeaderOriginalOffset:
			l.OriginalOffset = parseInt(v)
		case outbox.HeaderDeadLetteredAt:
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				l.At = t.UTC()
			}
		case outbox.HeaderTruncated:
			l.Truncated = v == "true"
		case outbox.HeaderMessageID:
			l.MessageID = v
		case "traceparent":
			l.TraceID = TraceIDOf(v)
		}
	}
	return l
}

func parseInt(v string) *int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil
	}
	return &n
}

// Printable renders bytes for a person: as text when they are valid UTF-8
// without control characters, otherwise as 0x-prefixed hex; nil is "(null)".
func Printable(b []byte) string {
	if b == nil {
		return "(null)"
	}
	if utf8.Valid(b) && strings.IndexFunc(string(b), unicode.IsControl) < 0 {
		return string(b)
	}
	return "0x" + hex.EncodeToString(b)
}
