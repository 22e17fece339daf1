package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/instance"
	"github.com/throttler/throttler/internal/testenv"
)

// fastGuard makes the guard's waits short enough for tests: a live entry is
// refreshed every 200 ms, a dead one expires after 1.5 s.
var fastGuard = instance.Timing{TTL: 1500 * time.Millisecond, Refresh: 200 * time.Millisecond, Poll: 50 * time.Millisecond}

// guardConfig is a one-lane config on the nats-server at natsURL, with the
// Redis at redisURL ("" for the in-memory pacer).
func guardConfig(t *testing.T, natsURL, redisURL string) config.Config {
	t.Helper()
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, data_dir: %q}
redis: {url: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    rate: 10
    burst: 1
    target: {http: {url: "http://127.0.0.1:1/never"}}
`, natsURL, t.TempDir(), redisURL)
	cfg, err := config.Parse("guard.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

type running struct {
	svc  *Service
	logs *testenv.LogBuffer
	errc chan error
	stop context.CancelFunc
}

// launch runs a service with the fast guard. It does not wait for it.
func launch(t *testing.T, cfg config.Config) *running {
	t.Helper()
	in := &running{logs: &testenv.LogBuffer{}, errc: make(chan error, 1)}
	in.svc = New(cfg, slog.New(slog.NewTextHandler(in.logs, nil)), nil)
	in.svc.guardTiming = fastGuard
	ctx, cancel := context.WithCancel(context.Background())
	in.stop = cancel
	go func() { in.errc <- in.svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-in.errc:
		case <-time.After(20 * time.Second):
			t.Error("service still running 20 s after cancel")
		}
		if t.Failed() {
			t.Logf("logs:\n%s", in.logs.String())
		}
	})
	return in
}

// ready waits until the instance serves, failing t if it exits first.
func (in *running) ready(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-in.svc.Ready():
	case err := <-in.errc:
		in.errc <- err
		t.Fatalf("instance exited instead of starting: %v\n%s", err, in.logs.String())
	case <-time.After(within):
		t.Fatalf("instance not ready after %v:\n%s", within, in.logs.String())
	}
}

// refused waits for the instance to exit with a pacer conflict naming want.
func (in *running) refused(t *testing.T, within time.Duration, want ...string) error {
	t.Helper()
	select {
	case <-in.svc.Ready():
		t.Fatalf("instance started; want it refused:\n%s", in.logs.String())
	case err := <-in.errc:
		in.errc <- err
		if !errors.Is(err, instance.ErrConflict) {
			t.Fatalf("exit error %v, want instance.ErrConflict", err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("error %q does not say %q", err, w)
			}
		}
		return err
	case <-time.After(within):
		t.Fatalf("instance neither refused nor started after %v:\n%s", within, in.logs.String())
	}
	return nil
}

func kvOf(t *testing.T, url string) jetstream.KeyValue {
	t.Helper()
	_, js := testenv.JetStream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: instance.Bucket, TTL: fastGuard.TTL, History: 1, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func holderID(t *testing.T, kv jetstream.KeyValue) string {
	t.Helper()
	e, err := kv.Get(context.Background(), instance.MemoryPacerKey)
	if err != nil {
		return ""
	}
	var info instance.Info
	if err := json.Unmarshal(e.Value(), &info); err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// TestSecondMemoryInstanceIsRefused: two instances without Redis on one
// JetStream would each drain at the full rate. The second refuses to start,
// naming the first, and starts once the first has stopped cleanly.
func TestSecondMemoryInstanceIsRefused(t *testing.T) {
	url := testenv.StartNATS(t).ClientURL()
	kv := kvOf(t, url)
	a := launch(t, guardConfig(t, url, ""))
	a.ready(t, 10*time.Second)
	id := holderID(t, kv)
	if id == "" {
		t.Fatal("the first instance holds no claim")
	}

	start := time.Now()
	b := launch(t, guardConfig(t, url, ""))
	err := b.refused(t, 5*time.Second, "another throttler instance", "id "+id, "already uses this JetStream with the in-memory pacer",
		"configure redis.url on every instance to share one limit")
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if holderID(t, kv) != id {
		t.Fatal("the refused instance touched the first one's claim")
	}

	// A clean stop releases the claim: the next instance starts at once.
	a.stop()
	if err := <-a.errc; err != nil {
		t.Fatalf("first instance: %v", err)
	}
	a.errc <- nil
	start = time.Now()
	c := launch(t, guardConfig(t, url, ""))
	c.ready(t, 10*time.Second)
	if waited := time.Since(start); waited > fastGuard.TTL {
		t.Fatalf("start after a clean stop took %v; the claim was not released", waited)
	}
}

// TestLostClaimStopsTheInstance: if another instance takes the claim while
// this one could not refresh it (here: it is overwritten), the instance
// stops and Run returns why, instead of pacing beside another in-memory
// pacer.
func TestLostClaimStopsTheInstance(t *testing.T) {
	url := testenv.StartNATS(t).ClientURL()
	kv := kvOf(t, url)
	in := launch(t, guardConfig(t, url, ""))
	in.ready(t, 10*time.Second)
	other, _ := json.Marshal(instance.Info{ID: "usurper", Host: "elsewhere", PID: 2})
	if _, err := kv.Put(context.Background(), instance.MemoryPacerKey, other); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-in.errc:
		in.errc <- err
		if !errors.Is(err, instance.ErrConflict) || !strings.Contains(err.Error(), "usurper") {
			t.Fatalf("Run returned %v, want a conflict naming the other instance", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("instance still running 5 s after losing its claim")
	}
	if id := holderID(t, kv); id != "usurper" {
		t.Fatalf("the stopping instance deleted the other's claim (holder %q)", id)
	}
}
