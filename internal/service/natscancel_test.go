package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/testenv"
)

// natsCancelConfig: a plain lane and a keyed lane with results, their
// settled records allowed on replies.shop.
func natsCancelConfig(t *testing.T, natsURL, redisURL, target, rate string) config.Config {
	t.Helper()
	y := configHead(t, natsURL, redisURL) + fmt.Sprintf(`lanes:
  - name: demo
    rate: %s
    burst: 20
    max_inflight: 8
    results: {keep: 1h, reply_subjects: [replies.shop]}
    target: {http: {url: %q}}
  - name: keyed
    rate: %s
    burst: 20
    per_key: {rate: %s, burst: 20}
    results: {keep: 1h, reply_subjects: [replies.shop]}
    target: {http: {url: %q}}
`, rate, target, rate, rate, target)
	cfg, err := config.Parse("natscancel.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// natsPublisher publishes jobs as an outside NATS publisher does.
func natsPublisher(t *testing.T, url string) (*nats.Conn, func(subject, msgID, body string, h nats.Header) uint64) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	return nc, func(subject, msgID, body string, h nats.Header) uint64 {
		t.Helper()
		m := nats.NewMsg(subject)
		m.Data = []byte(body)
		for k, v := range h {
			m.Header[k] = v
		}
		if msgID != "" {
			m.Header.Set("Nats-Msg-Id", msgID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
}

// TestCancelNATSJobsBeforeTheyStart: jobs published on a held lane's public
// subject (a plain lane, and a keyed lane before and after the intake moved
// them onto their keys) have no record, yet GET answers them queued and
// DELETE cancels them, by Nats-Msg-Id or by "<lane>-<seq>": 200 cancelled,
// at once on the job's reply subject. Resumed, the lanes never deliver
// them and deliver the rest; their records stay cancelled. An id nobody
// published answers 404 naming id, to GET and DELETE, and leaves nothing
// behind: published later, that job is delivered.
func TestCancelNATSJobsBeforeTheyStart(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, deliveries := replyTarget(t)
	svc := runWithRegistry(t, natsCancelConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL, "50"), prometheus.NewRegistry())
	addr := svc.Addr()
	for _, lane := range []string{"demo", "keyed"} {
		if code := keyCall(t, "PATCH", addr, "/v1/lanes/"+lane, `{"paused":true}`, nil); code != http.StatusOK {
			t.Fatalf("pause %s: %d", lane, code)
		}
	}
	nc, publish := natsPublisher(t, natsSrv.ClientURL())
	heard := &natsListener{}
	if _, err := nc.Subscribe("replies.shop.>", heard.on); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	type job struct{ lane, id string }
	var cancels, keeps []job
	for _, lane := range []string{"demo", "keyed"} {
		subject := "throttle." + lane
		if lane == "keyed" {
			subject += ".k1"
		}
		publish(subject, lane+"-c1", "c1", nats.Header{"Throttle-Reply": {"replies.shop." + lane + "-c1"}})
		seq := publish(subject, "", "c2", nil)
		publish(subject, lane+"-keep", "keep", nil)
		cancels = append(cancels, job{lane, lane + "-c1"}, job{lane, lane + "-" + strconv.FormatUint(seq, 10)})
		keeps = append(keeps, job{lane, lane + "-keep"})
	}
	// A keyed lane's public jobs are moved onto their keys while the lane
	// is held: one is cancelled before its move can have happened (above,
	// in the intake stream, or moved: either is found), the witness after.
	for _, j := range append(append([]job{}, cancels...), keeps...) {
		if code, rec := getRecord(t, addr, j.lane, j.id); code != http.StatusOK || rec.State != api.StateQueued || rec.ID != j.id {
			t.Fatalf("GET %s/%s before the cancel: %d %+v; want queued", j.lane, j.id, code, rec)
		}
	}
	for _, j := range cancels {
		c := callJob(t, "DELETE", "http://"+addr+"/v1/lanes/"+j.lane+"/jobs/"+j.id, "", "")
		var rec api.JobRecord
		if err := json.Unmarshal(c.body, &rec); err != nil || c.code != http.StatusOK || rec.State != api.StateCancelled || rec.ID != j.id {
			t.Fatalf("DELETE %s/%s: %d %q; want 200 cancelled", j.lane, j.id, c.code, c.body)
		}
		// Again: the same record.
		if c := callJob(t, "DELETE", "http://"+addr+"/v1/lanes/"+j.lane+"/jobs/"+j.id, "", ""); c.code != http.StatusOK {
			t.Fatalf("DELETE %s/%s again: %d %q", j.lane, j.id, c.code, c.body)
		}
	}
	for _, lane := range []string{"demo", "keyed"} {
		for _, method := range []string{"GET", "DELETE"} {
			c := callJob(t, method, "http://"+addr+"/v1/lanes/"+lane+"/jobs/never-published", "", "")
			var p api.Problem
			_ = json.Unmarshal(c.body, &p)
			if c.code != http.StatusNotFound || p.Field != "id" || c.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%s of an unknown id on %s: %d %q; want a 404 problem naming id", method, lane, c.code, c.body)
			}
		}
	}
	testenv.Eventually(t, 10*time.Second, "the cancels on their reply subjects", func() bool {
		return len(heard.of(t, "replies.shop.demo-c1")) > 0 && len(heard.of(t, "replies.shop.keyed-c1")) > 0
	})
	for _, s := range []string{"replies.shop.demo-c1", "replies.shop.keyed-c1"} {
		if got := heard.of(t, s)[0]; got.State != api.StateCancelled {
			t.Fatalf("reply on %s: %+v; want cancelled", s, got)
		}
	}

	// Resumed: the witnesses, published after the cancelled jobs, are
	// delivered; the drain met the cancelled ones first (FIFO per lane
	// and key) and delivered none of them.
	for _, lane := range []string{"demo", "keyed"} {
		if code := keyCall(t, "PATCH", addr, "/v1/lanes/"+lane, `{"paused":false}`, nil); code != http.StatusOK {
			t.Fatalf("resume %s: %d", lane, code)
		}
	}
	for _, j := range keeps {
		testenv.Eventually(t, 20*time.Second, j.id+" delivered", func() bool {
			_, rec := getRecord(t, addr, j.lane, j.id)
			return rec.State == api.StateDelivered
		})
	}
	for _, j := range cancels {
		if n := deliveries(j.id); n != 0 {
			t.Errorf("%s/%s was cancelled and delivered %d times", j.lane, j.id, n)
		}
		if code, rec := getRecord(t, addr, j.lane, j.id); code != http.StatusOK || rec.State != api.StateCancelled || len(rec.Attempts) != 0 {
			t.Errorf("%s/%s after the drain met it: %d %+v; want cancelled, no attempt", j.lane, j.id, code, rec)
		}
	}
	for _, j := range keeps {
		if n := deliveries(j.id); n != 1 {
			t.Errorf("%s/%s delivered %d times, want once", j.lane, j.id, n)
		}
		// Settled: too late to cancel.
		if c := callJob(t, "DELETE", "http://"+addr+"/v1/lanes/"+j.lane+"/jobs/"+j.id, "", ""); c.code != http.StatusConflict {
			t.Errorf("DELETE of delivered %s/%s: %d %q; want 409", j.lane, j.id, c.code, c.body)
		}
	}
	for _, lane := range []string{"demo", "keyed"} {
		if code, _ := getRecord(t, addr, lane, "never-published"); code != http.StatusNotFound {
			t.Errorf("an unknown id has a record on %s after its cancel: %d", lane, code)
		}
	}
	// Nobody cancels a job before it is published: the id refused above
	// is delivered once it is.
	publish("throttle.demo", "never-published", "late", nil)
	testenv.Eventually(t, 20*time.Second, "never-published delivered", func() bool {
		_, rec := getRecord(t, addr, "demo", "never-published")
		return rec.State == api.StateDelivered
	})
	if n := deliveries("never-published"); n != 1 {
		t.Errorf("never-published delivered %d times, want once", n)
	}
}

// TestCancelRacesStartForNATSJobs: jobs published over NATS are cancelled
// as they are published, on a lane that starts them at once: every job is
// either cancelled (200) and never reaches the target, or refused (409)
// and delivered once; never both, and never 404.
func TestCancelRacesStartForNATSJobs(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, deliveries := replyTarget(t)
	svc := runWithRegistry(t, natsCancelConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL, "200"), prometheus.NewRegistry())
	_, publish := natsPublisher(t, natsSrv.ClientURL())
	const n = 120
	cancelled := make([]bool, n)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := w; i < n; i += 6 {
				id := fmt.Sprintf("race-%03d", i)
				publish("throttle.demo", id, "x", nil)
				d := callJob(t, "DELETE", "http://"+svc.Addr()+"/v1/lanes/demo/jobs/"+id, "", "")
				switch d.code {
				case http.StatusOK:
					cancelled[i] = true
				case http.StatusConflict:
				default:
					t.Errorf("cancel %s: %d %q", id, d.code, d.body)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	publish("throttle.demo", "witness", "x", nil)
	testenv.Eventually(t, 20*time.Second, "the witness delivered", func() bool {
		_, rec := getRecord(t, svc.Addr(), "demo", "witness")
		return rec.State == api.StateDelivered
	})
	nCancelled := 0
	for i := range n {
		id := fmt.Sprintf("race-%03d", i)
		_, rec := getRecord(t, svc.Addr(), "demo", id)
		switch {
		case cancelled[i]:
			nCancelled++
			if deliveries(id) != 0 || rec.State != api.StateCancelled {
				t.Errorf("%s was cancelled, delivered %d times, record %s", id, deliveries(id), rec.State)
			}
		default:
			testenv.Eventually(t, 20*time.Second, id+" delivered", func() bool {
				_, r := getRecord(t, svc.Addr(), "demo", id)
				return r.State == api.StateDelivered
			})
			if deliveries(id) != 1 {
				t.Errorf("%s was refused a cancel and delivered %d times; want once", id, deliveries(id))
			}
		}
	}
	t.Logf("%d NATS jobs: %d cancelled before their start, %d started first", n, nCancelled, n-nCancelled)
}
