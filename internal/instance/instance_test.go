package instance_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/instance"
	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fast makes the guard's waits short: a live entry is refreshed every
// 200 ms, a dead one expires after 1.5 s.
var fast = instance.Timing{TTL: 1500 * time.Millisecond, Refresh: 200 * time.Millisecond, Poll: 50 * time.Millisecond}

// jetStream connects to a fresh in-process nats-server.
func jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := testenv.JetStream(t, testenv.StartNATS(t).ClientURL())
	return js
}

// claim registers an instance of pacer kind; it is released when the test
// ends.
func claim(t *testing.T, js jetstream.JetStream, pacer string, l *testenv.LogBuffer) (context.Context, *instance.Entry, error) {
	t.Helper()
	if l == nil {
		l = &testenv.LogBuffer{}
	}
	ctx, e, err := instance.Claim(context.Background(), instance.Config{
		JetStream: js, Timing: fast, Logger: slog.New(slog.NewTextHandler(l, nil)),
		Self: instance.Info{Listen: "127.0.0.1:8080", Pacer: pacer},
	})
	if err == nil {
		t.Cleanup(e.Release)
	}
	return ctx, e, err
}

func bucket(t *testing.T, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: instance.Bucket, TTL: fast.TTL, History: 1, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func holder(t *testing.T, kv jetstream.KeyValue) string {
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

func wantConflict(t *testing.T, err error, says ...string) {
	t.Helper()
	if !errors.Is(err, instance.ErrConflict) {
		t.Fatalf("Claim = %v, want ErrConflict", err)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not say %q", err, s)
		}
	}
}

// TestSecondMemoryPacerRefused: a second in-memory instance on one
// JetStream is refused within about a refresh, naming the first, and
// touches nothing of the first's claim; after a clean release the next one
// claims at once.
func TestSecondMemoryPacerRefused(t *testing.T) {
	js := jetStream(t)
	_, first, err := claim(t, js, instance.PacerMemory, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv := bucket(t, js)
	if holder(t, kv) != first.ID() {
		t.Fatalf("claim held by %q, want %q", holder(t, kv), first.ID())
	}
	start := time.Now()
	_, _, err = claim(t, js, instance.PacerMemory, nil)
	wantConflict(t, err, "another throttler instance", "id "+first.ID(), "already uses this JetStream with the in-memory pacer",
		"configure redis.url on every instance to share one limit")
	if took := time.Since(start); took > fast.TTL {
		t.Fatalf("refused after %v, want about a refresh (%v)", took, fast.Refresh)
	}
	if holder(t, kv) != first.ID() {
		t.Fatal("the refused instance touched the first one's claim")
	}
	first.Release()
	start = time.Now()
	_, third, err := claim(t, js, instance.PacerMemory, nil)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > fast.TTL {
		t.Fatalf("claim after a clean release took %v; it was not released", took)
	}
	if holder(t, kv) != third.ID() {
		t.Fatal("the new instance does not hold the claim")
	}
}

// TestRedisInstancesShareButNotWithMemory: any number of Redis instances
// share a JetStream; an in-memory one next to them is refused, and a Redis
// one next to an in-memory one.
func TestRedisInstancesShareButNotWithMemory(t *testing.T) {
	js := jetStream(t)
	for range 2 {
		if _, _, err := claim(t, js, instance.PacerRedis, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := claim(t, js, instance.PacerMemory, nil)
	wantConflict(t, err, "instances using Redis share this JetStream", "configure the same redis.url")

	js2 := jetStream(t)
	if _, _, err := claim(t, js2, instance.PacerMemory, nil); err != nil {
		t.Fatal(err)
	}
	_, _, err = claim(t, js2, instance.PacerRedis, nil)
	wantConflict(t, err, "uses this JetStream with the in-memory pacer", "configure the same redis.url on every instance")
}

// TestCrashedClaimExpires: a claim nobody refreshes (its instance was
// killed) holds a new instance back until it expires, with a log line that
// says why; then the new instance claims.
func TestCrashedClaimExpires(t *testing.T) {
	js := jetStream(t)
	kv := bucket(t, js)
	dead, _ := json.Marshal(instance.Info{ID: "crashed", Host: "gone", PID: 1})
	if _, err := kv.Create(context.Background(), instance.MemoryPacerKey, dead); err != nil {
		t.Fatal(err)
	}
	l := &testenv.LogBuffer{}
	start := time.Now()
	_, e, err := claim(t, js, instance.PacerMemory, l)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < fast.TTL/2 {
		t.Fatalf("claimed after %v, before the stale claim could have expired", waited)
	}
	if s := l.String(); !strings.Contains(s, "waiting for it to be refreshed") || !strings.Contains(s, "crashed") {
		t.Fatalf("no log line about the wait:\n%s", s)
	}
	if holder(t, kv) != e.ID() {
		t.Fatalf("claim held by %q after the start", holder(t, kv))
	}
}

// TestLostClaimCancels: when another instance takes the claim, the context
// Claim returned is cancelled and Lost says why; the usurper's claim stays.
func TestLostClaimCancels(t *testing.T) {
	js := jetStream(t)
	ctx, e, err := claim(t, js, instance.PacerMemory, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv := bucket(t, js)
	other, _ := json.Marshal(instance.Info{ID: "usurper", Host: "elsewhere", PID: 2})
	if _, err := kv.Put(context.Background(), instance.MemoryPacerKey, other); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context still live 5 s after the claim was lost")
	}
	if err := e.Lost(); !errors.Is(err, instance.ErrConflict) || !strings.Contains(err.Error(), "usurper") {
		t.Fatalf("Lost = %v, want a conflict naming the other instance", err)
	}
	e.Release()
	if holder(t, kv) != "usurper" {
		t.Fatal("releasing a lost claim deleted the other instance's")
	}
}

// TestHeldByOthers: each instance using Redis sees what the other live
// instances may hold per lane, not itself, and forgets an instance once it
// released its entry.
func TestHeldByOthers(t *testing.T) {
	js := jetStream(t)
	start := func(held map[string]int) *instance.Entry {
		t.Helper()
		_, e, err := instance.Claim(context.Background(), instance.Config{
			JetStream: js, Timing: fast,
			Self: instance.Info{Listen: "127.0.0.1:8080", Pacer: instance.PacerRedis, Held: held},
		})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	a := start(map[string]int{"demo": 2, "slow": 1})
	t.Cleanup(a.Release)
	b := start(map[string]int{"demo": 5})
	c := start(map[string]int{"demo": 7, "fast": 50})
	t.Cleanup(c.Release)
	eventually := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a sees %d on demo, %d on fast; b sees %d on demo; others of a: %v",
					what, a.HeldByOthers("demo"), a.HeldByOthers("fast"), b.HeldByOthers("demo"), a.Others())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	eventually("every instance sees the two others", func() bool {
		return a.HeldByOthers("demo") == 12 && a.HeldByOthers("fast") == 50 && a.HeldByOthers("slow") == 0 &&
			b.HeldByOthers("demo") == 9 && c.HeldByOthers("demo") == 7 && c.HeldByOthers("slow") == 1 &&
			a.HeldByOthers("unknown") == 0 && len(a.Others()) == 2
	})
	b.Release()
	eventually("a released instance is forgotten", func() bool {
		return a.HeldByOthers("demo") == 7 && c.HeldByOthers("demo") == 2
	})
}
