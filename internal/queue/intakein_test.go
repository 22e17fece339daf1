package queue_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

func intakeSpec(maxBacklog int64) queue.LaneSpec {
	return queue.LaneSpec{Name: "demo", MaxBacklog: maxBacklog, MaxInflight: 4, Prefetch: 1, AckWait: 5 * time.Second, MaxBody: 1024, DedupWindow: time.Minute}
}

// reconnect is a second Queue on nc's server with the lane set up again: an
// instance after a restart.
func reconnect(t *testing.T, nc *nats.Conn, spec queue.LaneSpec) *queue.Queue {
	t.Helper()
	q, _ := bareQueueOn(t, nc.ConnectedUrl())
	if err := q.EnsureKeyedLane(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	return q
}

// runIntake runs q's intake mover until the test ends, or until it stops by
// itself (OnMoved); the returned channel closes when it returned.
func runIntake(t *testing.T, q *queue.Queue) <-chan struct{} {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.RunIntake(ctx, "demo", slogDiscard())
	}()
	t.Cleanup(func() { cancel(); <-done })
	return done
}

// keyedQueue is a queue with the keyed lane demo (intakeSpec(100)), and a
// JetStream client on its server.
func keyedQueue(t *testing.T) (*queue.Queue, jetstream.JetStream) {
	t.Helper()
	q, nc := newBareQueue(t)
	if err := q.EnsureKeyedLane(context.Background(), intakeSpec(100)); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return q, js
}

// publishPublic stores a job with id on the public subject of key ("" for
// the lane's bare subject).
func publishPublic(t *testing.T, js jetstream.JetStream, key, id string) {
	t.Helper()
	m := nats.NewMsg(queue.Subject("demo", key))
	m.Data = []byte(id)
	m.Header.Set(jetstream.MsgIDHeader, id)
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
}

// drainKeys reads and settles the keys' jobs in order, as the lane's drain
// does, until want jobs were read, and returns each key's job ids.
func drainKeys(t *testing.T, q *queue.Queue, keys []string, want int) map[string][]string {
	t.Helper()
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	n := 0
	deadline := time.Now().Add(20 * time.Second)
	for n < want {
		if time.Now().After(deadline) {
			t.Fatalf("read %d of %d jobs in 20s: %v", n, want, got)
		}
		progress := false
		for _, key := range keys {
			m, err := r.Next(context.Background(), key, 1)
			if err != nil {
				t.Fatal(err)
			}
			if m == nil {
				continue
			}
			got[key] = append(got[key], m.Job().ID)
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			n++
			progress = true
		}
		if !progress {
			time.Sleep(5 * time.Millisecond)
		}
	}
	// An ack's delete is sent after it returns: the stream is judged once
	// every delete has been answered.
	r.WaitDeletes()
	return got
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) (uint64, jetstream.StreamConfig) {
	t.Helper()
	st, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs, info.Config
}

