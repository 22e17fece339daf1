package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
)

// rssPayload is the body of each backlog job: 128 bytes, a small webhook.
var rssPayload = []byte(`{"event":"invoice.paid","customer":"c-000123","invoice":"in_0000000000000123","amount":4200,"currency":"EUR","n":1}`)

// rssGoal is the goal of both rss rows.
const rssGoal = "≤ 150 MB"

// runRSS: a throttler process (the real binary, `serve --config`) with one
// lane whose rate is so low that nothing drains, filled with the backlog
// through NATS (a Nats-Msg-Id each, as HTTP submissions have), then its
// VmRSS once the fill settled. Twice: with the embedded NATS server (the
// JetStream store lives in the throttler's process) and with an external
// one (a nats-server in the bench process, or --nats-url), which is the
// throttler's own footprint.
func runRSS(ctx context.Context, e *env) ([]Result, error) {
	n := e.cfg.backlog()
	embName := fmt.Sprintf("RSS of throttler holding %s jobs, embedded NATS (JetStream in-process)", fmtInt(int64(n)))
	extName := fmt.Sprintf("RSS of throttler holding %s jobs, external NATS", fmtInt(int64(n)))
	if e.cfg.Binary == "" {
		why := "skipped: no throttler binary to start (pass --throttler, or run throttler-bench inside the module so that it can build one)"
		return []Result{skipRow(RSS, embName, rssGoal, why), skipRow(RSS, extName, rssGoal, why)}, nil
	}
	if _, err := readStatus(os.Getpid()); err != nil {
		why := "skipped: cannot read process memory here: " + err.Error()
		return []Result{skipRow(RSS, embName, rssGoal, why), skipRow(RSS, extName, rssGoal, why)}, nil
	}
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()

	// The example config's lane (`make run`), offered the whole backlog:
	// what a newcomer's burst does to the default.
	def, err := e.rssRun(ctx, sk, n, "", true, &exampleLane)
	if err != nil {
		return nil, err
	}
	defRow := def.row(fmt.Sprintf("RSS of throttler with the example config's lane (configs/throttler.yaml: %s/s, burst %d, max_backlog %s), %s jobs offered, embedded NATS",
		strconv.FormatFloat(exampleLane.rate, 'g', -1, 64), exampleLane.burst, fmtInt(exampleLane.backlog), fmtInt(int64(n))))
	defRow.Ours = fmt.Sprintf("%s (peak %s; %s stored, %s refused)", fmtMB(def.rss), fmtMB(def.hwm), fmtInt(int64(def.stored)), fmtInt(int64(n-def.stored)))
	emb, err := e.rssRun(ctx, sk, n, "", true, nil)
	if err != nil {
		return []Result{defRow}, err
	}
	rows := []Result{defRow, emb.row(embName)}
	// The same without Nats-Msg-Id (jobs published by `nats pub`): the
	// difference is JetStream's de-duplication index, held for dedup_window.
	plain, err := e.rssRun(ctx, sk, n, "", false, nil)
	if err != nil {
		return rows, err
	}
	plainRow := plain.row(fmt.Sprintf("RSS of throttler holding %s jobs, embedded NATS, jobs without Nats-Msg-Id", fmtInt(int64(n))))
	plainRow.Goal, plainRow.Verdict = "— (explains the row above)", NoGoal
	rows = append(rows, plainRow)

	url := e.cfg.NATSURL
	if url == "" {
		srv, err := server.NewServer(&server.Options{
			ServerName: "bench-external", Host: "127.0.0.1", Port: -1, JetStream: true,
			StoreDir: e.dir("nats-external"), NoSigs: true, NoLog: true,
		})
		if err != nil {
			return rows, fmt.Errorf("bench: nats-server: %w", err)
		}
		go srv.Start()
		defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
		if !srv.ReadyForConnections(10 * time.Second) {
			return rows, errors.New("bench: nats-server not ready within 10s")
		}
		url = srv.ClientURL()
	}
	ext, err := e.rssRun(ctx, sk, n, url, true, nil)
	if err != nil {
		return rows, err
	}
	return append(rows, ext.row(extName)), nil
}

type rssFigure struct {
	n        int
	rss, hwm int64
	fill     time.Duration
	// stored is how many of the n jobs the lane took (all of them,
	// unless its max_backlog refused some).
	stored int
}

// exampleLane is the lane of configs/throttler.yaml, the config `make run`
// serves (TestExampleLaneIsTheConfigs keeps the two the same).
var exampleLane = laneOpts{rate: 20, burst: 10, inflight: 16, backlog: 100_000}

func (f rssFigure) row(name string) Result {
	return Result{
		ID: RSS, Scenario: name,
		Ours:      fmt.Sprintf("%s (peak %s; filled at %s)", fmtMB(f.rss), fmtMB(f.hwm), fmtRate(rate(f.n, f.fill))),
		Reference: "—", Ratio: "—", Goal: rssGoal,
		Verdict: verdict(f.rss <= 150_000_000),
	}
}

