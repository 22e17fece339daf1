package dispatch

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/tracectx"
)

// TestDeliveriesCarryTraceContext: every kind of target receives the job's
// trace context in the W3C headers (lower case on NATS, as W3C spells
// them), and a job without one sends none, whatever the static headers.
func TestDeliveriesCarryTraceContext(t *testing.T) {
	tc := tracectx.Context{Parent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", State: "rojo=1", Baggage: "user=alice"}
	check := func(t *testing.T, get func(string) string, want tracectx.Context) {
		t.Helper()
		for _, c := range []struct{ name, want string }{
			{tracectx.HeaderTraceparent, want.Parent}, {tracectx.HeaderTracestate, want.State}, {tracectx.HeaderBaggage, want.Baggage},
		} {
			if got := get(c.name); got != c.want {
				t.Errorf("%s = %q, want %q", c.name, got, c.want)
			}
		}
	}

	t.Run("http", func(t *testing.T) {
		got := make(chan http.Header, 2)
		srv := serve(t, func(_ http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() })
		h := newHTTP(t, HTTPConfig{URL: srv.URL, Headers: map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}}, nil)
		job := testJob()
		job.Trace = tc
		if res := h.Deliver(context.Background(), job); res.Verdict != Done {
			t.Fatalf("Deliver: %v %v", res.Verdict, res.Err)
		}
		check(t, (<-got).Get, tc)
	})

	t.Run("nats request", func(t *testing.T) {
		nc := connect(t)
		pool := startWorkers(t, nc, "work.trace", 1)
		n := newNATS(t, nc, NATSConfig{Subject: "work.trace", Timeout: 2 * time.Second})
		job := testJob()
		job.Payload, job.Trace = []byte("done"), tc
		if res := n.Deliver(context.Background(), job); res.Verdict != Done {
			t.Fatalf("Deliver: %v %v", res.Verdict, res.Err)
		}
		job.ID, job.Trace = "no-trace", tracectx.Context{}
		if res := n.Deliver(context.Background(), job); res.Verdict != Done {
			t.Fatalf("Deliver: %v %v", res.Verdict, res.Err)
		}
		pool.mu.Lock()
		with, without := pool.headers[0], pool.headers[1]
		pool.mu.Unlock()
		check(t, with.Get, tc) // exact, case-sensitive lookup: lower case
		check(t, without.Get, tracectx.Context{})
	})

	t.Run("pull hand-out", func(t *testing.T) {
		nc := connect(t)
		p, err := OpenPull(nc, PullConfig{Subject: "work.pull", Lease: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		jobs, err := nc.SubscribeSync(nats.NewInbox())
		if err != nil {
			t.Fatal(err)
		}
		ask := nats.NewMsg("work.pull")
		ask.Reply = jobs.Subject
		ask.Header.Set(api.HeaderExpires, "5000")
		if err := nc.PublishMsg(ask); err != nil {
			t.Fatal(err)
		}
		done := make(chan Result, 1)
		job := testJob()
		job.Trace = tc
		go func() { done <- p.Deliver(context.Background(), job) }()
		m, err := jobs.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no job handed out: %v", err)
		}
		check(t, m.Header.Get, tc)
		report := nats.NewMsg(m.Reply)
		report.Header.Set(api.HeaderStatus, api.StatusDone)
		if err := nc.PublishMsg(report); err != nil {
			t.Fatal(err)
		}
		if res := <-done; res.Verdict != Done {
			t.Fatalf("Deliver: %v %v", res.Verdict, res.Err)
		}
	})
}
