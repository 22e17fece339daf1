package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/queue"
)

// TestLimitsWatchLoadedAfterStoredEntries: Loaded comes once the entries
// stored before the watch began are all handed over (the hold among them),
// so a starting lane can wait for it before its first fetch; a later change
// comes after it.
func TestLimitsWatchLoadedAfterStoredEntries(t *testing.T) {
	q, _ := newBareQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lim, err := q.EnsureLimits(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	rate := 3.0
	if err := lim.PutLane(ctx, "demo", queue.LaneLimit{Rate: 7, Burst: 2}); err != nil {
		t.Fatal(err)
	}
	if err := lim.PutKey(ctx, "demo", "k1", queue.KeyLimit{Rate: &rate}); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.PutPause(ctx, "demo", queue.LanePause{Paused: true, By: "op"}); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var seen []string
	note := func(s string) { mu.Lock(); seen = append(seen, s); mu.Unlock() }
	loaded := make(chan struct{})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- lim.Watch(wctx, "demo", queue.LimitsWatch{
			Lane:   func(v queue.LaneLimit) { note("lane") },
			Pause:  func(v queue.LanePause) { note("pause=" + map[bool]string{true: "on", false: "off"}[v.Paused]) },
			Key:    func(k string, v *queue.KeyLimit) { note("key " + k) },
			Bad:    func(e string, err error) { t.Errorf("bad entry %s: %v", e, err) },
			Loaded: func() { note("loaded"); close(loaded) },
		})
	}()
	select {
	case <-loaded:
	case <-ctx.Done():
		t.Fatal("Loaded never came")
	}
	if _, err := lim.PutPause(ctx, "demo", queue.LanePause{Paused: false}); err != nil {
		t.Fatal(err)
	}
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == 5 || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 5 || seen[3] != "loaded" || seen[4] != "pause=off" {
		t.Fatalf("calls %q: want the three stored entries, then loaded, then pause=off", seen)
	}
	stored := map[string]bool{}
	for _, s := range seen[:3] {
		stored[s] = true
	}
	if !stored["lane"] || !stored["pause=on"] || !stored["key k1"] {
		t.Fatalf("stored entries handed before loaded: %q", seen[:3])
	}
}
