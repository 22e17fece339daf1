package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/throttler/throttler/internal/config"
)

// runLanes: what a fleet pays per lane. The real binary starts with N idle
// lanes (100 and 1,000; 5 and 20 with --smoke) on a nats-server of the
// bench's own (so that the throttler's memory is its own): the time from
// exec until /readyz answers (each lane makes its stream, consumer, retry
// consumer and control subscription), its VmRSS after a settle, and what
// the server holds for them (streams, consumers, and the server's own
// memory growth as /varz reports it).
func runLanes(ctx context.Context, e *env) ([]Result, error) {
	counts := []int{100, 1000}
	if e.cfg.Smoke {
		counts = []int{5, 20}
	}
	name := func(n int) string {
		return fmt.Sprintf("%s idle lanes: start until ready · throttler RSS · NATS streams, consumers, memory", fmtInt(int64(n)))
	}
	var rows []Result
	if e.cfg.Binary == "" {
		for _, n := range counts {
			rows = append(rows, skipRow(Lanes, name(n), "—", "skipped: no throttler binary to start (pass --throttler)"))
		}
		return rows, nil
	}
	if _, err := readStatus(os.Getpid()); err != nil {
		for _, n := range counts {
			rows = append(rows, skipRow(Lanes, name(n), "—", "skipped: cannot read process memory here: "+err.Error()))
		}
		return rows, nil
	}
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	for _, n := range counts {
		row, err := e.lanesRun(ctx, sk, n, name(n))
		if err != nil {
			return rows, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// lanesRun measures one lane count on a fresh nats-server.
func (e *env) lanesRun(ctx context.Context, sk *sink, n int, name string) (Result, error) {
	dir := e.dir(fmt.Sprintf("lanes-%d", n))
	srv, err := server.NewServer(&server.Options{
		ServerName: "bench-lanes", Host: "127.0.0.1", Port: -1, HTTPHost: "127.0.0.1", HTTPPort: -1, JetStream: true,
		StoreDir: filepath.Join(dir, "nats"), NoSigs: true, NoLog: true,
	})
	if err != nil {
		return Result{}, fmt.Errorf("bench: nats-server: %w", err)
	}
	go srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(10 * time.Second) {
		return Result{}, fmt.Errorf("bench: nats-server not ready within 10s")
	}
	before, err := srv.Varz(nil)
	if err != nil {
		return Result{}, err
	}
	listen, err := freeAddr()
	if err != nil {
		return Result{}, err
	}
	opts := svcOpts{dataDir: filepath.Join(dir, "data"), natsURL: srv.ClientURL(), listen: listen, target: sk.URL, lanes: map[string]laneOpts{}}
	for i := range n {
		// Slow lanes with small streams: 1,000 lanes at the default
		// max_bytes (1 GiB each) would reserve more disk than most
		// machines have.
		opts.lanes[e.lane(fmt.Sprintf("l%04d", i))] = laneOpts{rate: 1, burst: 1, inflight: 4, backlog: 1000, maxBytes: 1 << 20}
	}
	if _, err := config.Parse("generated bench config", opts.yaml(), nil); err != nil {
		return Result{}, fmt.Errorf("bench: %w", err)
	}
	path := filepath.Join(dir, "throttler.yaml")
	if err := os.WriteFile(path, opts.yaml(), 0o644); err != nil {
		return Result{}, err
	}
	logPath := filepath.Join(dir, "throttler.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return Result{}, err
	}
	defer logf.Close()
	cmd := exec.Command(e.cfg.Binary, "serve", "--config", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "THROTTLER_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	dieWithParent(cmd)
	e.prog.set(fmt.Sprintf("start with %d lanes", n), 0, 1)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("bench: start %s: %w", e.cfg.Binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer stopChild(cmd, exited)
	if err := waitReady(ctx, "http://"+listen+"/readyz", exited); err != nil {
		b, _ := os.ReadFile(logPath)
		s := strings.TrimSpace(string(b))
		if len(s) > 1000 {
			s = "…" + s[len(s)-1000:]
		}
		return Result{}, fmt.Errorf("%w (throttler log: %s)", err, s)
	}
	ready := time.Since(start)
	settle := 5 * time.Second
	if e.cfg.Smoke {
		settle = 200 * time.Millisecond
	}
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	e.prog.set(fmt.Sprintf("start with %d lanes", n), 1, 1)
	mem, err := readStatus(cmd.Process.Pid)
	if err != nil {
		return Result{}, err
	}
	after, err := srv.Varz(nil)
	if err != nil {
		return Result{}, err
	}
	jsz, err := srv.Jsz(&server.JSzOptions{})
	if err != nil {
		return Result{}, err
	}
	return Result{
		ID: Lanes, Scenario: name,
		Ours: fmt.Sprintf("ready in %s · RSS %s · %d streams, %d consumers, bench process +%s (its in-process nats-server)",
			ready.Round(10*time.Millisecond), fmtMB(mem.rss), jsz.Streams, jsz.Consumers, fmtMB(max(after.Mem-before.Mem, 0))),
		Reference: "—", Ratio: "—", Goal: "— (measured)", Verdict: NoGoal,
	}, nil
}
