package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// natsWithUsers runs a nats-server with the users docs/OPERATIONS.md
// recommends: the throttler's own user, and a publisher that may publish
// jobs on the public subjects of lane demo only. It returns the client URL
// of each.
func natsWithUsers(t *testing.T) (throttlerURL, publisherURL string) {
	t.Helper()
	srv := testenv.StartNATSWith(t, &server.Options{
		Port: -1, StoreDir: t.TempDir(),
		Users: []*server.User{
			{Username: "throttler", Password: "s3cret"},
			{Username: "shop", Password: "pub", Permissions: queue.PublisherPermissions("shop", []string{"demo"})},
		},
	})
	addr := srv.Addr().String()
	return "nats://throttler:s3cret@" + addr, "nats://shop:pub@" + addr
}

// publisher connects as the outside publisher; publish errors (permission
// violations) are collected.
type publisher struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	mu   sync.Mutex
	errs []error
}

func connectPublisher(t *testing.T, url string) *publisher {
	t.Helper()
	p := &publisher{}
	nc, err := nats.Connect(url, nats.CustomInboxPrefix(queue.UserInbox("shop")), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		p.mu.Lock()
		p.errs = append(p.errs, err)
		p.mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p.nc = nc
	if p.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *publisher) violations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, e := range p.errs {
		if strings.Contains(strings.ToLower(e.Error()), "permissions violation") {
			n++
		}
	}
	return n
}

func lanesOf(t *testing.T, addr string) []api.LaneStatus {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/v1/lanes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out api.Lanes
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Lanes
}

// TestForgedHeadersChangeNothing: a publisher allowed only throttle.demo
// publishes jobs with every header the throttler once believed: an
// "admitted" flag, attempts, a not-before in the year 5138, a notify address
// on the control subject, another job's id, and a job id with control
// bytes. The jobs are paced
// like any queued job (no burst past the limit), delivered once each under
// their Nats-Msg-Id, on their first attempt; the lane does not stall (a
// later HTTP job is delivered); nothing reaches the control subject. The
// publisher cannot write the throttler's own subjects at all.
func TestForgedHeadersChangeNothing(t *testing.T) {
	throttlerURL, publisherURL := natsWithUsers(t)
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL+"/hook", 20, 5)
	cfg.NATS.URL = throttlerURL
	svc, _ := start(t, cfg)

	// Watch the control subject as the throttler's user.
	watch, err := nats.Connect(throttlerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	var controls sync.Map
	sub, err := watch.Subscribe(queueControl("demo"), func(m *nats.Msg) { controls.Store(string(m.Data), true) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	pub := connectPublisher(t, publisherURL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 30
	for i := range n {
		m := nats.NewMsg(queue.Subject("demo", ""))
		m.Data = []byte("forged")
		m.Header.Set("Nats-Msg-Id", fmt.Sprintf("p-%02d", i))
		m.Header.Set("Throttler-Admitted", "1")
		m.Header.Set("Throttler-Attempts", "99")
		m.Header.Set("Throttler-Not-Before", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10))
		m.Header.Set("Throttler-Notify", "throttler.control.demo")
		m.Header.Set("Throttler-Job-Id", "victim")
		if i%2 == 1 {
			m.Header.Set("Throttler-Not-Before", "99999999999999")
			m.Header.Set("Throttler-Job-Id", "evil\x01id")
		}
		if _, err := pub.js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	// The throttler's own subjects refuse this publisher.
	for _, subj := range []string{queueControl("demo"), queue.InternalSubject("demo", ""), queue.RetrySubject("demo"), queue.NotifySubject("x")} {
		_ = pub.nc.Publish(subj, []byte(`{"v":1,"kind":"limit","rate":1000000,"burst":1000}`))
	}
	_ = pub.nc.Flush()
	waitFor(t, 5*time.Second, "four permission violations", func() bool { return pub.violations() >= 4 })

	waitFor(t, 10*time.Second, "the forged jobs delivered", func() bool { return len(rec.snapshot()) >= n })
	client := &http.Client{Timeout: 5 * time.Second}
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "after", "x"); code != http.StatusAccepted {
		t.Fatalf("HTTP job after the forged ones: %d", code)
	}
	waitFor(t, 5*time.Second, "the HTTP job after them", func() bool { return len(rec.snapshot()) >= n+1 })

	got := rec.snapshot()
	var starts []time.Duration
	seen := map[string]bool{}
	for _, a := range got {
		if seen[a.id] {
			t.Fatalf("job %s delivered twice", a.id)
		}
		seen[a.id] = true
		starts = append(starts, a.at.Sub(got[0].at))
	}
	for i := range n {
		if id := fmt.Sprintf("p-%02d", i); !seen[id] {
			t.Fatalf("forged job %s not delivered under its Nats-Msg-Id (got %v)", id, seen)
		}
	}
	l := bucket.Limit{Rate: 20, Burst: 5}
	buckettest.CheckWindows(t, starts, l, startTolerance(l))
	controls.Range(func(k, _ any) bool {
		t.Errorf("a control message reached the lane: %s", k)
		return true
	})
	if st := lanesOf(t, svc.Addr()); st[0].Rate != 20 || st[0].Burst != 5 || st[0].Paused {
		t.Fatalf("lane changed: %+v", st[0])
	}
}

func queueControl(lane string) string { return "throttler.control." + lane }

func freeTCPPort(t *testing.T) int {
	t.Helper()
	return testenv.FreePort(t)
}

// TestOutsideMsgIDCannotDropARetry: an outsider who publishes a job whose
// Nats-Msg-Id is the throttler's id for a retry ("victim#attempt-1") before
// the retry comes back cannot make the retry a "duplicate": the retry is
// stored again under a fresh id and delivered, and the outsider's job is
// delivered as a job of its own.
func TestOutsideMsgIDCannotDropARetry(t *testing.T) {
	t.Parallel()
	throttlerURL, publisherURL := natsWithUsers(t)
	target := newScripted(t, 500, 200)
	cfg := testConfig(t, t.TempDir(), target.url+"/hook", 50, 5)
	cfg.NATS.URL = throttlerURL
	cfg.Lanes[0].Retry = config.Retry{MaxAttempts: 3, BackoffBase: config.Duration(time.Second), BackoffMax: config.Duration(time.Second)}
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 5 * time.Second}
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "victim", "real"); code != http.StatusAccepted {
		t.Fatalf("submit: %d", code)
	}
	waitFor(t, 5*time.Second, "the first attempt", func() bool { return target.count("victim") >= 1 })
	// The retry waits up to a second: squat its id now.
	pub := connectPublisher(t, publisherURL)
	m := nats.NewMsg(queue.Subject("demo", ""))
	m.Data = []byte("squatter")
	m.Header.Set("Nats-Msg-Id", "victim#attempt-1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pub.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the retry delivered", func() bool { return target.count("victim") >= 2 })
	waitFor(t, 5*time.Second, "the squatter's job delivered", func() bool { return target.count("victim#attempt-1") >= 1 })
}

