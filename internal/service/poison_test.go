package service_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// publishAs publishes a job with id on subject as the documented
// publisher, through JetStream, and fails the test when it is not stored.
func publishAs(t *testing.T, p *publisher, subject, id string, size int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := nats.NewMsg(subject)
	m.Data = make([]byte, size)
	m.Header.Set(jetstream.MsgIDHeader, id)
	if _, err := p.js.PublishMsg(ctx, m); err != nil {
		t.Fatalf("publish %s on %q: %v", id, subject, err)
	}
}

// deadLettered reads throttler_jobs_dead_lettered_total of lane demo from
// /metrics.
func deadLettered(t *testing.T, addr string) string {
	t.Helper()
	resp, err := pollClient.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, `throttler_jobs_dead_lettered_total{lane="demo"} `); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestPoisonOverNATSDeadLetteredAtOnce: the documented publisher publishes
// jobs that can never be delivered on a plain lane (throttle.demo.k<DEL>,
// a payload over max_body) and on a keyed lane (the same, and a job
// without a key). Each is a dead letter at once, with its reason; the
// target never sees it; the lane counts it in
// throttler_jobs_dead_lettered_total; the good job behind them is
// delivered. On the keyed lane, max_backlog 5 is filled with poison
// first: the intake takes jobs again once they are dead-lettered.
//
// Outcomes only (dead letters, counters, the target's arrivals, each polled
// for up to 10 s), in the parallel phase.
func TestPoisonOverNATSDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "keyed"}[keyed], func(t *testing.T) {
			throttlerURL, publisherURL := natsWithUsers(t)
			rec := newRecorder(t)
			var cfg config.Config
			if keyed {
				cfg = keyedConfig(t, rec.srv.URL+"/hook", 100, 10, 100, 10)
			} else {
				cfg = testConfig(t, t.TempDir(), rec.srv.URL+"/hook", 100, 10)
			}
			cfg.NATS.URL = throttlerURL
			cfg.Lanes[0].MaxBacklog = 5
			cfg.Lanes[0].MaxBody = 1024
			svc, _ := start(t, cfg)
			pub := connectPublisher(t, publisherURL)

			poison := map[string]string{ // id → subject
				"p-del":  queue.Subject("demo", "k\x7f"),
				"p-ctl":  queue.Subject("demo", "k\x01"),
				"p-long": queue.Subject("demo", strings.Repeat("k", 200)),
			}
			if keyed {
				poison["p-nokey"] = queue.Subject("demo", "")
			}
			var ids []string
			for id, subj := range poison {
				publishAs(t, pub, subj, id, 1)
				ids = append(ids, id)
			}
			publishAs(t, pub, queue.Subject("demo", "k"), "p-big", 1024+1)
			ids = append(ids, "p-big")
			slices.Sort(ids)
			want := len(ids)
			// max_backlog 5 is full (of poison, on the keyed lane's
			// intake) until the poison is dead-lettered: a publish refused
			// meanwhile is repeated, as a publisher would.
			for i := range 5 {
				id := fmt.Sprintf("good-%d", i)
				testenv.EventuallyNil(t, 10*time.Second, "publish "+id, func() error {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					m := nats.NewMsg(queue.Subject("demo", "k"))
					m.Header.Set(jetstream.MsgIDHeader, id)
					_, err := pub.js.PublishMsg(ctx, m)
					return err
				})
			}
			waitFor(t, 10*time.Second, "the good jobs delivered", func() bool { return len(rec.snapshot()) >= 5 })
			waitFor(t, 10*time.Second, "every poison job a dead letter", func() bool {
				return lanesOf(t, svc.Addr())[0].Dead == uint64(want)
			})
			for _, a := range rec.snapshot() {
				if !strings.HasPrefix(a.id, "good-") {
					t.Errorf("the target received poison job %q", a.id)
				}
			}
			if got := deadLettered(t, svc.Addr()); got != fmt.Sprint(want) {
				t.Errorf("throttler_jobs_dead_lettered_total = %q, want %d", got, want)
			}
			dead := deadList(t, svc.Addr())
			var got []string
			for _, d := range dead {
				got = append(got, d.ID)
				if d.Attempts != 1 || d.Reason == "" {
					t.Errorf("dead letter %s: attempts %d, reason %q", d.ID, d.Attempts, d.Reason)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, ids) {
				t.Fatalf("dead letters %v, want %v", got, ids)
			}
		})
	}
}
