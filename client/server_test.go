package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
)

// A real throttler for the tests and examples: the embedded default
// (in-process NATS JetStream in a temporary directory, in-memory pacer).

// server is a running service and its targets.
type server struct {
	URL       string
	delivered *atomic.Int64 // arrivals at the demo lane's target
	stop      func()
}

// serverOptions shape the test server's lanes and keys.
type serverOptions struct {
	// keys: id → scopes; each secret is "secret-<id>".
	keys map[string][]string
	// slowBacklog is the max_backlog of lane "slow" (rate 2/s, burst 1).
	slowBacklog int64
	// records adds lanes that keep job records: answers (50/s) and hourly
	// (1/h, burst 1).
	records bool
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// startServer starts a service with lanes demo (50/s to a target that
// takes everything), failing (its target refuses every job for good: dead
// letters) and slow (2/s, burst 1, max_backlog opts.slowBacklog).
func startServer(opts serverOptions, logs io.Writer) (*server, error) {
	var delivered atomic.Int64
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		delivered.Add(1)
	}))
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "refused", http.StatusUnprocessableEntity)
	}))
	dir, err := os.MkdirTemp("", "throttler-client-test")
	if err != nil {
		return nil, err
	}
	cleanup := func() { ok.Close(); refuse.Close(); os.RemoveAll(dir) }
	rate := func(s string) bucket.Rate {
		r, err := bucket.ParseRate(s)
		if err != nil {
			panic(err)
		}
		return r
	}
	target := func(url string) config.Target {
		return config.Target{HTTP: &config.HTTPTarget{URL: url, Method: "POST", Timeout: config.Duration(5 * time.Second)}}
	}
	if opts.slowBacklog == 0 {
		opts.slowBacklog = 100000
	}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.NATS.DataDir = dir
	cfg.Dispatch.AllowNetworks = []string{"127.0.0.0/8"}
	cfg.Lanes = []config.Lane{
		{Name: "demo", Rate: rate("50/s"), Burst: 10, MaxInflight: 16, MaxBacklog: 100000, MaxBody: 1 << 20, Target: target(ok.URL)},
		{Name: "failing", Rate: rate("200/s"), Burst: 10, MaxInflight: 16, MaxBacklog: 100000, MaxBody: 1 << 20, Target: target(refuse.URL)},
		{Name: "slow", Rate: rate("2/s"), Burst: 1, MaxInflight: 1, MaxBacklog: opts.slowBacklog, MaxBody: 1 << 20, Target: target(ok.URL)},
	}
	if opts.records {
		cfg.Lanes = append(cfg.Lanes, config.Lane{Name: "answers", Rate: rate("50/s"), Burst: 10, MaxInflight: 16, MaxBacklog: 100000, MaxBody: 1 << 20, Target: target(ok.URL),
			Results: &config.Results{}},
			config.Lane{Name: "hourly", Rate: rate("1/h"), Burst: 1, MaxInflight: 1, MaxBacklog: 100000, MaxBody: 1 << 20, Target: target(ok.URL),
				Results: &config.Results{}})
	}
	for i := range cfg.Lanes {
		// JetStream reserves each stream's max_bytes from the free disk:
		// 64MiB keeps this test off the machine's disk size.
		cfg.Lanes[i].MaxBytes = 64 << 20
	}
	cfg.Retries.MaxBytes, cfg.DeadLetters.MaxBytes = 64<<20, 64<<20
	for id, scopes := range opts.keys {
		cfg.Auth.Keys = append(cfg.Auth.Keys, config.Key{ID: id, SHA256: sha("secret-" + id), Scopes: scopes})
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		cleanup()
		return nil, err
	}
	svc := service.New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})), nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-errc:
		cancel()
		cleanup()
		return nil, fmt.Errorf("service did not start: %w", err)
	case <-time.After(30 * time.Second):
		cancel()
		<-errc
		cleanup()
		return nil, fmt.Errorf("service not ready after 30s")
	}
	return &server{
		URL:       "http://" + svc.Addr(),
		delivered: &delivered,
		stop: func() {
			cancel()
			<-errc
			cleanup()
		},
	}, nil
}
