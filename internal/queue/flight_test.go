package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/internal/queue"
)

// apiCalls is the JetStream API calls the account made so far (the
// AccountInfo call that reads it included).
func apiCalls(t *testing.T, nc *nats.Conn) uint64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ai, err := js.AccountInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ai.API.Total
}

// TestStaleCountsAreReadOnce: requests that find the lane's backlog count
// and queue position stale at the same moment share one JetStream read of
// each, instead of one per request (a herd of stream and consumer infos
// every refresh under load). The counts stay right.
func TestStaleCountsAreReadOnce(t *testing.T) {
	s := spec()
	s.MaxBacklog = 1000
	q, nc := newQueue(t, s)
	ctx := context.Background()
	var last queue.PubResult
	for _, id := range []string{"a", "b", "c"} {
		res, err := q.Publish(ctx, queue.Job{ID: id, Lane: "demo", Payload: []byte(id)})
		if err != nil {
			t.Fatal(err)
		}
		last = res
	}
	const callers = 64
	const maxAge = time.Hour // stale only before the first read
	for _, c := range []struct {
		name string
		call func() (int64, error)
		want int64
	}{
		{"Backlog", func() (int64, error) { return q.Backlog(ctx, "demo", maxAge) }, 3},
		{"Ahead", func() (int64, error) { return q.Ahead(ctx, "demo", "", last.Seq, maxAge) }, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			sharedRead(t, nc, callers, func() {
				n, err := c.call()
				if err != nil || n != c.want {
					t.Errorf("%s: %d %v, want %d", c.name, n, err, c.want)
				}
			})
		})
	}
}

// sharedRead runs call on callers goroutines released at once and checks
// that they shared one JetStream read: one, plus the AccountInfo of
// apiCalls; a caller that arrives after the shared read finished finds the
// count fresh. A few reads are allowed on a slow machine: without sharing
// there are about one per caller.
func sharedRead(t *testing.T, nc *nats.Conn, callers int, call func()) {
	t.Helper()
	before := apiCalls(t, nc)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			<-start
			call()
		})
	}
	close(start)
	wg.Wait()
	if got := apiCalls(t, nc) - before - 1; got < 1 || got > 4 {
		t.Fatalf("%d callers made %d JetStream reads, want 1 (at most 4)", callers, got)
	}
}

// TestKeyedAheadReusesTheKeyCount: on a keyed lane, Ahead reuses a count
// of the key's stored jobs younger than maxAge that already saw the job
// asked about, and requests needing it at once share one read; a count
// read before the job was stored is not reused (it could miss jobs of the
// key ahead of it), and maxAge 0 always reads.
func TestKeyedAheadReusesTheKeyCount(t *testing.T) {
	q, nc := keyedLane(t)
	ctx := context.Background()
	publish := func(id string) uint64 {
		t.Helper()
		res, err := q.Publish(ctx, queue.Job{ID: id, Lane: "hooks", Key: "k", Payload: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		return res.Seq
	}
	publish("a")
	seqB := publish("b")
	const callers = 64
	sharedRead(t, nc, callers, func() {
		if n, err := q.Ahead(ctx, "hooks", "k", seqB, time.Hour); err != nil || n != 1 {
			t.Errorf("Ahead: %d %v, want 1", n, err)
		}
	})

	// A job stored after the count: asking about it reads again.
	seqC := publish("c")
	if n, err := q.Ahead(ctx, "hooks", "k", seqC, time.Hour); err != nil || n != 2 {
		t.Fatalf("Ahead of the job stored after the count: %d %v, want 2", n, err)
	}
	// Asking about b again reuses the newest count (it saw b): one too
	// many at most, never too few.
	before := apiCalls(t, nc)
	if n, err := q.Ahead(ctx, "hooks", "k", seqB, time.Hour); err != nil || n != 2 {
		t.Fatalf("Ahead of b from the kept count: %d %v, want 2", n, err)
	}
	if got := apiCalls(t, nc) - before - 1; got != 0 {
		t.Fatalf("a kept count made %d JetStream reads, want 0", got)
	}
	if n, err := q.Ahead(ctx, "hooks", "k", seqB, 0); err != nil || n != 2 {
		t.Fatalf("Ahead with maxAge 0: %d %v, want 2", n, err)
	}
}
