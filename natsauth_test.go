package throttler_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/worker"
)

// trustSetup is one instance on the embedded server with the documented
// users: publishers shop (lane demo) and partner (lane other), workers
// render-1 (pull lane renders) and paint-1 (pull lane paints).
type trustSetup struct {
	cfg  config.Config
	url  string // the embedded server's client URL
	reg  *prometheus.Registry
	logs *syncBuffer
	adm  *nats.Conn // the throttler's own user: to look, never to attack
	js   jetstream.JetStream
	nats string // the nats command (natscli_test.go's stand-in)
}

const (
	trustPW      = "throttler-pw"
	shopPW       = "shop-pw"
	partnerPW    = "partner-pw"
	render1PW    = "render-pw"
	paint1PW     = "paint-pw"
	rendersWork  = "renders.work"
	paintsWork   = "paints.work"
	secretOther  = "partner-secret-payload"
	secretRender = "render-secret-payload"
)

func startTrustSetup(t *testing.T, target string) *trustSetup {
	t.Helper()
	rate, err := bucket.ParseRate("50/s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.NATS.DataDir = t.TempDir()
	cfg.NATS.Listen = testenv.FreeAddr(t)
	cfg.NATS.User, cfg.NATS.Password = "throttler", trustPW
	cfg.NATS.Publishers = []config.Publisher{
		{User: "shop", Password: shopPW, Lanes: []string{"demo"}},
		{User: "partner", Password: partnerPW, Lanes: []string{"other"}},
	}
	cfg.NATS.Workers = []config.Worker{
		{User: "render-1", Password: render1PW, Lanes: []string{"renders"}},
		{User: "paint-1", Password: paint1PW, Lanes: []string{"paints"}},
	}
	cfg.Dispatch.AllowNetworks = []string{"127.0.0.0/8"}
	lane := func(name string, target config.Target) config.Lane {
		return config.Lane{Name: name, Rate: rate, Burst: 5, MaxInflight: 4, MaxBacklog: 1000, MaxBody: 64 << 10,
			MaxBytes: 8 << 20, Target: target}
	}
	web := config.Target{HTTP: &config.HTTPTarget{URL: target, Method: "POST", Timeout: config.Duration(5 * time.Second)}}
	cfg.Lanes = []config.Lane{
		lane("demo", web), lane("other", web),
		lane("renders", config.Target{NATS: &config.NATSTarget{Subject: rendersWork, Mode: config.NATSModePull}}),
		lane("paints", config.Target{NATS: &config.NATSTarget{Subject: paintsWork, Mode: config.NATSModePull}}),
	}
	cfg.Retries.MaxBytes, cfg.DeadLetters.MaxBytes = 8<<20, 8<<20
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := &trustSetup{cfg: cfg, url: "nats://" + cfg.NATS.Listen, reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	log := slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	servicetest.Run(t, service.New(cfg, log, s.reg))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service log:\n%s", tail(s.logs.String(), 40))
		}
	})
	s.adm = s.connect(t, "throttler", trustPW, "")
	if s.js, err = jetstream.New(s.adm); err != nil {
		t.Fatal(err)
	}

	// The nats command: this test binary under that name (main_test.go).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s.nats = filepath.Join(t.TempDir(), "nats")
	if err := os.Symlink(self, s.nats); err != nil {
		t.Fatal(err)
	}
	return s
}

