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
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// switchTarget refuses every job (400: dead at once) until accept is set,
// then answers 201 with an echo; it counts each job id's deliveries.
type switchTarget struct {
	srv    *httptest.Server
	accept atomic.Bool
	mu     sync.Mutex
	seen   map[string]int
}

func newSwitchTarget(t *testing.T) *switchTarget {
	st := &switchTarget{seen: map[string]int{}}
	st.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		st.mu.Lock()
		st.seen[r.Header.Get("Idempotency-Key")]++
		st.mu.Unlock()
		if !st.accept.Load() {
			http.Error(w, "not now", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"echo":%q}`, b)
	}))
	t.Cleanup(st.srv.Close)
	return st
}

func (st *switchTarget) deliveries(id string) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.seen[id]
}

// replayEnv is what a replay test runs against: NATS, Redis, a target that
// refuses until told, and a callback receiver, which outlive the
// instances a test starts on them.
type replayEnv struct {
	natsURL, redisURL string
	target            *switchTarget
	recv              *callbackReceiver
}

func newReplayEnv(t *testing.T) *replayEnv {
	t.Helper()
	return &replayEnv{
		natsURL:  testenv.StartNATS(t).ClientURL(),
		redisURL: testenv.StartRedis(t).URL(),
		target:   newSwitchTarget(t),
		recv:     newCallbackReceiver(t),
	}
}

// start starts an instance (with a data directory of its own) whose lane
// demo keeps results, sends callbacks under the receiver's paths
// callbacks through the lane callbacks, and publishes records on the
// reply subjects under replies; the callbacks lane may call anything on
// the receiver.
func (e *replayEnv) start(t *testing.T, callbacks, replies []string) (*service.Service, func()) {
	t.Helper()
	quote := func(v []string) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	receiver := e.recv.srv.URL
	prefixes := make([]string, len(callbacks))
	for i, c := range callbacks {
		prefixes[i] = receiver + c
	}
	y := configHead(t, e.natsURL, e.redisURL) + fmt.Sprintf(`lanes:
  - name: demo
    rate: 50
    burst: 10
    retry: {max_attempts: 2, backoff_base: 20ms, backoff_max: 50ms}
    results: {keep: 1h, callback_urls: %s, callback_lane: callbacks, reply_subjects: %s}
    target: {http: {url: %q}}
  - name: callbacks
    rate: 20
    burst: 5
    retry: {max_attempts: 2, backoff_base: 20ms, backoff_max: 50ms}
    target: {http: {url: %q, job_urls: [%q], signing_secrets: [%q]}}
`, quote(prefixes), quote(replies), e.target.srv.URL, receiver+"/", receiver+"/", callbackSecret)
	cfg, err := config.Parse("replay.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return servicetest.Start(t, cfg, nil)
}

// TestReplayedDeadLettersAnswerAgain: jobs dead-lettered while the target
// refused them are replayed after it recovered, on an instance restarted
// with fewer callback URL prefixes and reply subjects. A replayed job's
// settled record goes again to its callback (a new Idempotency-Key,
// <lane>.<id>.callback-<seq> named by its dead letter, signed) and to its Throttle-Reply subject; its
// record is queued from the replay on, counts the replay and keeps the
// attempts before it. A callback or reply subject the lane no longer
// allows gets nothing: the callback is not sent, the NATS job is
// dead-lettered again unsent. A dead letter whose Throttle-Expires has
// passed is not replayed (409 naming expires; replay-all passes over it
// and counts it), and stays. The Idempotency-Key still finds the job.
func TestReplayedDeadLettersAnswerAgain(t *testing.T) {
	t.Parallel()
	env := newReplayEnv(t)
	target, recv := env.target, env.recv
	a, stopA := env.start(t, []string{"/hooks", "/old"}, []string{"replies.shop", "replies.old"})

	nc, publish := natsPublisher(t, env.natsURL)
	heard := &natsListener{}
	if _, err := nc.Subscribe("replies.>", heard.on); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if c := submitWithCallback(t, a.Addr(), "demo", "cb-1", recv.srv.URL+"/hooks/r1", "one"); c.code != http.StatusAccepted {
		t.Fatalf("submit cb-1: %d %q", c.code, c.body)
	}
	if c := submitWithCallback(t, a.Addr(), "demo", "cb-old", recv.srv.URL+"/old/c2", "two"); c.code != http.StatusAccepted {
		t.Fatalf("submit cb-old: %d %q", c.code, c.body)
	}
	expires := time.Now().Add(3 * time.Second).UTC().Truncate(time.Millisecond)
	req, _ := http.NewRequest("POST", "http://"+a.Addr()+"/v1/lanes/demo/jobs", strings.NewReader("late"))
	req.Header.Set("Idempotency-Key", "exp-1")
	req.Header.Set("Throttle-Expires", expires.Format(time.RFC3339Nano))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit exp-1: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}
	publish("throttle.demo", "nats-1", "three", nats.Header{"Throttle-Reply": {"replies.shop.n1"}})
	publish("throttle.demo", "nats-old", "four", nats.Header{"Throttle-Reply": {"replies.old.n2"}})

	ids := []string{"cb-1", "cb-old", "exp-1", "nats-1", "nats-old"}
	deadSeq := map[string]uint64{}
	testenv.Eventually(t, 20*time.Second, "five dead letters", func() bool {
		var dead api.DeadLetters
		keyCall(t, "GET", a.Addr(), "/v1/lanes/demo/dead", "", &dead)
		for _, d := range dead.Dead {
			deadSeq[d.ID] = d.Seq
			if d.ID == "exp-1" && (d.Expires == nil || !d.Expires.Equal(expires)) {
				t.Fatalf("exp-1's dead letter: expires %v, want %v", d.Expires, expires)
			}
		}
		return len(dead.Dead) == len(ids)
	})
	// Each dead record went to its callback and reply subject once.
	testenv.Eventually(t, 20*time.Second, "the dead records sent", func() bool {
		return len(recv.to("/hooks/r1")) == 1 && len(recv.to("/old/c2")) == 1 &&
			len(heard.of(t, "replies.shop.n1")) == 1 && len(heard.of(t, "replies.old.n2")) == 1
	})
	stopA()

	// The target recovers; the instance comes back with the /old and
	// replies.old prefixes removed.
	target.accept.Store(true)
	b, _ := env.start(t, []string{"/hooks"}, []string{"replies.shop"})
	addr := b.Addr()

	testenv.Eventually(t, 10*time.Second, "exp-1's expiry passed", func() bool { return time.Now().After(expires) })
	var p api.Problem
	c := callJob(t, "POST", fmt.Sprintf("http://%s/v1/lanes/demo/dead/%d/replay", addr, deadSeq["exp-1"]), "", "")
	if err := json.Unmarshal(c.body, &p); err != nil || c.code != http.StatusConflict || p.Field != "expires" ||
		p.Type != "urn:throttler:problem:job-expired" || c.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("replay of an expired dead letter: %d %q; want a 409 job-expired problem naming expires", c.code, c.body)
	}
	var all struct{ Replayed, Expired int }
	c = callJob(t, "POST", "http://"+addr+"/v1/lanes/demo/dead/replay", "", "")
	if err := json.Unmarshal(c.body, &all); err != nil || c.code != http.StatusOK || all.Replayed != 4 || all.Expired != 1 {
		t.Fatalf("replay all: %d %q; want 4 replayed, 1 expired", c.code, c.body)
	}

	// Delivered, and sent where the lane still allows.
	for _, id := range []string{"cb-1", "cb-old", "nats-1"} {
		testenv.Eventually(t, 20*time.Second, id+" delivered", func() bool {
			_, rec := getRecord(t, addr, "demo", id)
			return rec.State == api.StateDelivered
		})
		_, rec := getRecord(t, addr, "demo", id)
		if rec.Replays != 1 || len(rec.Attempts) != 2 || rec.Attempts[0].Status != http.StatusBadRequest || rec.Attempts[1].Status != http.StatusCreated {
			t.Errorf("%s's record after its replay: %+v; want replays 1, the refused attempt then the delivered one", id, rec)
		}
	}
	testenv.Eventually(t, 20*time.Second, "cb-1's second callback", func() bool { return len(recv.to("/hooks/r1")) == 2 })
	k := recv.to("/hooks/r1")[1]
	verifySigned(t, k)
	var rec api.JobRecord
	if err := json.Unmarshal(k.body, &rec); err != nil || rec.ID != "cb-1" || rec.State != api.StateDelivered || rec.Replays != 1 ||
		rec.Response == nil || rec.Response.Status != http.StatusCreated {
		t.Fatalf("cb-1's callback after its replay: %v %q", err, k.body)
	}
	if got, want := k.header.Get("Idempotency-Key"), fmt.Sprintf("demo.cb-1.callback-%d", deadSeq["cb-1"]); got != want {
		t.Errorf("the replay's callback: Idempotency-Key %q, want %s (the dead letter's sequence)", got, want)
	}
	testenv.Eventually(t, 10*time.Second, "nats-1's second reply", func() bool { return len(heard.of(t, "replies.shop.n1")) == 2 })
	if got := heard.of(t, "replies.shop.n1")[1]; got.ID != "nats-1" || got.State != api.StateDelivered || got.Replays != 1 || got.Reply != "replies.shop.n1" {
		t.Errorf("nats-1's reply after its replay: %+v", got)
	}

	// Refused now: nats-old is dead again, unsent; cb-old is delivered
	// without a callback. The callback lane is empty once cb-1's callback
	// came and no job waits in it: nothing more is on its way to /old.
	testenv.Eventually(t, 20*time.Second, "nats-old dead again", func() bool {
		_, rec := getRecord(t, addr, "demo", "nats-old")
		return rec.State == api.StateDead && rec.Reason == "reply subject refused"
	})
	testenv.Eventually(t, 20*time.Second, "the callback lane empty", func() bool {
		for _, l := range lanesOf(t, addr) {
			if l.Name == "callbacks" {
				return l.Backlog == 0
			}
		}
		return false
	})
	if n := len(recv.to("/old/c2")); n != 1 {
		t.Errorf("cb-old's callback was sent %d times; want once (before its prefix was removed)", n)
	}
	if n := len(heard.of(t, "replies.old.n2")); n != 1 {
		t.Errorf("nats-old's reply subject heard %d records; want 1 (before its prefix was removed)", n)
	}
	if n := target.deliveries("nats-old"); n != 1 {
		t.Errorf("nats-old reached the target %d times; want once (before its replay)", n)
	}

	// exp-1 stays dead, undelivered again; nats-old is back in the dead
	// letters.
	var dead api.DeadLetters
	keyCall(t, "GET", addr, "/v1/lanes/demo/dead", "", &dead)
	var left []string
	for _, d := range dead.Dead {
		left = append(left, d.ID)
	}
	if strings.Join(left, ",") != "exp-1,nats-old" {
		t.Errorf("dead letters after the replay: %v; want exp-1, nats-old", left)
	}
	if n := target.deliveries("exp-1"); n != 1 {
		t.Errorf("exp-1 reached the target %d times; want once", n)
	}
	// The Idempotency-Key still answers the job.
	if c := submitWithCallback(t, addr, "demo", "cb-1", recv.srv.URL+"/hooks/r1", "one"); c.code != http.StatusAccepted || !strings.Contains(string(c.body), `"duplicate":true`) {
		t.Errorf("resubmission of cb-1: %d %q; want a duplicate", c.code, c.body)
	}
}

// TestReplayCallbackIDsOutliveTheRecord: a job's record goes (results.keep;
// here purged) between two replays of the job from the dead letters, and
// once more while a replayed copy waits in its held lane. Each settlement
// still sends its callback under an id no earlier one used: the first
// delivery's <lane>.<id>.callback, then <lane>.<id>.callback-<seq> named by
// the sequence of the dead letter each replay came from, which never
// starts again as the record's replays count does. A receiver that drops
// a repeated Idempotency-Key (and the callback lane's stream, which does
// the same within its window) gets every one.
func TestReplayCallbackIDsOutliveTheRecord(t *testing.T) {
	t.Parallel()
	env := newReplayEnv(t)
	target, recv := env.target, env.recv
	svc, _ := env.start(t, []string{"/hooks"}, []string{"replies.shop"})
	addr := svc.Addr()
	const hook = "/hooks/x"

	_, js := testenv.JetStream(t, env.natsURL)
	purge := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, records.BucketName("demo"))
		if err == nil {
			err = kv.Purge(ctx, records.Key("cb-x"))
		}
		if err != nil {
			t.Fatalf("purging cb-x's record: %v", err)
		}
		if code, _ := getRecord(t, addr, "demo", "cb-x"); code != http.StatusNotFound {
			t.Fatalf("cb-x's record after its purge: %d, want 404", code)
		}
	}
	deadSeq := func() uint64 {
		t.Helper()
		var seq uint64
		testenv.Eventually(t, 20*time.Second, "cb-x dead", func() bool {
			var dead api.DeadLetters
			keyCall(t, "GET", addr, "/v1/lanes/demo/dead", "", &dead)
			for _, d := range dead.Dead {
				if d.ID == "cb-x" {
					seq = d.Seq
					return true
				}
			}
			return false
		})
		return seq
	}
	replay := func(seq uint64) {
		t.Helper()
		if c := callJob(t, "POST", fmt.Sprintf("http://%s/v1/lanes/demo/dead/%d/replay", addr, seq), "", ""); c.code != http.StatusOK {
			t.Fatalf("replay of #%d: %d %q", seq, c.code, c.body)
		}
	}
	callbacks := func(n int) []string {
		t.Helper()
		testenv.Eventually(t, 15*time.Second, fmt.Sprintf("callback %d", n), func() bool { return len(recv.to(hook)) >= n })
		var keys []string
		for _, k := range recv.to(hook) {
			keys = append(keys, k.header.Get("Idempotency-Key"))
		}
		return keys
	}

	// Dead at once (the target refuses): the first callback.
	if c := submitWithCallback(t, addr, "demo", "cb-x", recv.srv.URL+hook, "x"); c.code != http.StatusAccepted {
		t.Fatalf("submit: %d %q", c.code, c.body)
	}
	s1 := deadSeq()
	want := []string{"demo.cb-x.callback"}
	callbacks(1)
	// Replayed, dead again: the replay's callback.
	replay(s1)
	s2 := deadSeq()
	want = append(want, fmt.Sprintf("demo.cb-x.callback-%d", s1))
	callbacks(2)
	// The record goes; replayed again, dead again: its replays count
	// starts again, its callback's id does not.
	purge()
	replay(s2)
	s3 := deadSeq()
	want = append(want, fmt.Sprintf("demo.cb-x.callback-%d", s2))
	callbacks(3)
	// Replayed into a held lane, whose record goes before its claim
	// (which makes the record again): delivered.
	if code := keyCall(t, "PATCH", addr, "/v1/lanes/demo", `{"paused":true}`, nil); code != http.StatusOK {
		t.Fatalf("pause: %d", code)
	}
	replay(s3)
	purge()
	target.accept.Store(true)
	if code := keyCall(t, "PATCH", addr, "/v1/lanes/demo", `{"paused":false}`, nil); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	want = append(want, fmt.Sprintf("demo.cb-x.callback-%d", s3))
	got := callbacks(4)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("callback ids:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var rec api.JobRecord
	if err := json.Unmarshal(recv.to(hook)[3].body, &rec); err != nil || rec.State != api.StateDelivered || rec.ReplayedFrom != s3 {
		t.Fatalf("the last callback's record: %v %q; want delivered, replayed from #%d", err, recv.to(hook)[3].body, s3)
	}
}