// TestOutsideMsgIDCannotDropAReplay: the same for a replayed dead letter,
// whose id is "<id>#replay-<seq>".
func TestOutsideMsgIDCannotDropAReplay(t *testing.T) {
	t.Parallel()
	throttlerURL, publisherURL := natsWithUsers(t)
	target := newScripted(t, 404)
	cfg := testConfig(t, t.TempDir(), target.url+"/hook", 50, 5)
	cfg.NATS.URL = throttlerURL
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 5 * time.Second}
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "d1", "real"); code != http.StatusAccepted {
		t.Fatalf("submit: %d", code)
	}
	var dead []api.DeadLetter
	waitFor(t, 5*time.Second, "a dead letter", func() bool { dead = deadList(t, svc.Addr()); return len(dead) == 1 })
	pub := connectPublisher(t, publisherURL)
	m := nats.NewMsg(queue.Subject("demo", ""))
	m.Data = []byte("squatter")
	m.Header.Set("Nats-Msg-Id", fmt.Sprintf("d1#replay-%d", dead[0].Seq))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	target.set(200)
	if _, err := pub.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s/v1/lanes/demo/dead/%d/replay", svc.Addr(), dead[0].Seq), nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("replay: %d", resp.StatusCode)
	}
	waitFor(t, 10*time.Second, "the replay delivered", func() bool { return target.count("d1") >= 2 })
}

// TestEmbeddedPublishersAndListen: the embedded server refuses a
// non-loopback listen without credentials (a config error naming the
// field), and with nats.user and nats.publishers an outside publisher
// reaches its lane's subject through the listen port and nothing else.
func TestEmbeddedPublishersAndListen(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:1/x", 10, 1)
	cfg.NATS.Listen = "0.0.0.0:4333"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "nats.listen") {
		t.Fatalf("non-loopback listen without credentials: %v", err)
	}

	rec := newRecorder(t)
	cfg = testConfig(t, t.TempDir(), rec.srv.URL+"/hook", 50, 5)
	port := freeTCPPort(t)
	cfg.NATS.Listen = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.NATS.User, cfg.NATS.Password = "throttler", "s3cret"
	cfg.NATS.Publishers = []config.Publisher{{User: "shop", Password: "pub", Lanes: []string{"demo"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	start(t, cfg)
	if _, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port)); err == nil {
		t.Fatal("a client without credentials connected")
	}
	pub := connectPublisher(t, fmt.Sprintf("nats://shop:pub@127.0.0.1:%d", port))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := pub.js.Publish(ctx, queue.Subject("demo", ""), []byte("hello")); err != nil {
		t.Fatalf("publish on the lane's subject: %v", err)
	}
	_ = pub.nc.Publish(queueControl("demo"), []byte(`{"v":1,"kind":"pause","pause_ms":3600000}`))
	_ = pub.nc.Flush()
	waitFor(t, 5*time.Second, "a permission violation", func() bool { return pub.violations() >= 1 })
	waitFor(t, 5*time.Second, "the job delivered", func() bool { return len(rec.snapshot()) >= 1 })
}
