package queue_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
)

// poisonJob is a public job that can never be delivered, and what its
// dead letter must say.
type poisonJob struct {
	name    string
	key     string // the subject's key part, "" for throttle.demo
	size    int
	reason  string // in the dead letter's reason
	deadKey string // the dead letter's key
}

func poisonJobs(keyed bool) []poisonJob {
	jobs := []poisonJob{
		{name: "key with 0x7f", key: "k\x7f", size: 1, reason: "invalid Throttle-Key: the key has a byte 0x7f at 1", deadKey: `k\x7f`},
		{name: "key with a slash", key: "a/b", size: 1, reason: "invalid Throttle-Key: the key has a byte 0x2f at 1", deadKey: "a/b"},
		{name: "key too long", key: strings.Repeat("x", 200), size: 1, reason: "the key is 200 bytes", deadKey: strings.Repeat("x", queue.MaxKey)},
		{name: "payload over max_body", key: "k", size: 1024 + 100, reason: "payload too large: 1124 bytes, over the lane's max_body of 1024", deadKey: "k"},
	}
	if keyed {
		jobs = append(jobs, poisonJob{name: "no key", size: 1, reason: "no Throttle-Key"})
	}
	return jobs
}

// publishPoison publishes every poison job, each with its name as id, and
// returns the ids.
func publishPoison(t *testing.T, js jetstream.JetStream, jobs []poisonJob) {
	t.Helper()
	for _, p := range jobs {
		m := nats.NewMsg(queue.Subject("demo", p.key))
		m.Data = make([]byte, p.size)
		m.Header.Set(jetstream.MsgIDHeader, strings.ReplaceAll(p.name, " ", "-"))
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatalf("publish %s: %v", p.name, err)
		}
	}
}

// checkPoisonDead checks that each poison job has one dead letter, with
// its reason and one attempt.
func checkPoisonDead(t *testing.T, q *queue.Queue, jobs []poisonJob) {
	t.Helper()
	var dead []api.DeadLetter
	waitForCond(t, "every poison job dead-lettered", func() bool {
		var err error
		dead, err = q.ListDead(context.Background(), "demo", 0, 100)
		return err == nil && len(dead) >= len(jobs)
	})
	if len(dead) != len(jobs) {
		t.Fatalf("%d dead letters, want %d: %+v", len(dead), len(jobs), dead)
	}
	for _, p := range jobs {
		id := strings.ReplaceAll(p.name, " ", "-")
		i := slices.IndexFunc(dead, func(d api.DeadLetter) bool { return d.ID == id })
		if i < 0 {
			t.Errorf("%s: no dead letter", p.name)
			continue
		}
		d := dead[i]
		if !strings.Contains(d.Reason, p.reason) || d.Key != p.deadKey || d.Attempts != 1 {
			t.Errorf("%s: dead letter reason %q key %q attempts %d, want a reason with %q, key %q, 1 attempt",
				p.name, d.Reason, d.Key, d.Attempts, p.reason, p.deadKey)
		}
	}
}

// TestPlainLanePoisonDeadLetteredAtOnce: on a plain lane, a public job
// with a key the key rules refuse, or a payload over max_body, is
// dead-lettered when the drain first fetches it: it never reaches the
// drain and takes no attempt. The good job behind them comes next.
func TestPlainLanePoisonDeadLetteredAtOnce(t *testing.T) {
	s := spec()
	s.MaxBacklog = 100
	q, nc := newQueue(t, s)
	var counted atomic.Int64
	q.OnPoison("demo", func() { counted.Add(1) })
	js, _ := jetstream.New(nc)
	jobs := poisonJobs(false)
	publishPoison(t, js, jobs)
	publishPublic(t, js, "good.key", "good")
	c := consumer(t, q, "demo")
	m := nextJob(t, c, "the good job")
	if m.Job().ID != "good" || m.Job().Key != "good.key" {
		t.Fatalf("the drain got %s (key %q) first, want good: a poison job reached it", m.Job().ID, m.Job().Key)
	}
	_ = m.Ack()
	checkPoisonDead(t, q, jobs)
	if n := counted.Load(); n != int64(len(jobs)) {
		t.Fatalf("OnPoison heard %d poison jobs, want %d", n, len(jobs))
	}
}

