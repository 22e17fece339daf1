package service_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/worker"
)

// TestEmbeddedWorkerUsers: nats.workers are users of the embedded server
// that serve its pull-mode lanes with the permissions of docs/WORKERS.md
// and no more: a worker pool runs the lane's jobs; the same user cannot
// publish jobs, write control subjects or read every inbox.
func TestEmbeddedWorkerUsers(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:1/unused", 50, 5)
	cfg.Lanes[0].Target = config.Target{NATS: &config.NATSTarget{Subject: "renders.work", Mode: config.NATSModePull}}
	cfg.NATS.Listen = testenv.FreeAddr(t)
	cfg.NATS.User, cfg.NATS.Password = "throttler", "throttler-pw"
	cfg.NATS.Workers = []config.Worker{{User: "render-1", Password: "render-pw", Lanes: []string{"demo"}}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	start(t, cfg)

	var mu sync.Mutex
	var violations []string
	connect := func(user, pw string, opts ...nats.Option) *nats.Conn {
		nc, err := nats.Connect("nats://"+cfg.NATS.Listen, append(opts, nats.UserInfo(user, pw),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				violations = append(violations, user+": "+err.Error())
				mu.Unlock()
			}))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	wc := connect("render-1", "render-pw", nats.CustomInboxPrefix("_INBOX.render-1"))
	done := make(chan string, 3)
	pool, err := worker.New(wc, worker.Config{Subject: "renders.work", Name: "render-1"}, worker.HandlerFunc(func(_ context.Context, j *worker.Job) error {
		done <- j.ID
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- pool.Run(ctx) }()
	defer func() { cancel(); <-stopped }()

	pub := connect("throttler", "throttler-pw")
	for _, id := range []string{"r-1", "r-2", "r-3"} {
		m := nats.NewMsg("throttle.demo")
		m.Header.Set("Nats-Msg-Id", id)
		if err := pub.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the worker user did not get the lane's jobs")
		}
	}
	mu.Lock()
	if len(violations) > 0 {
		t.Fatalf("the pool needed more than its permissions: %v", violations)
	}
	mu.Unlock()

	probe := connect("render-1", "render-pw")
	_ = probe.Publish("throttle.demo", []byte("forged"))
	_ = probe.Publish("throttler.control.demo", []byte(`{"v":1}`))
	_, _ = probe.Subscribe("_INBOX.>", func(*nats.Msg) {})
	_ = probe.Flush()
	waitFor(t, 5*time.Second, "three permission violations", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(violations) >= 3
	})
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		if !strings.Contains(strings.ToLower(v), "permissions violation") {
			t.Errorf("%s: not a permissions violation", v)
		}
	}
}
