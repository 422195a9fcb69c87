package consumer_test

import (
	"testing"

	"github.com/exactly-go/exactly/consumer"
)

// NewPool sizes the pool by PoolConns unless the database URL sets
// pool_max_conns; a URL that only mentions the words elsewhere (an
// application name, a password) is still sized by the rule.
func TestNewPoolSizesByPartitions(t *testing.T) {
	rule := consumer.PoolConns(6)
	for _, c := range []struct {
		url  string
		want int32
	}{
		{"postgres://app@db/app", rule},
		{"postgres://app@db/app?pool_max_conns=3", 3},
		{"host=db user=app pool_max_conns=5", 5},
		{"host=db user=app application_name=pool_max_conns_probe", rule},
		{"postgres://app:pool_max_conns@db/app", rule},
	} {
		pool, err := consumer.NewPool(t.Context(), c.url, 6)
		if err != nil {
			t.Fatalf("NewPool(%q): %v", c.url, err)
		}
		got := pool.Config().MaxConns
		pool.Close()
		if got != c.want {
			t.Errorf("NewPool(%q, 6 partitions): MaxConns %d, want %d", c.url, got, c.want)
		}
	}
}
