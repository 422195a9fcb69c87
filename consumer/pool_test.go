package consumer_test

import (
	"testing"

	"github.com/exactly-go/exactly/consumer"
)

// NewPool sizes the pool by PoolConns (the partitions, plus the relay's
// and the pruner's connections) unless the database URL sets
// pool_max_conns, in URL or keyword form; a URL that only mentions the
// words elsewhere (an application name, a password) is still sized by the
// rule. It connects to nothing.
func TestNewPoolSizesByPartitions(t *testing.T) {
	rule := consumer.PoolConns(6)
	for _, c := range []struct {
		url        string
		partitions int
		want       int32
	}{
		{"postgres://app@127.0.0.1:1/app", 6, rule},
		{"postgres://app@127.0.0.1:1/app", 0, consumer.PoolConns(1)},
		{"postgres://app@127.0.0.1:1/app?pool_max_conns=3", 6, 3},
		{"host=127.0.0.1 port=1 user=app pool_max_conns=20", 6, 20},
		{"host=127.0.0.1 port=1 user=app application_name=pool_max_conns_probe", 6, rule},
		{"postgres://app:pool_max_conns@127.0.0.1:1/app", 6, rule},
	} {
		pool, err := consumer.NewPool(t.Context(), c.url, c.partitions)
		if err != nil {
			t.Fatalf("NewPool(%q, %d): %v", c.url, c.partitions, err)
		}
		got := pool.Config().MaxConns
		pool.Close()
		if got != c.want {
			t.Errorf("NewPool(%q, %d partitions): MaxConns %d, want %d", c.url, c.partitions, got, c.want)
		}
	}
	if rule != 8 {
		t.Errorf("PoolConns(6) = %d, want 8 (six partitions, the relay, the pruner)", rule)
	}
}
