//go:build !mutation

// The pacer on a JetStream stream: a mutation run leaves this out of its
// build (TestPacerStartsInTakeOrder runs the same steps on the in-memory
// reader).

package keyed_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// queueReader is the JetStream keyed reader as the pacer reads it (the
// lane's adapter, in a few lines).
type queueReader struct{ *queue.KeyedReader }

func (r queueReader) Next(ctx context.Context, key string, from uint64) (*queue.Msg, bool, error) {
	m, err := r.KeyedReader.Next(ctx, key, from)
	return m, m != nil, err
}

// TestKeyedStartsInTakeOrder: a key's job whose goroutine wakes after its
// slot, and after the slot of the key's next job, goes back (a slot
// missed); the next job, taken after it, must not have started first.
// Then, woken on time, the two start in order. The jobs are in a real
// JetStream stream: the one handed back is read again from it.
func TestKeyedStartsInTakeOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(testenv.StartNATS(t).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := queue.New(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureRetries(ctx, queue.RetryConfig{MaxMsgs: 100, MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureKeyedLane(ctx, queue.LaneSpec{Name: "demo", MaxBacklog: 10, MaxInflight: 4, Prefetch: 1,
		AckWait: 5 * time.Second, MaxBody: 1024, DedupWindow: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := q.Publish(ctx, queue.Job{ID: fmt.Sprintf("j%d", i), Lane: "demo", Key: "k", Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	reader, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &gatedClock{now: t0, gates: map[time.Time]chan struct{}{}}
	var mu sync.Mutex
	var started []string
	k, err := keyed.NewPacer(keyed.Config[*queue.Msg]{
		Lane: "demo", Reader: queueReader{reader}, Pair: nopPair{}, Claims: keyed.Local{}, Clock: clk,
		Start: func(_ context.Context, msg *queue.Msg, done func()) {
			mu.Lock()
			started = append(started, msg.Job().ID)
			mu.Unlock()
			done()
		},
		LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: func(string) keyed.Opts { return keyed.Opts{MaxInflight: 4} }, MaxInflight: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	reader.OnRequeue = k.Requeue
	startedNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), started...)
	}
	const period, maxLate = 100 * time.Millisecond, 20 * time.Millisecond
	// takeTwo reads and takes the key's next two jobs, slots a period
	// apart from base, and has each wait for its slot.
	takeTwo := func(base time.Time) (due [2]time.Time) {
		for i := range due {
			due[i] = base.Add(time.Duration(i+1) * period)
			if _, ok := k.TakeNext(ctx, "k", due[i], maxLate); !ok {
				t.Fatalf("job %d: not read or not taken", i)
			}
		}
		return due
	}

	due := takeTwo(t0)
	// j1's goroutine wakes at its slot; j0's has not woken yet.
	clk.wakeAt(due[1], due[1].Add(time.Millisecond))
	// A j1 that did not wait for j0's decision would start now: give it
	// the time to.
	deadline := time.Now().Add(200 * time.Millisecond)
	for len(startedNow()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	// j0 wakes a period late: its slot is missed and it goes back.
	clk.wakeAt(due[0], due[1].Add(time.Millisecond))
	k.WaitStarts()
	if s := startedNow(); len(s) != 0 {
		t.Fatalf("started %v while j0, the key's first job, went back: a later job of the key started before it", s)
	}
	if k.Missed() != 1 {
		t.Fatalf("missed %d, want 1 (j0's slot)", k.Missed())
	}

	// Both read again, from j0; woken on time they start in order.
	due = takeTwo(due[1].Add(time.Millisecond))
	clk.wakeAt(due[0], due[0])
	testenv.Eventually(t, 5*time.Second, "j0 starts", func() bool { return len(startedNow()) == 1 })
	clk.wakeAt(due[1], due[1])
	k.WaitStarts()
	if s := startedNow(); len(s) != 2 || s[0] != "j0" || s[1] != "j1" {
		t.Fatalf("started %v, want [j0 j1]", s)
	}
	if n := k.Inflight(); n != 0 {
		t.Fatalf("in flight after every job settled: %d", n)
	}
}
