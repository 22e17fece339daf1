package queue_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// publishOutside publishes body on subject as an outside publisher would,
// with msgID as its Nats-Msg-Id when it is not empty.
func publishOutside(t *testing.T, js jetstream.JetStream, subject, msgID, body string, h nats.Header) *jetstream.PubAck {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	for k, v := range h {
		m.Header[k] = v
	}
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	ack, err := js.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

// TestLookupPublished: a job published on a plain lane's public subject is
// found by its Nats-Msg-Id, or by "<lane>-<seq>" when it had none, while it
// waits; an id nobody published, an HTTP job's msg id and a job that
// started and left are not found. The lookups store nothing.
func TestLookupPublished(t *testing.T) {
	q, nc := newQueue(t, queue.LaneSpec{Name: "demo", MaxBacklog: 100, MaxInflight: 2, Prefetch: 1, AckWait: 5 * time.Second,
		MaxBody: 1024, DedupWindow: time.Minute})
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	publishOutside(t, js, "throttle.demo", "order-1", "one", nats.Header{"Throttle-Reply": {"replies.shop.1"}})
	anon := publishOutside(t, js, "throttle.demo.k", "", "two", nil)
	if _, err := q.Publish(ctx, queue.Job{ID: "http-1", Lane: "demo", Payload: []byte("h")}); err != nil {
		t.Fatal(err)
	}
	before := msgsIn(t, js, queue.StreamName("demo"))

	for _, c := range []struct {
		id, body, key, reply string
	}{
		{"order-1", "one", "", "replies.shop.1"},
		{"demo-" + strconv.FormatUint(anon.Sequence, 10), "two", "k", ""},
	} {
		job, at, err := q.Lookup(ctx, "demo", c.id)
		if err != nil {
			t.Fatalf("lookup %s: %v", c.id, err)
		}
		if job.ID != c.id || string(job.Payload) != c.body || job.Key != c.key || job.Reply != c.reply || !job.Outside || at.IsZero() {
			t.Errorf("lookup %s: %+v at %v", c.id, job, at)
		}
	}
	for _, id := range []string{"order-2", "http-1", "demo-999", "demo-0" + strconv.FormatUint(anon.Sequence, 10)} {
		if _, _, err := q.Lookup(ctx, "demo", id); !errors.Is(err, queue.ErrNoSuchJob) {
			t.Errorf("lookup %s: %v, want ErrNoSuchJob", id, err)
		}
	}
	if after := msgsIn(t, js, queue.StreamName("demo")); after != before {
		t.Fatalf("the lookups changed the stream: %d messages, were %d", after, before)
	}
	// A lookup leaves no trace in the de-duplication window: the id
	// looked for is stored when it is published, and found then.
	if ack := publishOutside(t, js, "throttle.demo", "order-2", "three", nil); ack.Duplicate {
		t.Fatal("order-2, looked for before it was published, was taken for a duplicate")
	}
	if job, _, err := q.Lookup(ctx, "demo", "order-2"); err != nil || string(job.Payload) != "three" {
		t.Fatalf("lookup order-2 once published: %+v %v", job, err)
	}

	// Started and acked: gone from the stream.
	c := consumer(t, q, "demo")
	for range 4 {
		m := nextJob(t, c, "a stored job")
		if err := m.AckSync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the acked jobs gone", func() bool {
		_, _, err := q.Lookup(ctx, "demo", "order-1")
		return errors.Is(err, queue.ErrNoSuchJob)
	})
}

// TestLookupPublishedOnAKeyedLane: on a keyed lane a public job is found
// in the intake stream before it is moved, and on its key's subject after.
func TestLookupPublishedOnAKeyedLane(t *testing.T) {
	q, nc := newBareQueue(t)
	ctx := context.Background()
	if err := q.EnsureKeyedLane(ctx, intakeSpec(100)); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	publishOutside(t, js, "throttle.demo.k1", "order-1", "one", nil)
	anon := publishOutside(t, js, "throttle.demo.k2", "", "two", nil)
	ids := map[string]string{"order-1": "k1", "demo-" + strconv.FormatUint(anon.Sequence, 10): "k2"}
	for id, key := range ids {
		if job, _, err := q.Lookup(ctx, "demo", id); err != nil || job.Key != key || job.ID != id {
			t.Fatalf("lookup %s before the move: %+v %v", id, job, err)
		}
	}
	runIntake(t, q)
	testenv.Eventually(t, 10*time.Second, "the public jobs moved", func() bool {
		return msgsIn(t, js, queue.IntakeStreamName("demo")) == 0
	})
	for id, key := range ids {
		if job, _, err := q.Lookup(ctx, "demo", id); err != nil || job.Key != key || job.ID != id || !job.Outside {
			t.Fatalf("lookup %s after the move: %+v %v", id, job, err)
		}
	}
	if _, _, err := q.Lookup(ctx, "demo", "order-2"); !errors.Is(err, queue.ErrNoSuchJob) {
		t.Errorf("lookup of an unknown id: %v", err)
	}
}

