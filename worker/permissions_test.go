package worker_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/worker"
)

// TestWorkerPermissions: a worker user with exactly the permissions that
// docs/WORKERS.md gives serves a pull-mode lane; the same user cannot
// publish jobs, read the inboxes of other workers, or write the
// throttler's control subjects.
func TestWorkerPermissions(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATSWith(t, &server.Options{
		Port: -1, StoreDir: t.TempDir(),
		Users: []*server.User{
			{Username: "throttler", Password: "throttler-pw"},
			{Username: "render-1", Password: "render-pw", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{workSubject, workSubject + ".ack.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.render-1.>"}},
			}},
		},
	})
	f := newFleetOn(t, srv.ClientURL(), 1, "50/s", 2, func(c *config.Config) {
		c.NATS.User, c.NATS.Password = "throttler", "throttler-pw"
	})
	f.connOpts = []nats.Option{nats.UserInfo("throttler", "throttler-pw")}

	var mu sync.Mutex
	var poolErrs, probeErrs []string
	asWorker := func(errs *[]string) []nats.Option {
		return []nats.Option{nats.UserInfo("render-1", "render-pw"), nats.CustomInboxPrefix("_INBOX.render-1"),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				*errs = append(*errs, err.Error())
				mu.Unlock()
			})}
	}
	done := map[string]bool{}
	runPool(t, f.conn(t, asWorker(&poolErrs)...), worker.Config{Subject: workSubject, Concurrency: 2, Name: "render-1"},
		func(_ context.Context, job *worker.Job) error {
			mu.Lock()
			done[job.ID] = true
			mu.Unlock()
			return nil
		})
	f.submit(t, "perm", 5)
	waitFor(t, 10*time.Second, "the worker user to run every job", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == 5
	})

	probe := f.conn(t, asWorker(&probeErrs)...)
	_ = probe.Publish("throttle."+laneName, []byte("forged job"))
	_ = probe.Publish("throttler.control."+laneName, []byte(`{"v":1}`))
	_, _ = probe.Subscribe("_INBOX.>", func(*nats.Msg) {})
	_ = probe.Flush()
	waitFor(t, 5*time.Second, "three permission violations", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(probeErrs) >= 3
	})
	mu.Lock()
	defer mu.Unlock()
	for _, e := range probeErrs {
		if !strings.Contains(strings.ToLower(e), "permissions violation") {
			t.Errorf("probe error %q is not a permissions violation", e)
		}
	}
	if len(poolErrs) > 0 {
		t.Errorf("the pool needed more than the documented permissions: %v", poolErrs)
	}
}

// TestNewWarnsOfAForeignInboxPrefix: a connection that logs in as a user
// but keeps another inbox prefix would never be answered; New says so,
// and says nothing with InboxPrefix(user).
func TestNewWarnsOfAForeignInboxPrefix(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATSWith(t, &server.Options{Port: -1, StoreDir: t.TempDir(),
		Users: []*server.User{{Username: "render-1", Password: "pw"}}})
	for _, tc := range []struct {
		name string
		opts []nats.Option
		warn bool
	}{
		{"default prefix", nil, true},
		{"another user's prefix", []nats.Option{worker.InboxPrefix("render-2")}, true},
		{"its own prefix", []nats.Option{worker.InboxPrefix("render-1")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := nats.Connect(srv.ClientURL(), append(tc.opts, nats.UserInfo("render-1", "pw"))...)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			var logs strings.Builder
			_, err = worker.New(nc, worker.Config{Subject: workSubject, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
				worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(logs.String(), "inbox prefix is not its user's"); got != tc.warn {
				t.Fatalf("warned %v, want %v: %s", got, tc.warn, logs.String())
			}
		})
	}
}