// TestKeyedIntakePoisonDeadLetteredAtOnce: on a keyed lane's NATS intake,
// a job without a key, with a key the key rules refuse (0x7f among them,
// which nats-server's subject index does not match to throttle.demo.>),
// or with a payload over max_body, is dead-lettered at once and the jobs
// behind it move on.
func TestKeyedIntakePoisonDeadLetteredAtOnce(t *testing.T) {
	q, nc := newBareQueue(t)
	if err := q.EnsureKeyedLane(context.Background(), intakeSpec(100)); err != nil {
		t.Fatal(err)
	}
	var counted atomic.Int64
	q.OnPoison("demo", func() { counted.Add(1) })
	js, _ := jetstream.New(nc)
	jobs := poisonJobs(true)
	publishPoison(t, js, jobs)
	publishPublic(t, js, "k", "k-0")
	runIntake(t, q)
	if got := drainKeys(t, q, []string{"k"}, 1); !slices.Equal(got["k"], []string{"k-0"}) {
		t.Fatalf("key k read %v, want [k-0]", got["k"])
	}
	checkPoisonDead(t, q, jobs)
	if n := counted.Load(); n != int64(len(jobs)) {
		t.Fatalf("OnPoison heard %d poison jobs, want %d", n, len(jobs))
	}
	waitForCond(t, "the intake stream empty", func() bool {
		n, _ := streamMsgs(t, js, queue.IntakeStreamName("demo"))
		return n == 0
	})
}

// TestKeyedIntakeFullOfPoisonRecovers: a keyed lane with max_backlog 5
// whose intake stream is filled with poison jobs. Before the mover runs a
// sixth publish is refused (maximum messages exceeded) and the lane's
// backlog says 5, not 0; once the mover ran, the poison jobs are dead
// letters, the intake takes jobs again and they reach their keys.
func TestKeyedIntakeFullOfPoisonRecovers(t *testing.T) {
	q, nc := newBareQueue(t)
	ctx := context.Background()
	if err := q.EnsureKeyedLane(ctx, intakeSpec(5)); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	jobs := poisonJobs(true)
	publishPoison(t, js, jobs)
	m := nats.NewMsg(queue.Subject("demo", "k"))
	m.Header.Set(jetstream.MsgIDHeader, "k-over")
	var apiErr *jetstream.APIError
	if _, err := js.PublishMsg(ctx, m); !errors.As(err, &apiErr) || !strings.Contains(apiErr.Description, "maximum messages exceeded") {
		t.Fatalf("a sixth publish answered %v, want maximum messages exceeded", err)
	}
	if st, err := q.Stats(ctx, "demo"); err != nil || st.Stored != 5 || st.Pending != 5 {
		t.Fatalf("stats %+v (%v), want 5 jobs stored and waiting", st, err)
	}
	if d, err := q.Depth(ctx, "demo"); err != nil || d.Stored != 5 || d.Oldest.IsZero() {
		t.Fatalf("depth %+v (%v), want 5 jobs stored, the oldest's time", d, err)
	}
	runIntake(t, q)
	checkPoisonDead(t, q, jobs)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, id := range ids("k", 5) {
		// Polled: the last dead letter is stored a moment before its
		// original leaves the intake stream.
		for {
			mm := nats.NewMsg(queue.Subject("demo", "k"))
			mm.Header.Set(jetstream.MsgIDHeader, id)
			_, err := js.PublishMsg(pctx, mm)
			if err == nil {
				break
			}
			if pctx.Err() != nil {
				t.Fatalf("publish %s after the poison was dead-lettered: %v", id, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got := drainKeys(t, q, []string{"k"}, 5); !slices.Equal(got["k"], ids("k", 5)) {
		t.Fatalf("key k read %v, want %v", got["k"], ids("k", 5))
	}
}
