package service_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// ownerHead is the head of the owner tests' configs, up to their lanes:
// the nats-server at natsURL (its dedup_window when not empty) and the
// Redis at redisURL; keys a and b (secrets secret-a, secret-b) may submit
// to demo, ops (secret-ops) is admin.
func ownerHead(t *testing.T, natsURL, dedupWindow, redisURL string) string {
	window := ""
	if dedupWindow != "" {
		window = ", dedup_window: " + dedupWindow
	}
	return fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, data_dir: %q%s}
redis: {url: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
auth:
  keys:
    - {id: a, sha256: %s, scopes: ["submit:demo"]}
    - {id: b, sha256: %s, scopes: ["submit:demo"]}
    - {id: ops, sha256: %s, scopes: [admin]}
`, natsURL, t.TempDir(), window, redisURL, hexSum("secret-a"), hexSum("secret-b"), hexSum("secret-ops"))
}

// ownerConfig: ownerHead's keys; demo keeps results and allows replies on
// replies.shop.
func ownerConfig(t *testing.T, natsURL, redisURL, target string) config.Config {
	t.Helper()
	y := ownerHead(t, natsURL, "", redisURL) + fmt.Sprintf(`lanes:
  - name: demo
    rate: 50
    burst: 5
    max_inflight: 8
    results: {keep: 1h, max_body: 64, max_wait: 20s, reply_subjects: [replies.shop]}
    target: {http: {url: %q}}
`, target)
	cfg, err := config.Parse("owner.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startOwnerService runs ownerConfig's service, with a nats-server and a
// Redis of its own, sending lane demo's jobs to targetURL. It returns the
// nats-server's URL and lane demo's URL.
func startOwnerService(t *testing.T, targetURL string) (natsURL, lane string) {
	t.Helper()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	svc := runWithRegistry(t, ownerConfig(t, natsSrv.ClientURL(), redis.URL(), targetURL), prometheus.NewRegistry())
	return natsSrv.ClientURL(), "http://" + svc.Addr() + "/v1/lanes/demo"
}

// TestJobRecordsBelongToTheirKey: with API keys, a job's record is its
// submitting key's. Another key cannot read, wait for or cancel it (404,
// the body of an id never stored), lists only its own jobs, and gets 409
// naming Idempotency-Key (learning nothing of the job) when it resubmits
// the id, single, waited, delayed or in a batch; the owner's resubmission
// is its duplicate. A job stored without a record (no Idempotency-Key) is
// its key's after the drain's claim too. A job published over NATS has no
// owner, whatever header it carries: only admin keys see it, and its
// record carries its reply subject while it waits. The admin key sees
// every job.
func TestJobRecordsBelongToTheirKey(t *testing.T) {
	t.Parallel()
	target, _ := recordsTarget(t)
	natsURL, lane := startOwnerService(t, target.URL)
	base := lane + "/jobs"
	const a, b, ops = "secret-a", "secret-b", "secret-ops"
	if c := asKey(t, ops, "PATCH", lane, `{"paused":true}`, "Content-Type", "application/json"); c.code != http.StatusOK {
		t.Fatalf("pause: %d %s", c.code, c.body)
	}

	// While the lane is held: a's jobs (two with an Idempotency-Key, one
	// without, which is stored without a record), b's, and one published
	// over NATS with a forged owner header.
	for _, s := range []struct{ key, id string }{{a, "order-1"}, {a, "order-2"}, {b, "b-1"}} {
		if c := asKey(t, s.key, "POST", base, "body of "+s.id, "Idempotency-Key", s.id); c.code != http.StatusAccepted {
			t.Fatalf("submit %s: %d %s", s.id, c.code, c.body)
		}
	}
	c := asKey(t, a, "POST", base, "a-seq")
	var acc api.Accepted
	if err := json.Unmarshal(c.body, &acc); err != nil || c.code != http.StatusAccepted {
		t.Fatalf("submit without Idempotency-Key: %d %s", c.code, c.body)
	}
	seqID := acc.ID
	_, publish := natsPublisher(t, natsURL)
	publish("throttle.demo", "nats-1", "from nats", nats.Header{"Throttler-Owner": {"a"}, "Throttle-Reply": {"replies.shop.nats-1"}})

	get := func(secret, id string) (jobCall, api.JobRecord) {
		t.Helper()
		c := asKey(t, secret, "GET", base+"/"+id, "")
		var rec api.JobRecord
		if c.code == http.StatusOK {
			if err := json.Unmarshal(c.body, &rec); err != nil {
				t.Fatalf("GET %s: %q: %v", id, c.body, err)
			}
			// One key's view, perhaps with its target's answer: no
			// shared cache may keep it.
			if cc := c.header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("GET %s: Cache-Control %q, want no-store", id, cc)
			}
		}
		return c, rec
	}
	// notFound: what secret is answered for id is what it is answered for
	// an id never stored, byte for byte but the id.
	notFound := func(secret, method, id, query string) {
		t.Helper()
		got := asKey(t, secret, method, base+"/"+id+query, "")
		unknown := "zz-" + strings.Repeat("9", max(len(id)-3, 1))
		want := asKey(t, secret, method, base+"/"+unknown+query, "")
		if want.code != http.StatusNotFound {
			t.Fatalf("%s of an unknown id: %d %s", method, want.code, want.body)
		}
		if got.code != http.StatusNotFound || string(got.body) != strings.ReplaceAll(string(want.body), unknown, id) ||
			got.header.Get("Content-Type") != want.header.Get("Content-Type") || got.header.Get("Location") != "" {
			t.Errorf("%s %s%s: %d %s; want the 404 of an id never stored: %s", method, id, query, got.code, got.body, want.body)
		}
	}
	for _, id := range []string{"order-1", seqID} {
		notFound(b, "GET", id, "")
		notFound(b, "GET", id, "?wait=1s")
		notFound(b, "DELETE", id, "")
	}
	for _, secret := range []string{a, b} {
		notFound(secret, "GET", "nats-1", "")
		notFound(secret, "DELETE", "nats-1", "")
	}
	// b's cancels changed nothing.
	for _, id := range []string{"order-1", seqID} {
		if c, rec := get(a, id); c.code != http.StatusOK || rec.State != api.StateQueued || rec.Owner != "a" {
			t.Fatalf("a's GET %s: %d %s; want queued, owner a", id, c.code, c.body)
		}
	}
	if c, rec := get(ops, "nats-1"); c.code != http.StatusOK || rec.State != api.StateQueued || rec.Owner != "" || rec.Reply != "replies.shop.nats-1" {
		t.Fatalf("admin's GET of the NATS job: %d %s; want queued, no owner, its reply subject", c.code, c.body)
	}
	if c, rec := get(ops, "order-1"); c.code != http.StatusOK || rec.Owner != "a" {
		t.Fatalf("admin's GET of a's job: %d %s", c.code, c.body)
	}

	// The list: each key its own, the admin every one.
	list := func(secret string) []string {
		t.Helper()
		c := asKey(t, secret, "GET", base+"?limit=10", "")
		var l api.JobList
		if err := json.Unmarshal(c.body, &l); err != nil || c.code != http.StatusOK {
			t.Fatalf("list: %d %s", c.code, c.body)
		}
		var ids []string
		for _, r := range l.Jobs {
			ids = append(ids, r.ID)
		}
		slices.Sort(ids)
		return ids
	}
	if got := list(a); !slices.Equal(got, []string{"order-1", "order-2"}) {
		t.Errorf("a lists %v", got)
	}
	if got := list(b); !slices.Equal(got, []string{"b-1"}) {
		t.Errorf("b lists %v", got)
	}
	if got := list(ops); !slices.Equal(got, []string{"b-1", "order-1", "order-2"}) {
		t.Errorf("admin lists %v", got)
	}
	// limit counts the caller's own jobs: b's one job is older than a's
	// two, yet limit=1 finds it.
	if c := asKey(t, b, "GET", base+"?limit=1", ""); !strings.Contains(string(c.body), `"id":"b-1"`) {
		t.Errorf("b's list with limit=1: %s", c.body)
	}

	// b resubmits a's Idempotency-Key: refused, nothing of a's job told.
	conflict := func(what string, c jobCall, field string) {
		t.Helper()
		var p api.Problem
		_ = json.Unmarshal(c.body, &p)
		if c.code != http.StatusConflict || p.Type != "urn:throttler:problem:idempotency-key-conflict" || p.Field != field ||
			c.header.Get("Location") != "" || c.header.Get("Throttle-Job-Id") != "" {
			t.Errorf("%s: %d %v %s; want 409 idempotency-key-conflict naming %s", what, c.code, c.header, c.body, field)
		}
		for _, leak := range []string{"body of order-1", "echo", `"state"`, "queued", "delivered", `"owner"`} {
			if strings.Contains(string(c.body), leak) {
				t.Errorf("%s: the answer tells %q of a's job: %s", what, leak, c.body)
			}
		}
	}
	conflict("single", asKey(t, b, "POST", base, "b's", "Idempotency-Key", "order-1"), "Idempotency-Key")
	conflict("waited", asKey(t, b, "POST", base+"?wait=2s", "b's", "Idempotency-Key", "order-1"), "Idempotency-Key")
	conflict("delayed", asKey(t, b, "POST", base, "b's", "Idempotency-Key", "order-1", "Throttle-Delay", "10s"), "Idempotency-Key")
	batch := func(secret, body string) api.BatchAccepted {
		t.Helper()
		c := asKey(t, secret, "POST", base+":batch", body, "Content-Type", "application/json")
		var out api.BatchAccepted
		if err := json.Unmarshal(c.body, &out); err != nil {
			t.Fatalf("batch: %d %s", c.code, c.body)
		}
		if strings.Contains(string(c.body), "body of order-1") || strings.Contains(string(c.body), "echo") {
			t.Errorf("batch answer tells of a's job: %s", c.body)
		}
		return out
	}
	out := batch(b, `[{"idempotency_key":"b-2","payload":"x"},{"idempotency_key":"order-1","payload":"x"},{"idempotency_key":"order-2","payload":"x","delay":"10s"}]`)
	if len(out.Results) != 3 || out.Results[0].Status != http.StatusAccepted || out.Accepted != 1 || out.Failed != 2 {
		t.Fatalf("b's batch: %+v", out)
	}
	for i, r := range out.Results[1:] {
		field := fmt.Sprintf("/%d/idempotency_key", i+1)
		if r.Status != http.StatusConflict || r.State != "" || r.Duplicate || r.Problem == nil ||
			r.Problem.Type != "urn:throttler:problem:idempotency-key-conflict" || r.Problem.Field != field {
			t.Errorf("b's batch item %d: %+v; want 409 naming %s", i+1, r, field)
		}
	}
	// a resubmits its own: the duplicate, as without keys.
	c = asKey(t, a, "POST", base, "again", "Idempotency-Key", "order-1")
	if err := json.Unmarshal(c.body, &acc); err != nil || c.code != http.StatusAccepted || !acc.Duplicate || acc.ID != "order-1" ||
		c.header.Get("Location") == "" {
		t.Fatalf("a resubmits order-1: %d %s", c.code, c.body)
	}
	if out := batch(a, `[{"idempotency_key":"order-1","payload":"x"}]`); len(out.Results) != 1 || !out.Results[0].Duplicate {
		t.Fatalf("a's batch of order-1: %+v", out)
	}
	// a cancels its own.
	if c := asKey(t, a, "DELETE", base+"/order-2", ""); c.code != http.StatusOK {
		t.Fatalf("a cancels order-2: %d %s", c.code, c.body)
	}

	// Resumed: everything not cancelled is delivered.
	if c := asKey(t, ops, "PATCH", lane, `{"paused":false}`, "Content-Type", "application/json"); c.code != http.StatusOK {
		t.Fatalf("resume: %d %s", c.code, c.body)
	}
	for _, j := range []struct{ secret, id string }{{a, "order-1"}, {a, seqID}, {b, "b-1"}, {b, "b-2"}, {ops, "nats-1"}} {
		testenv.Eventually(t, 20*time.Second, j.id+" delivered", func() bool {
			_, rec := get(j.secret, j.id)
			return rec.State == api.StateDelivered
		})
	}
	if _, rec := get(a, "order-1"); rec.Owner != "a" || rec.Response == nil || !strings.Contains(rec.Response.Body, "body of order-1") {
		t.Errorf("a's order-1: %+v; want a's own job delivered", rec)
	}
	if _, rec := get(a, seqID); rec.Owner != "a" {
		t.Errorf("a's job without an Idempotency-Key, after its claim: owner %q, want a", rec.Owner)
	}
	if _, rec := get(ops, "nats-1"); rec.Owner != "" {
		t.Errorf("the NATS job's record: owner %q; a header must never make one", rec.Owner)
	}
	notFound(b, "GET", "order-1", "")
	notFound(b, "GET", seqID, "")
	notFound(a, "GET", "nats-1", "")
	// Settled: a waited resubmission by b is still refused, without a's
	// answer.
	conflict("waited, settled", asKey(t, b, "POST", base+"?wait=2s", "b's", "Idempotency-Key", "order-1"), "Idempotency-Key")
	want := []string{seqID, "order-1", "order-2"}
	slices.Sort(want)
	if got := list(a); !slices.Equal(got, want) {
		t.Errorf("a lists %v after the drain", got)
	}
	if got := list(b); !slices.Equal(got, []string{"b-1", "b-2"}) {
		t.Errorf("b lists %v after the drain", got)
	}
}

// TestATakenIDGivesNoJobAway: a key cannot take another caller's job by
// naming its id. An id shaped like the ones the throttler makes for jobs
// without an Idempotency-Key is refused (400 naming Idempotency-Key); the
// id of a job published over NATS that waits without a record (its
// Nats-Msg-Id) is refused as another caller's (409), leaving no record,
// for a job to start now or a delayed one, single or in a batch: the NATS
// job is delivered, its record is not b's. (A claim that meets
// another caller's record under its job's id is records.ErrOtherOwner,
// tested in internal/records and by TestAReplayLeavesAnotherKeysRecordAlone.)
func TestATakenIDGivesNoJobAway(t *testing.T) {
	t.Parallel()
	target := newAnsweringTarget(t)
	natsURL, lane := startOwnerService(t, target.URL)
	base := lane + "/jobs"
	const a, b, ops = "secret-a", "secret-b", "secret-ops"
	if c := asKey(t, ops, "PATCH", lane, `{"paused":true}`, "Content-Type", "application/json"); c.code != http.StatusOK {
		t.Fatalf("pause: %d %s", c.code, c.body)
	}
	c := asKey(t, a, "POST", base, "a's secret work")
	var acc api.Accepted
	if err := json.Unmarshal(c.body, &acc); err != nil || c.code != http.StatusAccepted {
		t.Fatalf("a's job without an Idempotency-Key: %d %s", c.code, c.body)
	}
	for _, c := range []jobCall{
		asKey(t, b, "POST", base, "b's", "Idempotency-Key", acc.ID),
		asKey(t, b, "POST", base+":batch", fmt.Sprintf(`[{"idempotency_key":%q,"payload":"x"}]`, acc.ID), "Content-Type", "application/json"),
	} {
		if !strings.Contains(string(c.body), "idempotency_key") && !strings.Contains(string(c.body), `"field":"Idempotency-Key"`) || c.code == http.StatusAccepted && !strings.Contains(string(c.body), `"status":400`) {
			t.Errorf("b names a's id %s: %d %s; want it refused naming the Idempotency-Key", acc.ID, c.code, c.body)
		}
	}
	_, publish := natsPublisher(t, natsURL)
	publish("throttle.demo", "n-7", "nats work", nil)
	// b names the NATS job's id: refused as another caller's id, single
	// or in a batch, nothing of the job told and no record left.
	for _, c := range []jobCall{
		asKey(t, b, "POST", base, "b's", "Idempotency-Key", "n-7"),
		asKey(t, b, "POST", base+"?wait=1s", "b's", "Idempotency-Key", "n-7"),
		asKey(t, b, "POST", base+":batch", `[{"idempotency_key":"n-7","payload":"x"}]`, "Content-Type", "application/json"),
		// Delayed: the job would wait elsewhere until due, yet its
		// record would take the id now.
		asKey(t, b, "POST", base, "b's", "Idempotency-Key", "n-7", "Throttle-Delay", "1h"),
		asKey(t, b, "POST", base+":batch", `[{"idempotency_key":"n-7","payload":"x","delay":"1h"}]`, "Content-Type", "application/json"),
	} {
		if !strings.Contains(string(c.body), "idempotency-key-conflict") || strings.Contains(string(c.body), `"state"`) ||
			strings.Contains(string(c.body), `"duplicate"`) || regexp.MustCompile(`"eta_ms":[1-9]`).Match(c.body) || c.header.Get("Location") != "" {
			t.Errorf("b names the NATS job's id: %d %s; want the 409 idempotency-key-conflict, nothing of the job", c.code, c.body)
		}
	}
	notFound := asKey(t, b, "DELETE", base+"/zz-9", "")
	if c := asKey(t, b, "DELETE", base+"/n-7", ""); c.code != http.StatusNotFound || string(c.body) != strings.ReplaceAll(string(notFound.body), "zz-9", "n-7") {
		t.Fatalf("b cancels n-7: %d %s; want the 404 of an unknown id (no record of b's left)", c.code, c.body)
	}
	if c := asKey(t, ops, "PATCH", lane, `{"paused":false}`, "Content-Type", "application/json"); c.code != http.StatusOK {
		t.Fatalf("resume: %d %s", c.code, c.body)
	}
	testenv.Eventually(t, 20*time.Second, "a's job and the NATS job delivered", func() bool {
		return len(target.bodies(acc.ID)) == 1 && len(target.bodies("n-7")) == 1
	})
	if a, n := target.bodies(acc.ID), target.bodies("n-7"); a[0] != "a's secret work" || n[0] != "nats work" {
		t.Errorf("delivered: %q and %q", a, n)
	}
	testenv.Eventually(t, 10*time.Second, "the NATS job's record delivered, no owner", func() bool {
		c := asKey(t, ops, "GET", base+"/n-7", "")
		return c.code == http.StatusOK && strings.Contains(string(c.body), `"delivered"`) && !strings.Contains(string(c.body), `"owner"`)
	})
	if c := asKey(t, b, "GET", base+"/n-7", ""); c.code != http.StatusNotFound {
		t.Errorf("b's GET of the NATS job n-7: %d %s; want 404", c.code, c.body)
	}
	testenv.Eventually(t, 10*time.Second, "a's record delivered", func() bool {
		c := asKey(t, a, "GET", base+"/"+acc.ID, "")
		return c.code == http.StatusOK && strings.Contains(string(c.body), `"delivered"`) && strings.Contains(string(c.body), "answer to a's secret work")
	})
}

// TestAReplayLeavesAnotherKeysRecordAlone: a dead letter's id may name a
// record another key made since (b's job died and its record outlived
// results.keep; a then chose the same id). An admin's replay of the dead
// letter leaves a's record as it is: not put back to queued, its answer
// kept, no replay counted, and the dead job's callback (b's URL) not
// written into it (a's record would then be sent there when it settles).
// The replayed job is delivered without a record, as any job whose id has
// another caller's record.
func TestAReplayLeavesAnotherKeysRecordAlone(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target := newAnsweringTarget(t)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(receiver.Close)
	y := ownerHead(t, natsSrv.ClientURL(), "1s", redis.URL()) + fmt.Sprintf(`lanes:
  - name: demo
    rate: 50
    burst: 5
    results: {keep: 1s, max_body: 64, max_wait: 20s, callback_urls: [%q], callback_lane: callbacks}
    target: {http: {url: %q}}
  - name: callbacks
    rate: 20
    burst: 5
    target: {http: {url: %q, job_urls: [%q], signing_secrets: [%q]}}
`, receiver.URL+"/hooks", target.URL, receiver.URL+"/hooks", receiver.URL+"/hooks", callbackSecret)
	cfg, err := config.Parse("owner.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := runWithRegistry(t, cfg, prometheus.NewRegistry())
	base := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"
	const a, b, ops = "secret-a", "secret-b", "secret-ops"

	// b's job x dies at once, with b's callback; its record goes after
	// results.keep, its dead letter stays.
	if c := asKey(t, b, "POST", base+"?wait=10s", "die", "Idempotency-Key", "x", "Throttle-Callback", receiver.URL+"/hooks/b"); c.code != http.StatusOK {
		t.Fatalf("b's job x: %d %s", c.code, c.body)
	}
	testenv.Eventually(t, 20*time.Second, "b's record of x gone", func() bool {
		return asKey(t, b, "GET", base+"/x", "").code == http.StatusNotFound
	})
	// a chooses the id x now: its own job, delivered.
	c := asKey(t, a, "POST", base+"?wait=10s", "a's work", "Idempotency-Key", "x")
	if c.code != http.StatusOK || string(c.body) != "answer to a's work" {
		t.Fatalf("a's job x: %d %s", c.code, c.body)
	}
	before := asKey(t, a, "GET", base+"/x", "")
	if c := asKey(t, ops, "POST", "http://"+svc.Addr()+"/v1/lanes/demo/dead/replay", ""); c.code != http.StatusOK || !strings.Contains(string(c.body), `"replayed":1`) {
		t.Fatalf("replay of b's dead letter: %d %s", c.code, c.body)
	}
	after := asKey(t, a, "GET", base+"/x", "")
	var rec api.JobRecord
	if err := json.Unmarshal(after.body, &rec); err != nil || after.code != http.StatusOK {
		t.Fatalf("a's record x after the replay: %d %s (before: %s)", after.code, after.body, before.body)
	}
	if rec.Owner != "a" || rec.State != api.StateDelivered || rec.Replays != 0 || rec.Callback != "" || rec.Response == nil {
		t.Errorf("a's record x after an admin replayed b's dead letter x: %s\nbefore: %s\nwant it unchanged", after.body, before.body)
	}
	testenv.Eventually(t, 20*time.Second, "b's replayed job delivered", func() bool {
		return len(target.bodies("x")) == 3
	})
}

// TestNATSMsgIDCannotTakeAnHTTPJobsID: a NATS publisher learns the id the
// throttler gave a job submitted without an Idempotency-Key (the results
// subject shows every record of the lane) and publishes a delayed job whose
// Nats-Msg-Id is the id the next such job will get. That id is not the
// publisher's to choose (over HTTP it is refused): its job gets
// "<lane>-<seq>", and the next HTTP job keeps its own id and record, read
// by its owner with its answer, never the publisher's scheduled one.
func TestNATSMsgIDCannotTakeAnHTTPJobsID(t *testing.T) {
	t.Parallel()
	target := newAnsweringTarget(t)
	natsURL, lane := startOwnerService(t, target.URL)
	base := lane + "/jobs"
	const a, ops = "secret-a", "secret-ops"
	submit := func(body string) string {
		t.Helper()
		c := asKey(t, a, "POST", base, body)
		var acc api.Accepted
		if err := json.Unmarshal(c.body, &acc); err != nil || c.code != http.StatusAccepted {
			t.Fatalf("a's job without an Idempotency-Key: %d %s", c.code, c.body)
		}
		return acc.ID
	}
	first := submit("first")
	prefix, seq, ok := queue.ParseSeqID(first)
	if !ok {
		t.Fatalf("a's first job has id %q, not one the throttler makes", first)
	}
	next := queue.SeqID(prefix, seq+2)
	_, publish := natsPublisher(t, natsURL)
	if at := publish("throttle.demo", next, "squatter", nats.Header{"Throttle-Delay": {"1h"}}); at != seq+1 {
		t.Fatalf("the publisher's job stored at %d, want %d", at, seq+1)
	}
	squatter := fmt.Sprintf("demo-%d", seq+1)
	scheduled := func(id string) bool {
		c := asKey(t, ops, "GET", base+"/"+id, "")
		return c.code == http.StatusOK && strings.Contains(string(c.body), `"scheduled"`)
	}
	testenv.Eventually(t, 10*time.Second, "the publisher's job scheduled", func() bool { return scheduled(squatter) || scheduled(next) })
	if second := submit("second"); second != next {
		t.Fatalf("a's second job has id %q, want %q", second, next)
	}
	testenv.Eventually(t, 10*time.Second, "a's second job's own record delivered", func() bool {
		c := asKey(t, a, "GET", base+"/"+next, "")
		return c.code == http.StatusOK && strings.Contains(string(c.body), `"delivered"`) && strings.Contains(string(c.body), "answer to second")
	})
	if !scheduled(squatter) {
		t.Errorf("the publisher's job is not scheduled under %s", squatter)
	}
}

// TestNATSMsgIDCannotTakeAPublishedJobsID: a job published without a
// Nats-Msg-Id gets the id "<lane>-<seq>". Another publisher that names
// the next such id in its own Nats-Msg-Id, on a delayed job that expires
// at once, must not leave that id an expired record: the job that gets
// the id later would find it and be dropped, never delivered. Its id is
// not the publisher's to choose: its job gets "<lane>-<seq>" of its own.
func TestNATSMsgIDCannotTakeAPublishedJobsID(t *testing.T) {
	t.Parallel()
	target := newAnsweringTarget(t)
	natsURL, lane := startOwnerService(t, target.URL)
	base := lane + "/jobs"
	const ops = "secret-ops"
	_, publish := natsPublisher(t, natsURL)
	seq := publish("throttle.demo", "", "first", nil)
	next := fmt.Sprintf("demo-%d", seq+2)
	expires := time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)
	if at := publish("throttle.demo", next, "squatter", nats.Header{"Throttle-Delay": {"1h"}, "Throttle-Expires": {expires}}); at != seq+1 {
		t.Fatalf("the squatter's job stored at %d, want %d", at, seq+1)
	}
	squatter := fmt.Sprintf("demo-%d", seq+1)
	expired := func(id string) bool {
		c := asKey(t, ops, "GET", base+"/"+id, "")
		return c.code == http.StatusOK && strings.Contains(string(c.body), `"expired"`)
	}
	testenv.Eventually(t, 10*time.Second, "the squatter's job expired", func() bool { return expired(squatter) || expired(next) })
	if at := publish("throttle.demo", "", "victim", nil); at != seq+2 {
		t.Fatalf("the victim's job stored at %d, want %d", at, seq+2)
	}
	testenv.Eventually(t, 10*time.Second, "the victim's job delivered as "+next, func() bool {
		return slices.Equal(target.bodies(next), []string{"victim"})
	})
	if !expired(squatter) {
		t.Errorf("the squatter's job is not expired under %s", squatter)
	}
}

// answeringTarget is the owner tests' target: it keeps the bodies it got
// by Idempotency-Key and answers "answer to <body>", but refuses the body
// "die" (400, a dead letter).
type answeringTarget struct {
	*httptest.Server
	mu  sync.Mutex
	got map[string][]string
}

func newAnsweringTarget(t *testing.T) *answeringTarget {
	a := &answeringTarget{got: map[string][]string{}}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.got[r.Header.Get("Idempotency-Key")] = append(a.got[r.Header.Get("Idempotency-Key")], string(b))
		a.mu.Unlock()
		if string(b) == "die" {
			http.Error(w, "refused", http.StatusBadRequest)
			return
		}
		_, _ = fmt.Fprintf(w, "answer to %s", b)
	}))
	t.Cleanup(a.Close)
	return a
}

// bodies are the bodies delivered under id, in order.
func (a *answeringTarget) bodies(id string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got[id])
}
