package service_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/testenv"
)

// TestEmbeddedMemoryWarning: an instance on the embedded server whose lanes'
// bounds allow more than config.EmbeddedMemoryWarn of de-duplication index
// says so at start, with what to set; one default lane stays quiet.
func TestEmbeddedMemoryWarning(t *testing.T) {
	t.Parallel()
	const warning = "embedded nats: the lanes' bounds allow more memory"
	t.Run("one lane", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:9/hook", 20, 10)
		_, logs := startLogged(t, cfg)
		if strings.Contains(logs.String(), warning) {
			t.Fatalf("warned for one default lane:\n%s", logs)
		}
	})
	t.Run("seven lanes", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:9/hook", 20, 10)
		for i := 1; i < 7; i++ {
			l := cfg.Lanes[0]
			l.Name = fmt.Sprintf("demo%d", i)
			cfg.Lanes = append(cfg.Lanes, l)
		}
		_, logs := startLogged(t, cfg)
		out := logs.String()
		for _, want := range []string{warning, `"estimate_mb":253`, `"dedup_ids":733740`, "nats.dedup_window", "nats.url"} {
			if !strings.Contains(out, want) {
				t.Errorf("start log lacks %q:\n%s", want, out)
			}
		}
	})
}

// TestNoRoomForMaxBytes: a stream whose max_bytes the embedded store
// cannot reserve stops the start with an error that names the field, what
// the store may use, what its streams reserve and what the config needs;
// a start with smaller bounds on the same store then works.
func TestNoRoomForMaxBytes(t *testing.T) {
	t.Parallel()
	const eib = config.ByteSize(1 << 60) // beyond any disk's three quarters
	for _, c := range []struct {
		field    string
		set      func(*config.Config)
		reserved string // by the streams created before the refused one
	}{
		{"lanes[1].max_bytes", func(cfg *config.Config) {
			l := cfg.Lanes[0]
			l.Name, l.MaxBytes = "huge", eib
			cfg.Lanes = append(cfg.Lanes, l)
		}, "192MiB"}, // retries, dead letters, lane demo
		{"retries.max_bytes", func(cfg *config.Config) { cfg.Retries.MaxBytes = eib }, "0B"},
		{"dead_letters.max_bytes", func(cfg *config.Config) { cfg.DeadLetters.MaxBytes = eib }, "64MiB"},
	} {
		t.Run(c.field, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(t, dir, "http://127.0.0.1:9/hook", 20, 10)
			c.set(&cfg)
			err := runFails(t, cfg)
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("Run: %v; want a config error on %s", err, c.field)
			}
			for _, want := range []string{"no room to reserve", "its streams reserve " + c.reserved + " already",
				"three quarters of the disk free at nats.data_dir", "config's streams need", "nats.url"} {
				if !strings.Contains(ce.Msg, want) {
					t.Errorf("error lacks %q: %v", want, err)
				}
			}
			t.Log(err)
			ok := testConfig(t, dir, "http://127.0.0.1:9/hook", 20, 10)
			startLogged(t, ok)
		})
	}
}

// TestNoRoomForMaxBytesExternal: on an external server the error names the
// field and what to change there.
func TestNoRoomForMaxBytesExternal(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATSWith(t, &server.Options{Port: -1, StoreDir: t.TempDir(), JetStreamMaxStore: 256 << 20})

	cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:9/hook", 20, 10)
	cfg.NATS.URL = ns.ClientURL()
	l := cfg.Lanes[0]
	l.Name, l.MaxBytes = "big", 128<<20 // 64MiB × 3 are reserved before it, of 256MiB
	cfg.Lanes = append(cfg.Lanes, l)
	err := runFails(t, cfg)
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Field != "lanes[1].max_bytes" {
		t.Fatalf("Run: %v; want a config error on lanes[1].max_bytes", err)
	}
	for _, want := range []string{"no room to reserve the stream's max_bytes (134217728 bytes)", "give JetStream more storage"} {
		if !strings.Contains(ce.Msg, want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}