func ids(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// TestKeyedIntakeRestartMidMove: the mover dies after the lane stream
// confirmed a move and before it deleted the original; the instance that
// starts next moves the rest, and the repeated move is a duplicate: every
// job is stored on its key once, in order, and the intake stream ends
// empty.
func TestKeyedIntakeRestartMidMove(t *testing.T) {
	q, nc := newBareQueue(t)
	spec := intakeSpec(100)
	if err := q.EnsureKeyedLane(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	for i := range 5 {
		publishPublic(t, js, "k", fmt.Sprintf("k-%d", i))
	}
	var stoppedAt []uint64
	undo := queue.OnMoved(func(seq uint64) bool {
		if seq == 3 {
			stoppedAt = append(stoppedAt, seq)
			return true
		}
		return false
	})
	<-runIntake(t, q)
	undo()
	if !slices.Equal(stoppedAt, []uint64{3}) {
		t.Fatalf("stopped at %v, want at the move of sequence 3", stoppedAt)
	}
	if n, _ := streamMsgs(t, js, queue.IntakeStreamName("demo")); n != 3 {
		t.Fatalf("intake stream holds %d jobs after the stop, want 3 (the stopped move's original and two more)", n)
	}

	q2 := reconnect(t, nc, spec)
	runIntake(t, q2)
	got := drainKeys(t, q2, []string{"k"}, 5)
	if want := ids("k", 5); !slices.Equal(got["k"], want) {
		t.Fatalf("key k read %v, want %v once each, in order", got["k"], want)
	}
	// The last move's original is deleted after its copy can be read.
	waitForCond(t, "the intake stream empty", func() bool {
		n, _ := streamMsgs(t, js, queue.IntakeStreamName("demo"))
		return n == 0
	})
	if n, _ := streamMsgs(t, js, queue.StreamName("demo")); n != 0 {
		t.Errorf("lane stream holds %d jobs after all were read, want 0 (a duplicate stayed)", n)
	}
}

// TestKeyedIntakeMigratesFormerLayout: a lane stream of the former layout
// took the public subjects itself and is full of public jobs (the stall).
// Set up again, its public subjects move to the intake stream, the former
// intake consumer goes, and the jobs it held are moved onto their keys
// before the intake stream's, across a restart in the middle of the
// migration: each once, in order per key; the keyless one dead-lettered;
// and the lane stream's max_backlog is back once they are moved.
func TestKeyedIntakeMigratesFormerLayout(t *testing.T) {
	q, nc := newBareQueue(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	spec := intakeSpec(6)
	old, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      queue.StreamName("demo"),
		Subjects:  []string{"throttle.demo", "throttle.demo.>", "throttler.lane.demo", "throttler.lane.demo.>"},
		Retention: jetstream.LimitsPolicy, MaxMsgs: 6, Discard: jetstream.DiscardNew,
		Duplicates: time.Minute, AllowDirect: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: queue.IntakeConsumerName,
		FilterSubjects: []string{"throttle.demo", "throttle.demo.>"}, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		publishPublic(t, js, "a", fmt.Sprintf("a-%d", i))
		if i < 2 {
			publishPublic(t, js, "b", fmt.Sprintf("b-%d", i))
		}
	}
	publishPublic(t, js, "", "nokey")
	if n, _ := streamMsgs(t, js, queue.StreamName("demo")); n != 6 {
		t.Fatalf("former lane stream holds %d jobs, want 6 (full)", n)
	}

	if err := q.EnsureKeyedLane(ctx, spec); err != nil {
		t.Fatal(err)
	}
	n, cfg := streamMsgs(t, js, queue.StreamName("demo"))
	if n != 6 || cfg.MaxMsgs != 12 || slices.Contains(cfg.Subjects, "throttle.demo.>") {
		t.Fatalf("lane stream during the migration: %d jobs, max %d, subjects %v; want 6, 6+6, internal subjects only", n, cfg.MaxMsgs, cfg.Subjects)
	}
	if _, err := old.Consumer(ctx, queue.IntakeConsumerName); err == nil {
		t.Errorf("the former intake consumer is still there")
	}
	// Published after the upgrade: into the intake stream, moved after
	// the former layout's jobs.
	publishPublic(t, js, "a", "a-3")
	publishPublic(t, js, "b", "b-2")
	if n, _ := streamMsgs(t, js, queue.IntakeStreamName("demo")); n != 2 {
		t.Fatalf("intake stream holds %d jobs, want 2", n)
	}

	// The first instance dies after moving the former layout's second job.
	undo := queue.OnMoved(func(seq uint64) bool { return seq == 2 })
	<-runIntake(t, q)
	undo()

	q2 := reconnect(t, nc, spec)
	if _, cfg := streamMsgs(t, js, queue.StreamName("demo")); cfg.MaxMsgs != 6+5 {
		t.Errorf("lane stream's max after the restart: %d, want 6 + the 5 public jobs left", cfg.MaxMsgs)
	}
	runIntake(t, q2)
	got := drainKeys(t, q2, []string{"a", "b"}, 7)
	if want := ids("a", 4); !slices.Equal(got["a"], want) {
		t.Errorf("key a read %v, want %v", got["a"], want)
	}
	if want := ids("b", 3); !slices.Equal(got["b"], want) {
		t.Errorf("key b read %v, want %v", got["b"], want)
	}
	waitForCond(t, "the lane stream's max_backlog back at 6", func() bool {
		_, cfg := streamMsgs(t, js, queue.StreamName("demo"))
		return cfg.MaxMsgs == 6
	})
	if n, _ := streamMsgs(t, js, queue.StreamName("demo")); n != 0 {
		t.Errorf("lane stream holds %d jobs after all were read, want 0", n)
	}
	dead, err := q2.ListDead(ctx, "demo", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].ID != "nokey" {
		t.Errorf("dead letters %+v, want the job published without a key", dead)
	}
}

// waitForCond polls cond for up to 10 s.
func waitForCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKeyedIntakeOversizedJobDeadLettered: a public job whose payload is
// over max_body still fits the intake stream (which leaves HeaderRoom for
// the publisher's headers), but its copy with the throttler's headers may
// not fit the lane stream. At the head of the intake stream it must be
// dead-lettered (its payload cut at max_body), not retried forever in front
// of every job behind it.
func TestKeyedIntakeOversizedJobDeadLettered(t *testing.T) {
	q, nc := newBareQueue(t)
	spec := intakeSpec(100)
	if err := q.EnsureKeyedLane(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(queue.Subject("demo", "k"))
	m.Data = make([]byte, spec.MaxBody+queue.HeaderRoom-50)
	m.Header.Set(jetstream.MsgIDHeader, "big")
	dead := poisonThenGood(t, q, nc, m, "the oversized job")
	if len(dead) != 1 || dead[0].ID != "big" || dead[0].Size != int(spec.MaxBody) || !strings.Contains(dead[0].Reason, "max_body") {
		t.Fatalf("dead letters %+v, want job big, its payload cut at %d, the reason naming max_body", dead, spec.MaxBody)
	}
	js, _ := jetstream.New(nc)
	waitForCond(t, "the intake stream empty", func() bool {
		n, _ := streamMsgs(t, js, queue.IntakeStreamName("demo"))
		return n == 0
	})
}

// TestKeyedIntakeMigrationRepeatAfterCopyRead: the mover dies between
// moving a former layout's public job and deleting it, and the job's copy
// is read and settled before the next instance repeats the move. The
// repeated move is a duplicate of a copy that is gone: it must not store
// the job a second time.
func TestKeyedIntakeMigrationRepeatAfterCopyRead(t *testing.T) {
	q, nc := newBareQueue(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	spec := intakeSpec(6)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      queue.StreamName("demo"),
		Subjects:  []string{"throttle.demo", "throttle.demo.>", "throttler.lane.demo", "throttler.lane.demo.>"},
		Retention: jetstream.LimitsPolicy, MaxMsgs: 6, Discard: jetstream.DiscardNew,
		Duplicates: time.Minute, AllowDirect: true,
	}); err != nil {
		t.Fatal(err)
	}
	publishPublic(t, js, "b", "b-0")
	if err := q.EnsureKeyedLane(ctx, spec); err != nil {
		t.Fatal(err)
	}
	undo := queue.OnMoved(func(seq uint64) bool { return seq == 1 })
	<-runIntake(t, q)
	undo()
	if got := drainKeys(t, q, []string{"b"}, 1); !slices.Equal(got["b"], []string{"b-0"}) {
		t.Fatalf("key b read %v, want [b-0]", got["b"])
	}

	q2 := reconnect(t, nc, spec)
	runIntake(t, q2)
	waitForCond(t, "the migration done (max_backlog back at 6)", func() bool {
		_, cfg := streamMsgs(t, js, queue.StreamName("demo"))
		return cfg.MaxMsgs == 6
	})
	if n, _ := streamMsgs(t, js, queue.StreamName("demo")); n != 0 {
		r, _ := q2.KeyedReader("demo")
		m, _ := r.Next(ctx, "b", 1)
		var id string
		if m != nil {
			id = m.Job().ID
		}
		t.Fatalf("lane stream holds %d jobs after the repeated move (next on key b: %q), want 0: the job was stored twice", n, id)
	}
}

// TestKeyedIntakeBadKeyDeadLetterFitsMaxPayload: a public job with a long
// invalid key and a payload over max_body, on a server whose max_payload
// is max_body plus room for headers (as the embedded server is started):
// its dead letter must fit max_payload, or the job stays at the head of
// the intake stream forever, in front of every job behind it.
func TestKeyedIntakeBadKeyDeadLetterFitsMaxPayload(t *testing.T) {
	spec := intakeSpec(100)
	srv := testenv.StartNATSWith(t, &server.Options{Port: -1, StoreDir: t.TempDir(), MaxPayload: int32(spec.MaxBody + queue.HeaderRoom)})
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q := reconnect(t, nc, spec)
	m := nats.NewMsg(queue.Subject("demo", strings.Repeat("x", 3000)))
	m.Data = make([]byte, spec.MaxBody+2000)
	m.Header.Set(jetstream.MsgIDHeader, "badkey")
	dead := poisonThenGood(t, q, nc, m, "the job with a bad key")
	if len(dead) != 1 || dead[0].ID != "badkey" || !strings.Contains(dead[0].Reason, "Throttle-Key") {
		t.Fatalf("dead letters %+v, want job badkey, the reason naming the key", dead)
	}
}

// poisonThenGood publishes m, a public job that can never move, then a good
// job k-0 on key k, runs the intake and checks that k-0 reaches its key
// past m. It returns the lane's dead letters.
func poisonThenGood(t *testing.T, q *queue.Queue, nc *nats.Conn, m *nats.Msg, what string) []api.DeadLetter {
	t.Helper()
	js, _ := jetstream.New(nc)
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatalf("publish %s: %v", what, err)
	}
	publishPublic(t, js, "k", "k-0")
	runIntake(t, q)
	got := drainKeys(t, q, []string{"k"}, 1)
	if !slices.Equal(got["k"], []string{"k-0"}) {
		t.Fatalf("key k read %v, want [k-0]", got["k"])
	}
	dead, err := q.ListDead(context.Background(), "demo", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	return dead
}