// connect logs in to the embedded server; inbox "" keeps nats.go's.
func (s *trustSetup) connect(t *testing.T, user, pw, inbox string) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.UserInfo(user, pw)}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(s.url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// connectWorker logs in as a worker user with its inbox prefix, as
// docs/WORKERS.md shows it.
func (s *trustSetup) connectWorker(t *testing.T, user, pw string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.url, nats.UserInfo(user, pw), worker.InboxPrefix(user))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// cli runs the nats command as user, as an outsider would, and returns its
// output and error.
func (s *trustSetup) cli(t *testing.T, user, pw string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.nats, append([]string{"--server", s.url, "--user", user, "--password", pw}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// refused sums throttler_pull_replies_refused_total of lane.
func (s *trustSetup) refused(t *testing.T, lane string) float64 {
	var n float64
	for series, v := range servicetest.Gather(t, s.reg) {
		if strings.HasPrefix(series, "throttler_pull_replies_refused_total{") && strings.Contains(series, `lane="`+lane+`"`) {
			n += v
		}
	}
	return n
}

// runPool runs a worker pool of the worker package on nc until the test
// ends; handle runs each job.
func runPool(t *testing.T, nc *nats.Conn, subject, name string, handle func(*worker.Job) error) {
	t.Helper()
	pool, err := worker.New(nc, worker.Config{Subject: subject, Name: name, PullWait: time.Second},
		worker.HandlerFunc(func(_ context.Context, j *worker.Job) error { return handle(j) }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pool.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pool %s: %v", name, err)
		}
	})
}

// TestPullWorkerCannotSteerTheThrottler: a worker of a pull-mode lane,
// logged in with the documented worker permissions, sends pull requests
// with the nats CLI whose reply subjects name the JetStream API (purge the
// dead letters, delete a lane's stream or its consumer), another lane's
// control subject, a KV subject, another lane's worker's inbox and a
// publisher's inbox. None is answered: the dead letters, the stream and
// its consumer are all still there, nothing is published on those
// subjects, every refusal is counted and logged, and the lane still
// delivers to its worker pool.
func TestPullWorkerCannotSteerTheThrottler(t *testing.T) {
	t.Parallel()
	s := startTrustSetup(t, "http://127.0.0.1:1/unused")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// render-1 serves renders with its own inbox prefix; a job with the
	// payload "poison" goes to the dead letters.
	var mu sync.Mutex
	done := map[string]bool{}
	runPool(t, s.connectWorker(t, "render-1", render1PW), rendersWork, "render-1", func(j *worker.Job) error {
		if string(j.Payload) == "poison" {
			return worker.Dead(errors.New("poison"))
		}
		mu.Lock()
		done[j.ID] = true
		mu.Unlock()
		return nil
	})
	publish := func(lane, id, payload string) {
		t.Helper()
		if _, err := s.js.Publish(ctx, queue.Subject(lane, ""), []byte(payload), jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	publish("renders", "dead-1", "poison")
	publish("renders", "ok-1", "fine")
	dead, err := s.js.Stream(ctx, queue.DeadStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "a dead letter and a delivered job", func() bool {
		info, err := dead.Info(ctx)
		mu.Lock()
		defer mu.Unlock()
		return err == nil && info.State.Msgs == 1 && done["ok-1"]
	})
	laneStream := queue.StreamName("renders")
	if _, err := s.js.Consumer(ctx, laneStream, queue.ConsumerName); err != nil {
		t.Fatalf("the lane's consumer: %v", err)
	}

	// Watch, as the throttler's own user, every subject a hijacked answer
	// would land on.
	spy, err := s.adm.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.adm.Flush(); err != nil {
		t.Fatal(err)
	}
	attacks := []string{
		"$JS.API.STREAM.PURGE." + queue.DeadStream,
		"$JS.API.STREAM.DELETE." + laneStream,
		"$JS.API.CONSUMER.DELETE." + laneStream + "." + queue.ConsumerName,
		"throttler.control.paints",
		"$KV.jobs.k",
		"_INBOX.paint-1.stolen",
		"_INBOX.shop.stolen",
	}
	for _, reply := range attacks {
		out, err := s.cli(t, "render-1", render1PW, "--inbox-prefix", "_INBOX.render-1",
			"pub", rendersWork, "--reply", reply, "-H", "Throttler-Expires:100", "")
		if err != nil {
			t.Fatalf("nats pub --reply %s as render-1: %v\n%s", reply, err, out)
		}
	}

	// The lane still delivers: a job published now reaches render-1 (and
	// an "empty" answer for each attack would have come long before).
	publish("renders", "ok-2", "fine")
	testenv.Eventually(t, 20*time.Second, "the lane still delivering", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done["ok-2"]
	})
	info, err := dead.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("dead letters after the attacks: %+v, %v; want the 1", info, err)
	}
	if _, err := s.js.Stream(ctx, laneStream); err != nil {
		t.Fatalf("the lane's stream after the attacks: %v", err)
	}
	if _, err := s.js.Consumer(ctx, laneStream, queue.ConsumerName); err != nil {
		t.Fatalf("the lane's consumer after the attacks: %v", err)
	}
	for {
		m, err := spy.NextMsg(100 * time.Millisecond)
		if err != nil {
			break
		}
		for _, reply := range attacks {
			if m.Subject == reply {
				t.Errorf("the throttler published on %s (headers %v)", reply, m.Header)
			}
		}
	}
	testenv.Eventually(t, 10*time.Second, "every attack counted", func() bool {
		return s.refused(t, "renders") == float64(len(attacks))
	})
	if !strings.Contains(s.logs.String(), "worker reply subject refused") {
		t.Error("no refusal was logged")
	}
}

// TestInboxesArePrivate: a publisher of lane demo cannot subscribe to every
// inbox nor to the throttler's (the nats CLI's sub is refused), so it
// never sees lane other's payloads, a worker's hand-outs or dead-letter
// payloads; with its own inbox prefix it still gets JetStream's
// acknowledgements, and without it it cannot.
func TestInboxesArePrivate(t *testing.T) {
	t.Parallel()
	sink := newSink(t)
	s := startTrustSetup(t, sink.url)

	for _, subject := range []string{"_INBOX.>", queue.ThrottlerInbox + ".>", "_INBOX.render-1.>", ">"} {
		out, err := s.cli(t, "shop", shopPW, "--inbox-prefix", "_INBOX.shop", "sub", subject)
		if err == nil || !strings.Contains(strings.ToLower(out), "permissions violation") {
			t.Errorf("nats sub %s as shop: %v\n%s", subject, err, out)
		}
	}
	out, err := s.cli(t, "render-1", render1PW, "--inbox-prefix", "_INBOX.render-1", "sub", queue.ThrottlerInbox+".>")
	if err == nil || !strings.Contains(strings.ToLower(out), "permissions violation") {
		t.Errorf("nats sub %s.> as render-1: %v\n%s", queue.ThrottlerInbox, err, out)
	}

	// shop listens on all it may read while the other lane's jobs are
	// delivered, a worker is handed a job and a dead letter is read back.
	shop := s.connect(t, "shop", shopPW, queue.UserInbox("shop"))
	var seen syncBuffer
	if _, err := shop.Subscribe(queue.UserInbox("shop")+".>", func(m *nats.Msg) { seen.Write(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := shop.Flush(); err != nil {
		t.Fatal(err)
	}
	out, err = s.cli(t, "partner", partnerPW, "--inbox-prefix", "_INBOX.partner", "pub", "--jetstream",
		"-H", "Nats-Msg-Id:o-1", queue.Subject("other", ""), secretOther)
	if err != nil || !strings.Contains(out, "Stored in Stream: "+queue.StreamName("other")) {
		t.Fatalf("partner's publish with its inbox prefix: %v\n%s", err, out)
	}
	testenv.Eventually(t, 20*time.Second, "lane other's job at its target", func() bool { return sink.has(secretOther) })
	runPool(t, s.connectWorker(t, "render-1", render1PW), rendersWork, "render-1", func(*worker.Job) error {
		return worker.Dead(errors.New("no"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.js.Publish(ctx, queue.Subject("renders", ""), []byte(secretRender), jetstream.WithMsgID("r-1")); err != nil {
		t.Fatal(err)
	}
	dead, err := s.js.Stream(ctx, queue.DeadStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the render job dead-lettered", func() bool {
		info, err := dead.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	if _, err := dead.GetLastMsgForSubject(ctx, queue.DeadSubject("renders")); err != nil {
		t.Fatal(err)
	}

	// With its inbox prefix, shop's publish is acknowledged; without it,
	// the acknowledgement has nowhere shop may read.
	out, err = s.cli(t, "shop", shopPW, "--inbox-prefix", "_INBOX.shop", "pub", "--jetstream",
		"-H", "Nats-Msg-Id:d-1", queue.Subject("demo", ""), "hello")
	if err != nil || !strings.Contains(out, "Stored in Stream: "+queue.StreamName("demo")) {
		t.Fatalf("shop's publish with its inbox prefix: %v\n%s", err, out)
	}
	out, err = s.cli(t, "shop", shopPW, "pub", "--jetstream", "-H", "Nats-Msg-Id:d-2", queue.Subject("demo", ""), "hello")
	if err == nil || !strings.Contains(strings.ToLower(out), "permissions violation") {
		t.Errorf("shop's publish without its inbox prefix: %v\n%s", err, out)
	}
	testenv.Eventually(t, 20*time.Second, "shop's job at its target", func() bool { return sink.has("hello") })
	if got := seen.String(); strings.Contains(got, secretOther) || strings.Contains(got, secretRender) {
		t.Fatalf("shop read another lane's payload on its inbox: %q", got)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// sink is an HTTP target that keeps the bodies it received.
type sink struct {
	url    string
	bodies syncBuffer
}

func newSink(t *testing.T) *sink {
	t.Helper()
	s := &sink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(&s.bodies, "%s\n", b)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/hook"
	return s
}

func (s *sink) has(body string) bool { return strings.Contains(s.bodies.String(), body+"\n") }
