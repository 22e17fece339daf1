package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/worker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

const (
	laneName    = "jobs"
	workSubject = "jobs.work"
)

// fleet is a NATS server, a Redis and the throttler instances sharing them.
type fleet struct {
	natsURL string
	// connOpts log the test's own connections in (conn, submit).
	connOpts []nats.Option
	redis    *testenv.Redis
	cfg      config.Config
	svcs     []*service.Service
}

// newFleet starts n throttler instances with one pull-mode lane (rate
// jobs/s, max_inflight) sharing a nats-server and a Redis.
func newFleet(t *testing.T, n int, rate string, maxInflight int, edit func(*config.Lane)) *fleet {
	t.Helper()
	return newFleetOn(t, testenv.StartNATS(t).ClientURL(), n, rate, maxInflight, func(c *config.Config) {
		if edit != nil {
			edit(&c.Lanes[0])
		}
	})
}

// newFleetOn is newFleet on a given nats-server, with edit applied to
// the whole configuration.
func newFleetOn(t *testing.T, natsURL string, n int, rate string, maxInflight int, edit func(*config.Config)) *fleet {
	t.Helper()
	f := &fleet{natsURL: natsURL, redis: testenv.StartRedis(t)}
	r, err := bucket.ParseRate(rate)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.NATS.URL = f.natsURL
	cfg.Redis.URL = f.redis.URL()
	cfg.ShutdownTimeout = config.Duration(5 * time.Second)
	cfg.Lanes = []config.Lane{{
		Name: laneName, Rate: r, Burst: 1, MaxInflight: maxInflight, MaxBacklog: 100000, MaxBody: 1 << 20,
		Target: config.Target{NATS: &config.NATSTarget{Subject: workSubject, Mode: config.NATSModePull}},
	}}
	if edit != nil {
		edit(&cfg)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	f.cfg = cfg
	// The instances stop together when the test ends (before their own
	// cleanups, which then find them stopped): each stop waits out its
	// lane's pull request, about a second.
	var stops []func()
	for range n {
		stops = append(stops, f.run(t))
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, stop := range stops {
			wg.Go(stop)
		}
		wg.Wait()
	})
	return f
}

// run runs one more instance until the test ends, and returns its stop.
func (f *fleet) run(t *testing.T) (stop func()) {
	t.Helper()
	cfg := f.cfg
	cfg.NATS.DataDir = t.TempDir()
	svc := service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})), nil)
	stop = servicetest.Run(t, svc)
	f.svcs = append(f.svcs, svc)
	return stop
}

// conn is a NATS connection closed when the test ends.
func (f *fleet) conn(t *testing.T, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(f.natsURL, append(append([]nats.Option{}, f.connOpts...), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// submit publishes jobs id-0…id-(n-1) on the lane's public subject.
func (f *fleet) submit(t *testing.T, prefix string, n int) []string {
	t.Helper()
	nc := f.conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		msg := nats.NewMsg("throttle." + laneName)
		msg.Data = []byte(ids[i])
		if _, err := js.PublishMsg(context.Background(), msg, jetstream.WithMsgID(ids[i])); err != nil {
			t.Fatalf("publish %s: %v", ids[i], err)
		}
	}
	return ids
}

// pollClient bounds every request of the tests, so that a server that
// stops answering fails the test instead of hanging it until -timeout.
var pollClient = servicetest.Client

// deadLetters lists the lane's dead letters through the HTTP API.
func (f *fleet) deadLetters(t *testing.T) []api.DeadLetter {
	t.Helper()
	resp, err := pollClient.Get("http://" + f.svcs[0].Addr() + "/v1/lanes/" + laneName + "/dead")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out api.DeadLetters
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("dead letters: %d: %v", resp.StatusCode, err)
	}
	return out.Dead
}

// runPool runs a pool until the returned stop is called (or the test ends);
// stop waits for Run to return.
func runPool(t *testing.T, nc *nats.Conn, cfg worker.Config, h worker.HandlerFunc) (stop func()) {
	t.Helper()
	p, err := worker.New(nc, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("pool Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor is testenv.Eventually, the suite's one polling helper.
var waitFor = testenv.Eventually

// rawWorker speaks the wire protocol by hand, as a worker in another
// language would.
type rawWorker struct {
	t     *testing.T
	nc    *nats.Conn
	inbox string
	sub   *nats.Subscription
}

func newRawWorker(t *testing.T, f *fleet) *rawWorker {
	nc := f.conn(t)
	w := &rawWorker{t: t, nc: nc, inbox: nc.NewInbox()}
	var err error
	if w.sub, err = nc.SubscribeSync(w.inbox); err != nil {
		t.Fatal(err)
	}
	return w
}

// ask sends a pull request waiting up to expires.
func (w *rawWorker) ask(expires time.Duration) {
	w.t.Helper()
	m := nats.NewMsg(workSubject)
	m.Reply = w.inbox
	m.Header.Set(worker.HeaderExpires, fmt.Sprint(expires.Milliseconds()))
	if err := w.nc.PublishMsg(m); err != nil {
		w.t.Fatal(err)
	}
}

// next waits for the answer to a pull request.
func (w *rawWorker) next(within time.Duration) *nats.Msg {
	w.t.Helper()
	m, err := w.sub.NextMsg(within)
	if err != nil {
		w.t.Fatalf("no answer to the pull request within %v: %v", within, err)
	}
	return m
}

// pull asks until a job comes.
func (w *rawWorker) pull(within time.Duration) *nats.Msg {
	w.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		w.ask(time.Second)
		if m := w.next(3 * time.Second); m.Header.Get(worker.HeaderStatus) != worker.StatusEmpty {
			return m
		}
	}
	w.t.Fatalf("no job within %v", within)
	return nil
}

// report sends an outcome to subject and returns the throttler's answer.
func (w *rawWorker) report(subject, status, id string) *nats.Msg {
	w.t.Helper()
	reply, err := w.tryReport(subject, status, id)
	if err != nil {
		w.t.Fatalf("report %s to %s: %v", status, subject, err)
	}
	return reply
}

// tryReport is report that returns the request's error.
func (w *rawWorker) tryReport(subject, status, id string) (*nats.Msg, error) {
	m := nats.NewMsg(subject)
	if status != "" {
		m.Header.Set(worker.HeaderStatus, status)
	}
	if id != "" {
		m.Header.Set(worker.HeaderIdempotencyKey, id)
	}
	return w.nc.RequestMsg(m, 5*time.Second)
}