func msgsIn(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	n, _ := streamMsgs(t, js, name)
	return n
}

// TestLookupPublishedOnReplicas: on a three-node JetStream cluster with a
// three-replica lane stream, where the stream's leader checks the msg id
// before it proposes a write and the expected last msg id only when it
// applies it, a lookup still finds a published job and stores nothing for
// an id nobody published.
func TestLookupPublishedOnReplicas(t *testing.T) {
	cluster := testenv.StartNATSCluster(t, 3)
	nc, err := nats.Connect(cluster.URLs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := queue.New(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	testenv.EventuallyNil(t, 30*time.Second, "a three-replica lane stream", func() error {
		if err := q.EnsureRetries(ctx, queue.RetryConfig{MaxMsgs: 1000, MaxBytes: 1 << 20, Replicas: 3}); err != nil {
			return err
		}
		return q.EnsureLane(ctx, queue.LaneSpec{Name: "demo", MaxBacklog: 100, MaxInflight: 2, Prefetch: 1, AckWait: 5 * time.Second,
			MaxBody: 1024, DedupWindow: time.Minute, Replicas: 3})
	})
	js, _ := jetstream.New(nc)
	publishOutside(t, js, "throttle.demo", "order-1", "one", nil)
	before := msgsIn(t, js, queue.StreamName("demo"))
	if job, _, err := q.Lookup(ctx, "demo", "order-1"); err != nil || job.ID != "order-1" || string(job.Payload) != "one" {
		t.Fatalf("lookup order-1: %+v %v", job, err)
	}
	for range 3 {
		if _, _, err := q.Lookup(ctx, "demo", "order-2"); !errors.Is(err, queue.ErrNoSuchJob) {
			t.Fatalf("lookup of an unknown id: %v, want ErrNoSuchJob", err)
		}
	}
	if after := msgsIn(t, js, queue.StreamName("demo")); after != before {
		t.Fatalf("the lookups changed the stream: %d messages, were %d", after, before)
	}
	// The stream goes on taking jobs and de-duplicating them.
	publishOutside(t, js, "throttle.demo", "order-2", "two", nil)
	if ack := publishOutside(t, js, "throttle.demo", "order-2", "two", nil); !ack.Duplicate {
		t.Fatal("a repeat of order-2 was stored again")
	}
	if job, _, err := q.Lookup(ctx, "demo", "order-2"); err != nil || job.ID != "order-2" {
		t.Fatalf("lookup order-2 once published: %+v %v", job, err)
	}
}

// BenchmarkLookupPublished: the cost of finding a job published over NATS
// by its Nats-Msg-Id (stream info, the probe, a direct get), and of not
// finding an unknown id (stream info, the probe), on a lane stream holding
// 1,000 jobs.
func BenchmarkLookupPublished(b *testing.B) {
	q, nc := newQueue(b, queue.LaneSpec{Name: "demo", MaxBacklog: 10000, MaxInflight: 2, Prefetch: 1, AckWait: 5 * time.Second,
		MaxBody: 1024, DedupWindow: time.Minute})
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	for i := range 1000 {
		m := nats.NewMsg("throttle.demo")
		m.Data = []byte("x")
		m.Header.Set(jetstream.MsgIDHeader, "order-"+strconv.Itoa(i))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("found", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, _, err := q.Lookup(ctx, "demo", "order-"+strconv.Itoa(i%1000)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unknown", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := q.Lookup(ctx, "demo", "nobody"); !errors.Is(err, queue.ErrNoSuchJob) {
				b.Fatal(err)
			}
		}
	})
}
