package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// replyTarget answers 400 to a job whose body is "reject", 201 with an
// echo otherwise, and counts the deliveries of each job id.
func replyTarget(t *testing.T) (*httptest.Server, func(id string) int) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		if string(b) == "reject" {
			http.Error(w, "no", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"echo":%q}`, b)
	}))
	t.Cleanup(srv.Close)
	return srv, func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return seen[id]
	}
}

// natsListener collects the records the throttler publishes anywhere: one
// subscription to ">" on the publisher's server, keeping the messages
// that carry a record's Throttle-Job-Id header.
type natsListener struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (l *natsListener) on(m *nats.Msg) {
	if m.Header.Get(records.HeaderJobID) == "" {
		return
	}
	l.mu.Lock()
	l.msgs = append(l.msgs, m)
	l.mu.Unlock()
}

// of returns the records heard on subject.
func (l *natsListener) of(t *testing.T, subject string) []api.JobRecord {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []api.JobRecord
	for _, m := range l.msgs {
		if m.Subject != subject {
			continue
		}
		rec, err := records.Decode(m.Data)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		out = append(out, rec)
	}
	return out
}

// subjects lists every subject a record was heard on.
func (l *natsListener) subjects() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, m := range l.msgs {
		out = append(out, m.Subject)
	}
	return out
}

// TestNATSJobsGetTheirRecord: jobs published with nats.go on a lane's
// public subject, drained by a fleet of two instances. A job naming a
// Throttle-Reply under the lane's results.reply_subjects gets its settled
// record there (delivered, dead, expired, cancelled), whichever instance
// settled it; every settled record is also on throttler.results.<lane>.<id
// token>. A job naming a subject the lane refuses (the throttler's, the
// server's, a wildcard, an empty token, outside the prefixes, too long,
// twice) is dead-lettered undelivered, and nothing is published there. An
// HTTP submission with Throttle-Reply is a 400 naming the header.
func TestNATSJobsGetTheirRecord(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, deliveries := replyTarget(t)
	y := configHead(t, natsSrv.ClientURL(), redis.URL()) + fmt.Sprintf(`lanes:
  - name: demo
    rate: 40
    burst: 2
    max_inflight: 4
    retry: {max_attempts: 2, backoff_base: 20ms, backoff_max: 50ms}
    results: {keep: 1h, reply_subjects: [replies.shop, acme]}
    target: {http: {url: %q}}
`, target.URL)
	cfg, err := config.Parse("replies.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := runWithRegistry(t, cfg, regA)
	cfg.NATS.DataDir = t.TempDir()
	b := runWithRegistry(t, cfg, regB)

	// The publisher listens before it publishes.
	nc, err := nats.Connect(natsSrv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	heard := &natsListener{}
	if _, err := nc.Subscribe(">", heard.on); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	publish := func(id, body string, h nats.Header) {
		t.Helper()
		m := nats.NewMsg("throttle.demo")
		m.Data, m.Header = []byte(body), h
		m.Header.Set("Nats-Msg-Id", id)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	// Delivered, by either instance.
	const n = 24
	for i := range n {
		publish(fmt.Sprintf("n-%02d", i), fmt.Sprintf("p%02d", i), nats.Header{"Throttle-Reply": {fmt.Sprintf("replies.shop.%02d", i)}})
	}
	// An id that is not a subject token; a reply in another spelling,
	// exactly a listed prefix.
	publish("order.7*>", "dotted", nats.Header{"throttle-reply": {"acme"}})
	// Dead: the target refuses it.
	publish("rejected", "reject", nats.Header{"Throttle-Reply": {"replies.shop.rejected"}})
	// Expired: it expires while its delay holds it.
	publish("late", "late", nats.Header{"Throttle-Reply": {"replies.shop.late"}, "Throttle-Delay": {"2s"},
		"Throttle-Expires": {time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)}})
	// Cancelled: delayed, then cancelled over HTTP on the other instance.
	publish("cancelled", "cancelled", nats.Header{"Throttle-Reply": {"replies.shop.cancelled"}, "Throttle-Delay": {"1h"}})

	// Refused reply subjects: never delivered, dead-lettered, nothing
	// published on them.
	refusedSubjects := []string{
		"throttle.demo", "throttler.results.demo.x", "throttler.control.demo", "throttle_retry.demo", "throttle_dead.demo",
		"_INBOX_throttler.x", "$JS.API.STREAM.LIST", "$KV.THROTTLER_LIMITS.x", "$SYS.REQ.SERVER.PING",
		"replies.shop.*", "replies.shop.>", "replies..shop", "replies.shop.", "replies.shop.$x", "replies.shop.a b",
		"replies.shopping", "other.x", "acme2", "replies.shop." + strings.Repeat("x", 260),
	}
	for i, s := range refusedSubjects {
		publish(fmt.Sprintf("bad-%02d", i), "bad", nats.Header{"Throttle-Reply": {s}})
	}
	publish("twice", "bad", nats.Header{"Throttle-Reply": {"replies.shop.a", "replies.shop.b"}})

	// Cancel the delayed job on b once its record exists.
	testenv.Eventually(t, 10*time.Second, "the delayed job's record", func() bool {
		code, rec := getRecord(t, b.Addr(), "demo", "cancelled")
		return code == http.StatusOK && rec.State == api.StateScheduled
	})
	if c := callJob(t, "DELETE", "http://"+b.Addr()+"/v1/lanes/demo/jobs/cancelled", "", ""); c.code != http.StatusOK {
		t.Fatalf("cancel: %d %s", c.code, c.body)
	}

	resultOf := func(id string) []api.JobRecord { return heard.of(t, records.ResultsSubject("demo", id)) }
	testenv.EventuallyNil(t, 30*time.Second, "a result for every job", func() error {
		ids := []string{"order.7*>", "rejected", "late", "cancelled", "twice"}
		for i := range n {
			ids = append(ids, fmt.Sprintf("n-%02d", i))
		}
		for i := range refusedSubjects {
			ids = append(ids, fmt.Sprintf("bad-%02d", i))
		}
		var missing []string
		for _, id := range ids {
			if len(resultOf(id)) == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no result for %q", missing)
		}
		return nil
	})

	// The reply of each job, on its own subject, the same as its result.
	for i := range n {
		id, subject := fmt.Sprintf("n-%02d", i), fmt.Sprintf("replies.shop.%02d", i)
		got := heard.of(t, subject)
		if len(got) != 1 || got[0].ID != id || got[0].State != api.StateDelivered || got[0].Reply != subject ||
			got[0].Response == nil || got[0].Response.Status != 201 || got[0].Response.Body != fmt.Sprintf(`{"echo":"p%02d"}`, i) {
			t.Fatalf("reply on %s: %+v; want %s delivered with the target's answer, once", subject, got, id)
		}
	}
	for subject, want := range map[string]struct {
		id    string
		state api.JobState
	}{
		"acme":                   {"order.7*>", api.StateDelivered},
		"replies.shop.rejected":  {"rejected", api.StateDead},
		"replies.shop.late":      {"late", api.StateExpired},
		"replies.shop.cancelled": {"cancelled", api.StateCancelled},
	} {
		got := heard.of(t, subject)
		if len(got) != 1 || got[0].ID != want.id || got[0].State != want.state {
			t.Errorf("reply on %s: %+v; want %s %s once", subject, got, want.id, want.state)
		}
	}
	if s := records.ResultsSubject("demo", "order.7*>"); !strings.HasPrefix(s, "throttler.results.demo.~") || strings.Count(s, ".") != 3 {
		t.Errorf("results subject of an id with '.', '*' and '>': %q", s)
	}

	// Refused: dead, undelivered, no attempt, and no record anywhere but
	// its results subject. The results were heard after any reply would
	// have been (the store publishes the reply first, on one connection).
	for i, s := range append(refusedSubjects, "replies.shop.a") {
		id := fmt.Sprintf("bad-%02d", i)
		if i == len(refusedSubjects) {
			id = "twice"
		}
		if deliveries(id) != 0 {
			t.Errorf("%s (reply %q) was delivered", id, s)
		}
		got := resultOf(id)
		if len(got) != 1 || got[0].State != api.StateDead || got[0].Reason != "reply subject refused" || len(got[0].Attempts) != 0 || got[0].Reply != "" {
			t.Errorf("%s (reply %q): result %+v; want dead, reply subject refused, no attempt, no reply", id, s, got)
		}
	}
	for _, s := range heard.subjects() {
		if !strings.HasPrefix(s, "throttler.results.demo.") && !strings.HasPrefix(s, "replies.shop.") && s != "acme" {
			t.Errorf("a record was published on %s", s)
		}
		if s == "replies.shop.a" || s == "replies.shop.b" {
			t.Errorf("a record was published on %s, named by a job that sent Throttle-Reply twice", s)
		}
	}
	var dead api.DeadLetters
	resp := callJob(t, "GET", "http://"+a.Addr()+"/v1/lanes/demo/dead", "", "")
	if err := json.Unmarshal(resp.body, &dead); err != nil {
		t.Fatalf("dead letters %s: %v", resp.body, err)
	}
	refusedDead := 0
	for _, d := range dead.Dead {
		if d.Reason == "reply subject refused" {
			refusedDead++
		}
		if d.ID == "twice" && !strings.Contains(d.LastError, "Throttle-Reply was sent twice") {
			t.Errorf("dead letter of a job that sent Throttle-Reply twice: last_error %q", d.LastError)
		}
	}
	if refusedDead != len(refusedSubjects)+1 {
		t.Errorf("%d dead letters with reason 'reply subject refused', want %d", refusedDead, len(refusedSubjects)+1)
	}

	// The record keeps the reply subject; GET answers on either instance.
	for _, addr := range []string{a.Addr(), b.Addr()} {
		if code, rec := getRecord(t, addr, "demo", "n-03"); code != http.StatusOK || rec.Reply != "replies.shop.03" || rec.State != api.StateDelivered {
			t.Errorf("GET n-03 on %s: %d %+v", addr, code, rec)
		}
	}

	// Both instances settled some of the jobs the publisher sent to NATS.
	delivered := func(reg *prometheus.Registry) float64 {
		v, _ := servicetest.Gather(t, reg).Sum("throttler_dispatches_total")
		return v
	}
	if da, db := delivered(regA), delivered(regB); da == 0 || db == 0 {
		t.Errorf("a delivered %v, b %v: both instances should have settled some jobs", da, db)
	}

	// Over HTTP the header is refused, naming it; nothing is stored.
	req, _ := http.NewRequest("POST", "http://"+a.Addr()+"/v1/lanes/demo/jobs", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "http-reply")
	req.Header.Set("Throttle-Reply", "replies.shop.http")
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Field string `json:"field"`
	}
	_ = json.NewDecoder(hr.Body).Decode(&p)
	hr.Body.Close()
	if hr.StatusCode != http.StatusBadRequest || p.Field != "Throttle-Reply" || hr.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("HTTP Throttle-Reply: %d %s field %q; want 400 problem naming Throttle-Reply", hr.StatusCode, hr.Header.Get("Content-Type"), p.Field)
	}
	if code, _ := getRecord(t, a.Addr(), "demo", "http-reply"); code != http.StatusNotFound {
		t.Errorf("refused HTTP job has a record: %d", code)
	}
}

// TestReplyNeverInAWorkersInbox: on a server with a pull-mode worker user,
// a lane that lists _INBOX in results.reply_subjects answers a publisher's
// inbox and never a worker's: a job naming _INBOX.<worker>.… is
// dead-lettered undelivered, and nothing reaches the worker's inbox.
func TestReplyNeverInAWorkersInbox(t *testing.T) {
	t.Parallel()
	throttlerURL, _ := natsWithUsers(t)
	redis := testenv.StartRedis(t)
	target, deliveries := replyTarget(t)
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, data_dir: %q, workers: [{user: render-1, lanes: [renders]}]}
redis: {url: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    rate: 40
    burst: 2
    results: {keep: 1h, reply_subjects: [_INBOX]}
    target: {http: {url: %q}}
  - name: renders
    rate: 1
    burst: 1
    target: {nats: {subject: renders.work, mode: pull}}
`, throttlerURL, t.TempDir(), redis.URL(), target.URL)
	cfg, err := config.Parse("replies.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	runWithRegistry(t, cfg, prometheus.NewRegistry())

	nc, err := nats.Connect(throttlerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	heard := &natsListener{}
	if _, err := nc.Subscribe("_INBOX.>", heard.on); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe("throttler.results.demo.>", heard.on); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for id, reply := range map[string]string{"worker": "_INBOX.render-1.x", "worker-root": "_INBOX.render-1", "mine": "_INBOX.shop.r1"} {
		m := nats.NewMsg("throttle.demo")
		m.Data, m.Header = []byte(id), nats.Header{"Throttle-Reply": {reply}, "Nats-Msg-Id": {id}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// The reply is waited for too: it is published before the result, but
	// each subscription's handler runs on a goroutine of its own, so the
	// result's may run first.
	testenv.Eventually(t, 20*time.Second, "the three results and the allowed reply", func() bool {
		return len(heard.of(t, api.ResultsSubject("demo", "worker"))) == 1 && len(heard.of(t, api.ResultsSubject("demo", "worker-root"))) == 1 &&
			len(heard.of(t, api.ResultsSubject("demo", "mine"))) == 1 && len(heard.of(t, "_INBOX.shop.r1")) >= 1
	})
	if got := heard.of(t, "_INBOX.shop.r1"); len(got) != 1 || got[0].State != api.StateDelivered {
		t.Errorf("reply in a publisher's inbox: %+v", got)
	}
	for _, id := range []string{"worker", "worker-root"} {
		got := heard.of(t, api.ResultsSubject("demo", id))
		if deliveries(id) != 0 || got[0].State != api.StateDead || got[0].Reason != "reply subject refused" {
			t.Errorf("%s: delivered %d times, result %+v; want dead undelivered", id, deliveries(id), got)
		}
	}
	for _, s := range heard.subjects() {
		if strings.HasPrefix(s, "_INBOX.render-1") {
			t.Errorf("a record was published in the worker's inbox: %s", s)
		}
	}
}