// rssRun starts the binary, fills its lane with n jobs (each with a
// Nats-Msg-Id when ids) and reads its memory. The lane is lo when set (jobs
// over its max_backlog are refused, and counted), else one that drains
// nothing and holds them all.
func (e *env) rssRun(ctx context.Context, sk *sink, n int, natsURL string, ids bool, lo *laneOpts) (rssFigure, error) {
	dir := e.dir("rss")
	listen, err := freeAddr()
	if err != nil {
		return rssFigure{}, err
	}
	lane := e.lane("rss")
	opts := svcOpts{dataDir: filepath.Join(dir, "data"), natsURL: natsURL, listen: listen, target: sk.URL,
		lanes: map[string]laneOpts{lane: {rate: 0.001, burst: 1, inflight: 1, backlog: int64(2 * n)}}}
	if lo != nil {
		opts.lanes[lane] = *lo
	}
	external := natsURL != ""
	if !external {
		addr, err := freeAddr()
		if err != nil {
			return rssFigure{}, err
		}
		opts.natsListen = addr
		natsURL = "nats://" + addr
	}
	// The child reads the file with the same loader; check it here first.
	if _, err := config.Parse("generated bench config", opts.yaml(), nil); err != nil {
		return rssFigure{}, fmt.Errorf("bench: %w", err)
	}
	path := filepath.Join(dir, "throttler.yaml")
	if err := os.WriteFile(path, opts.yaml(), 0o644); err != nil {
		return rssFigure{}, err
	}
	logPath := filepath.Join(dir, "throttler.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return rssFigure{}, err
	}
	defer logf.Close()
	cmd := exec.Command(e.cfg.Binary, "serve", "--config", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "THROTTLER_") { // the file alone configures the child
			cmd.Env = append(cmd.Env, kv)
		}
	}
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return rssFigure{}, fmt.Errorf("bench: start %s: %w", e.cfg.Binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer stopChild(cmd, exited)
	childErr := func(err error) error {
		b, _ := os.ReadFile(logPath)
		s := strings.TrimSpace(string(b))
		if len(s) > 1000 {
			s = "…" + s[len(s)-1000:]
		}
		return fmt.Errorf("%w (throttler log: %s)", err, s)
	}
	if err := waitReady(ctx, "http://"+listen+"/readyz", exited); err != nil {
		return rssFigure{}, childErr(err)
	}

	nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return rssFigure{}, childErr(fmt.Errorf("bench: nats: %w", err))
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(publishWindow))
	if err != nil {
		return rssFigure{}, err
	}
	fillCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	start := time.Now()
	phase := "fill"
	if external {
		phase = "fill (external NATS)"
	}
	if !ids {
		phase = "fill (no Nats-Msg-Id)"
	}
	stored := n
	if lo != nil {
		phase = "fill (example config, refusals expected)"
		stored, err = publishOffered(fillCtx, js, queue.Subject(lane, ""), n, rssPayload, func(d int) { e.prog.set(phase, d, n) })
	} else {
		err = publishN(fillCtx, js, queue.Subject(lane, ""), n, rssPayload, ids, func(d int) { e.prog.set(phase, d, n) })
	}
	if err != nil {
		return rssFigure{}, childErr(err)
	}
	fill := time.Since(start)
	// The stream must hold them all (one was dispatched: burst 1).
	st, err := js.Stream(ctx, queue.StreamName(lane))
	if err != nil {
		return rssFigure{}, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return rssFigure{}, err
	}
	if got, want := info.State.Msgs, uint64(stored); got+uint64(opts.lanes[lane].burst)+uint64(opts.lanes[lane].rate*fill.Seconds())+1 < want {
		return rssFigure{}, fmt.Errorf("bench: the stream holds %d of %d jobs", got, want)
	}
	// Let the fill settle: GC, file store flushes, caches that expire.
	settle := 5 * time.Second
	if e.cfg.Smoke {
		settle = 200 * time.Millisecond
	}
	e.prog.set("settle", 0, 1)
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return rssFigure{}, ctx.Err()
	}
	mem, err := readStatus(cmd.Process.Pid)
	if err != nil {
		return rssFigure{}, err
	}
	e.prog.set("settle", 1, 1)
	return rssFigure{n: n, rss: mem.rss, hwm: mem.hwm, fill: fill, stored: stored}, nil
}

// waitReady polls url until it answers 200, the process exits, or 60s pass.
func waitReady(ctx context.Context, url string, exited <-chan struct{}) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("bench: throttler exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("bench: throttler not ready within 60s")
		}
	}
}

// stopChild asks the child to stop (SIGTERM) and kills it after 20s.
func stopChild(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// memStatus is a process's resident memory, now and at its peak.
type memStatus struct {
	rss, hwm int64 // bytes
}

// publishOffered publishes n jobs with a Nats-Msg-Id each, like publishN,
// into a stream that may refuse some (its MaxMsgs, the lane's
// max_backlog), and returns how many it stored. A refusal from the server
// is counted; anything else fails.
func publishOffered(ctx context.Context, js jetstream.JetStream, subject string, n int, payload []byte, progress func(done int)) (int, error) {
	return publishWindowed(ctx, js, subject, n, payload, true, true, progress, nil)
}
