package config_test

import (
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
)

// TestExampleConfigStaysUnderEmbeddedMemoryWarn: `make run`'s config (one
// lane at 20/s, burst 10, max_backlog 100,000, a 2-minute dedup window)
// bounds the de-duplication index at 100,000 + 2·(10 + 2,400) ids, about
// 109 MB with the embedded server: a burst of any size is refused (429)
// before the instance reaches the 150 MB of EmbeddedMemoryWarn.
func TestExampleConfigStaysUnderEmbeddedMemoryWarn(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "configs", "throttler.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.DedupIDs(), int64(100_000+2*(10+20*120)); got != want {
		t.Fatalf("DedupIDs = %d, want %d", got, want)
	}
	if mem := cfg.EmbeddedMemory(); mem != config.EmbeddedBaseBytes+config.DedupIDBytes*cfg.DedupIDs() || mem > config.EmbeddedMemoryWarn {
		t.Fatalf("EmbeddedMemory = %d, want base + 230 B per id, at most %d", mem, config.EmbeddedMemoryWarn)
	}
}

// TestDedupIDs steps through the terms of the bound.
func TestDedupIDs(t *testing.T) {
	lane := func(rate string, burst int, backlog int64) config.Lane {
		r, err := bucket.ParseRate(rate)
		if err != nil {
			t.Fatal(err)
		}
		return config.Lane{Name: "l", Rate: r, Burst: burst, MaxBacklog: backlog}
	}
	for _, tc := range []struct {
		name   string
		window time.Duration
		lanes  []config.Lane
		ids    int64
	}{
		{"no lanes", 2 * time.Minute, nil, 0},
		{"backlog only at a slow rate", 2 * time.Minute, []config.Lane{lane("1/h", 1, 1000)}, 1000 + 2*(1+1)},
		{"rate fills the window", time.Minute, []config.Lane{lane("1000/s", 50, 10)}, 10 + 2*(50+60_000)},
		{"lanes add up", 10 * time.Second, []config.Lane{lane("10/s", 5, 100), lane("0.5", 1, 7)}, (100 + 2*(5+100)) + (7 + 2*(1+5))},
		// Seven lanes of defaults: about 734,000 ids, over the warning.
		{"seven default lanes", 2 * time.Minute, []config.Lane{
			lane("20/s", 10, config.DefaultMaxBacklog), lane("20/s", 10, config.DefaultMaxBacklog), lane("20/s", 10, config.DefaultMaxBacklog),
			lane("20/s", 10, config.DefaultMaxBacklog), lane("20/s", 10, config.DefaultMaxBacklog), lane("20/s", 10, config.DefaultMaxBacklog),
			lane("20/s", 10, config.DefaultMaxBacklog),
		}, 7 * (100_000 + 2*(10+2400))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			c.NATS.DedupWindow = config.Duration(tc.window)
			c.Lanes = tc.lanes
			if got := c.DedupIDs(); got != tc.ids {
				t.Fatalf("DedupIDs = %d, want %d", got, tc.ids)
			}
			over := c.EmbeddedMemory() > config.EmbeddedMemoryWarn
			if want := tc.name == "seven default lanes"; over != want {
				t.Fatalf("EmbeddedMemory %d over the warning: %v, want %v", c.EmbeddedMemory(), over, want)
			}
		})
	}
}

// TestStreamBytes: each lane's max_bytes once, a keyed lane's twice (its
// intake and its store), plus the retry and dead-letter streams'; the
// example config reserves 3GiB.
func TestStreamBytes(t *testing.T) {
	c := config.Default()
	c.Retries.MaxBytes, c.DeadLetters.MaxBytes = 5<<20, 7<<20
	if got := c.StreamBytes(); got != 12<<20 {
		t.Fatalf("no lanes: %d", got)
	}
	c.Lanes = []config.Lane{{MaxBytes: 1 << 30}, {MaxBytes: 1 << 20, PerKey: &config.PerKey{}}}
	if got, want := c.StreamBytes(), int64(12<<20+1<<30+2<<20); got != want {
		t.Fatalf("StreamBytes = %d, want %d", got, want)
	}
	c.Lanes = append(c.Lanes, config.Lane{MaxBytes: math.MaxInt64 - 1})
	if got := c.StreamBytes(); got != math.MaxInt64 {
		t.Fatalf("an overflowing sum = %d, want MaxInt64", got)
	}
	c.Lanes = nil
	c.Retries.MaxBytes, c.DeadLetters.MaxBytes = math.MaxInt64/2+1, math.MaxInt64/2+1
	if got := c.StreamBytes(); got != math.MaxInt64 {
		t.Fatalf("retries and dead letters overflowing = %d, want MaxInt64", got)
	}
	ex, err := config.Load(filepath.Join("..", "..", "configs", "throttler.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := config.ByteSize(ex.StreamBytes()).String(); got != "3GiB" {
		t.Fatalf("example config reserves %s", got)
	}
}

func TestByteSizeString(t *testing.T) {
	for b, want := range map[config.ByteSize]string{
		0: "0B", 1023: "1023B", 1024: "1KiB", 512 << 10: "512KiB", 1536: "1.5KiB",
		1 << 20: "1MiB", 3 << 30: "3GiB", 58<<30 + 400<<20: "58.4GiB", 1 << 40: "1024GiB",
	} {
		if got := b.String(); got != want {
			t.Errorf("ByteSize(%d) = %q, want %q", int64(b), got, want)
		}
	}
}
