package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// runRecords: what job records (lanes[].results) cost and how fast their
// answers come, all on one service with a lane keeping records and one
// keeping none:
//
//   - intake: accepted jobs/s at 64 connections, records on vs off
//     (interleaved rounds, best of each);
//   - drain: jobs/s of a backlog submitted over HTTP, records on vs off;
//   - GET of a job while the lane takes and drains 1,000 jobs/s: p99;
//   - a waited submission's answer after the target answered: p50;
//   - the process's RSS with 1,000 callers waiting at once;
//   - the bytes JetStream holds per record.
func runRecords(ctx context.Context, e *env) ([]Result, error) {
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	tg, err := startStampTarget()
	if err != nil {
		return nil, err
	}
	defer tg.close()
	on, off := e.lane("recon"), e.lane("recoff")
	don, doff := e.lane("drainon"), e.lane("drainoff")
	get, waited, held := e.lane("recget"), e.lane("recwait"), e.lane("recheld")
	slow := laneOpts{rate: 1, burst: 1, inflight: drainInflight, backlog: 100_000_000}
	withRec := slow
	withRec.results = true
	fast := laneOpts{rate: 1000, burst: 1, inflight: drainInflight, backlog: 100_000_000, results: true}
	quick := laneOpts{rate: bucket.MaxRate, burst: 1, inflight: drainInflight, backlog: 100_000_000, results: true}
	// The drained lanes run at the highest rate from the start, held
	// (paused) while they are filled: a slow lane's rate raised later
	// would keep the slots its drain reserved ahead.
	drainOff := laneOpts{rate: bucket.MaxRate, burst: 1, inflight: drainInflight, backlog: 100_000_000}
	drainOn := drainOff
	drainOn.results = true
	cfg, err := e.serviceConfig(svcOpts{conns: 2048, dataDir: e.dir("records"), target: sk.URL,
		lanes: map[string]laneOpts{on: withRec, off: slow, get: fast, waited: quick, held: withRec, don: drainOn, doff: drainOff}})
	if err != nil {
		return nil, err
	}
	for i := range cfg.Lanes {
		if cfg.Lanes[i].Name == waited {
			cfg.Lanes[i].Target.HTTP.URL = tg.url
		}
	}
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	base := "http://" + svc.svc.Addr() + "/v1/lanes/"
	client := newClient(ingestConns)
	defer client.CloseIdleConnections()
	var rows []Result
	for _, lane := range []string{don, doff} {
		if _, err := patch(ctx, client, base+lane, `{"paused":true}`); err != nil {
			return nil, err
		}
	}

	// Intake, records on vs off.
	best, err := e.interleave(ctx, ingestConns, 2_000_000, []side{
		{name: "records on", op: func(ctx context.Context, _, _ int) error {
			_, err := post(ctx, client, base+on+"/jobs", ingestPayload, 202)
			return err
		}},
		{name: "records off", op: func(ctx context.Context, _, _ int) error {
			_, err := post(ctx, client, base+off+"/jobs", ingestPayload, 202)
			return err
		}},
	})
	if err != nil {
		return nil, err
	}
	o, r := best[0], best[1]
	rows = append(rows, Result{ID: Records, Scenario: fmt.Sprintf("HTTP ingest @%d conns: accepted jobs/s, records on (vs off)", ingestConns),
		Ours: fmt.Sprintf("%s (%s)", fmtRate(o.Rate()), fmtLat(o.Lat)), Reference: fmt.Sprintf("%s (%s)", fmtRate(r.Rate()), fmtLat(r.Lat)),
		Ratio: fmtRatio(o.Rate(), r.Rate()), Goal: "≥ 0.90×", Verdict: verdict(o.Rate() >= 0.9*r.Rate()), Note: cpuNote(o, r, 1)})

	// Drain, records on vs off: each held lane is filled with n jobs
	// over HTTP (no Idempotency-Key, as the intake row), then drained at
	// the highest rate in interleaved rounds (off, on, off, on…) of n/4
	// jobs, resumed for a round and held again after it; the best round
	// of each lane counts, as the intake rows do. At the 20,000–30,000
	// jobs/s of the lane without records, a round of a few thousand jobs
	// would last little more than its unpause.
	//
	// A round drains m jobs and then some: the lane runs on at its
	// highest rate until the hold reaches it. What it drains past m is
	// gone for the rounds after, so n keeps a quarter for those (at
	// 30,000 jobs/s a hold reaching the drain after 100 ms takes 3,000);
	// the smoke run's 100-job rounds keep far more, since its hold may
	// come late on a loaded machine (with 500 jobs in rounds of 125 the
	// third round of a lane found fewer than 125 left).
	n, m := 60_000, 15_000
	if e.cfg.Smoke {
		n, m = 2_000, 100
	}
	const rounds = 3
	fill := newClient(1000)
	defer fill.CloseIdleConnections()
	for _, lane := range []string{doff, don} {
		// A held lane with room keeps each submission up to its
		// assignment wait: many connections fill it in a few seconds.
		res := closedLoop(ctx, 1000, 10*time.Minute, n, e.prog, "records fill "+lane, func(ctx context.Context, _, _ int) error {
			_, err := post(ctx, fill, base+lane+"/jobs", ingestPayload, 202)
			return err
		})
		if res.OK < n {
			return rows, fmt.Errorf("bench: records: filling %s: %d of %d stored: %v", lane, res.OK, n, res.Err)
		}
	}
	fill.CloseIdleConnections()
	drained := map[string]float64{}
	// The process's CPU time per drained job of each round (the service,
	// its NATS server and the sink): on a shared machine the rate moves
	// with the neighbours' load, the CPU per job much less.
	perJob := map[string][]time.Duration{}
	var werr error
rounds:
	for r := range rounds {
		for _, lane := range []string{doff, don} {
			sk.reset(m)
			cpu0, cerr := cpuTime(os.Getpid())
			if _, err := patch(ctx, client, base+lane, `{"paused":false}`); err != nil {
				return rows, err
			}
			werr = sk.wait(ctx, m, 10*time.Second+2*e.dur+time.Duration(m)*time.Millisecond, e.prog, fmt.Sprintf("records drain %s round %d/%d", lane, r+1, rounds))
			cpu1, err := cpuTime(os.Getpid())
			if cerr != nil || err != nil {
				cpu0, cpu1 = 0, 0 // unreadable: voids the median
			}
			perJob[lane] = append(perJob[lane], (cpu1-cpu0)/time.Duration(m))
			if _, err := patch(ctx, client, base+lane, `{"paused":true}`); err != nil {
				return rows, err
			}
			if werr != nil {
				break rounds
			}
			arrivals, _ := sk.snapshot()
			drained[lane] = max(drained[lane], pacingOf(arrivals[:m], 0).Achieved)
		}
	}
	cpuOn, cpuOff := medianDuration(perJob[don]), medianDuration(perJob[doff])
	drainCPU := ""
	if cpuOn > 0 && cpuOff > 0 {
		drainCPU = fmt.Sprintf("; CPU per job (whole process, median of the rounds): on %s, off %s, a CPU-bound ratio of %.2f×", fmtCPU(cpuOn), fmtCPU(cpuOff), float64(cpuOff)/float64(cpuOn))
	}
	drainRow := Result{ID: Records, Scenario: "drain, 1 lane → sink: jobs/s, records on (vs off)",
		Ours: fmtRate(drained[don]), Reference: fmtRate(drained[doff]), Ratio: fmtRatio(drained[don], drained[doff]),
		Goal: "≥ 0.85×", Verdict: verdict(drained[don] >= 0.85*drained[doff]),
		Note: fmt.Sprintf("best of %d interleaved rounds of %s jobs each, max_inflight %d%s", rounds, fmtInt(int64(m)), drainInflight, drainCPU)}
	if werr != nil {
		// A round that did not drain is this row's failure; the rows
		// after it measure other lanes and still run.
		drainRow.Verdict, drainRow.Note = Failed, werr.Error()
	}
	rows = append(rows, drainRow)

	// GET p99 while the lane takes and drains 1,000 jobs/s.
	jobs := int(e.dur.Seconds() * 1000)
	var submitted atomic.Int64
	var mu sync.Mutex
	var gets, health []time.Duration
	// The service's own time on each GET (its request-duration
	// histogram, read before and after): the client's time above includes
	// its own wait for a CPU, which on a shared machine is most of a tail.
	getRoute := map[string]string{"method": "GET", "route": "/v1/lanes/{lane}/jobs/{id}"}
	const durations = "throttler_http_request_duration_seconds"
	_, served0 := svc.histogram(durations, getRoute)
	gctx, stopGets := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; gctx.Err() == nil; i += 4 {
				k := submitted.Load()
				if k == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				id := "g-" + strconv.FormatInt(int64(i)%k, 10)
				t0 := time.Now()
				if _, err := getOK(gctx, client, base+get+"/jobs/"+id); err != nil {
					continue
				}
				mu.Lock()
				gets = append(gets, time.Since(t0))
				mu.Unlock()
				time.Sleep(4 * time.Millisecond) // about 1,000 GETs/s in all
			}
		})
	}
	// The reference: GET /healthz at the same moments, through the same
	// server and process, reading nothing: the tail every answer has.
	wg.Go(func() {
		for gctx.Err() == nil {
			t0 := time.Now()
			if _, err := getOK(gctx, client, "http://"+svc.svc.Addr()+"/healthz"); err == nil {
				mu.Lock()
				health = append(health, time.Since(t0))
				mu.Unlock()
			}
			time.Sleep(4 * time.Millisecond)
		}
	})
	failed, ferr := openLoop(ctx, 1000, jobs, ingestConns, 2*e.dur+10*time.Second, e.prog, "records GET load", func(ctx context.Context, i int) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+get+"/jobs", bytes.NewReader(ingestPayload))
		req.Header.Set("Idempotency-Key", "g-"+strconv.Itoa(i))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		submitted.Store(max(submitted.Load(), int64(i)))
		return nil
	})
	stopGets()
	wg.Wait()
	bounds, served1 := svc.histogram(durations, getRoute)
	served := "unreadable"
	if b := quantileBound(bounds, served0, served1, 0.99); !math.IsNaN(b) {
		served = "≤ " + fmtDur(time.Duration(b*float64(time.Second)))
	}
	gl, hl := summarise(gets), summarise(health)
	rows = append(rows, Result{ID: Records, Scenario: "GET /v1/lanes/{lane}/jobs/{id} while the lane takes and drains 1,000 jobs/s: p99 (vs GET /healthz)",
		Ours: fmtDur(gl.P99), Reference: fmtDur(hl.P99), Ratio: fmtRatio(float64(hl.P99), float64(gl.P99)), Goal: "≤ 5 ms", Verdict: verdict(gl.N > 0 && gl.P99 <= 5*time.Millisecond),
		Note: fmt.Sprintf("%s GETs (p50 %s; /healthz p50 %s); the service's own p99 (its duration histogram's bucket) %s; %d of %d submissions failed (%v)",
			fmtInt(int64(gl.N)), fmtDur(gl.P50), fmtDur(hl.P50), served, failed, jobs, ferr)})

	// A waited job's answer after the target's answer.
	waits := 500
	if e.cfg.Smoke {
		waits = 50
	}
	var after []time.Duration
	for i := range waits {
		id := "w-" + strconv.Itoa(i)
		req, _ := http.NewRequestWithContext(ctx, "POST", base+waited+"/jobs?wait=10s", bytes.NewReader(ingestPayload))
		req.Header.Set("Idempotency-Key", id)
		resp, err := client.Do(req)
		if err != nil {
			return rows, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got := time.Now()
		if resp.StatusCode != http.StatusOK {
			return rows, fmt.Errorf("bench: records: waited job %s answered %d", id, resp.StatusCode)
		}
		if at, ok := tg.answered(id); ok {
			after = append(after, got.Sub(at))
		}
	}
	wl := summarise(after)
	rows = append(rows, Result{ID: Records, Scenario: "POST …/jobs?wait=: the caller's answer after the target's answer: p50",
		Ours: fmtDur(wl.P50), Reference: "—", Ratio: "—", Goal: "≤ 3 ms", Verdict: verdict(wl.N > 0 && wl.P50 <= 3*time.Millisecond),
		Note: fmt.Sprintf("%d waited jobs one after the other (p99 %s)", wl.N, fmtDur(wl.P99))})

	// RSS with 1,000 callers waiting at once on a held lane.
	if _, err := patch(ctx, client, base+held, `{"paused":true}`); err != nil {
		return rows, err
	}
	// The heap the drain rows' filling grew is handed back first: freed
	// but kept pages would hide what the waiting callers take.
	debug.FreeOSMemory()
	before, merr := readStatus(os.Getpid())
	wctx, stopWaiting := context.WithCancel(ctx)
	waitClient := newClient(1000)
	var answered atomic.Int64
	var ww sync.WaitGroup
	for i := range 1000 {
		ww.Go(func() {
			req, _ := http.NewRequestWithContext(wctx, "POST", base+held+"/jobs?wait=5m", bytes.NewReader(ingestPayload))
			req.Header.Set("Idempotency-Key", "h-"+strconv.Itoa(i))
			if resp, err := waitClient.Do(req); err == nil {
				answered.Add(1)
				resp.Body.Close()
			}
		})
	}
	herr := waitUntil(ctx, 30*time.Second, func() bool {
		st, err := streamMsgs(svc, queue.StreamName(held))
		return err == nil && st >= 1000
	})
	time.Sleep(500 * time.Millisecond) // the last requests reach their wait
	during, derr := readStatus(os.Getpid())
	stopWaiting()
	ww.Wait()
	waitClient.CloseIdleConnections()
	row := Result{ID: Records, Scenario: "1,000 callers waiting at once (?wait=) on one instance: RSS", Reference: "—", Ratio: "—", Goal: "in the table", Verdict: NoGoal}
	switch {
	case merr != nil || derr != nil:
		row.Verdict, row.Note = Skipped, fmt.Sprintf("cannot read process memory: %v %v", merr, derr)
	case herr != nil:
		row.Verdict, row.Note = Failed, herr.Error()
	default:
		row.Ours = fmt.Sprintf("+%s (%s in all)", fmtMB(during.rss-before.rss), fmtMB(during.rss))
		row.Note = fmt.Sprintf("the bench process (service, embedded NATS, 1,000 client connections) before and while they wait; %d answered early", answered.Load())
	}
	rows = append(rows, row)

	// Bytes per record in JetStream (settled records of the GET lane).
	msgs, byts, err := bucketUsage(svc, get)
	brow := Result{ID: Records, Scenario: "storage per job record (JetStream bytes / records)", Reference: "—", Ratio: "—", Goal: "in the table", Verdict: NoGoal}
	if err != nil || msgs == 0 {
		brow.Verdict, brow.Note = Failed, fmt.Sprintf("%d records: %v", msgs, err)
	} else {
		brow.Ours = fmt.Sprintf("%d B", byts/msgs)
		brow.Note = fmt.Sprintf("%s records of a %d-byte payload's job with its 200 answer (no body)", fmtInt(int64(msgs)), len(ingestPayload))
	}
	return append(rows, brow), nil
}

// patch sends a PATCH with a JSON body and wants 200.
func patch(ctx context.Context, c *http.Client, url, body string) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, "PATCH", url, bytes.NewBufferString(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: PATCH %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("bench: PATCH %s %s: %d %s", url, body, resp.StatusCode, b)
	}
	return b, nil
}

// getOK GETs url and wants 200.
func getOK(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s: %d", url, resp.StatusCode)
	}
	return b, nil
}

func waitUntil(ctx context.Context, within time.Duration, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: records: not within %v", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// jsOf connects to the service's JetStream (embedded) for a look.
func jsOf(r *running) (*nats.Conn, jetstream.JetStream, error) {
	srv := r.svc.EmbeddedNATS()
	if srv == nil {
		return nil, nil, fmt.Errorf("bench: records: needs the embedded server")
	}
	nc, err := queue.ConnectEmbedded(srv, nats.Name("throttler-bench"))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

func streamMsgs(r *running, stream string) (uint64, error) {
	nc, js, err := jsOf(r)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

func bucketUsage(r *running, lane string) (msgs, bytes uint64, err error) {
	nc, js, err := jsOf(r)
	if err != nil {
		return 0, 0, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, records.BucketName(lane))
	if err != nil {
		return 0, 0, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, 0, err
	}
	return st.Values(), st.Bytes(), nil
}

// stampTarget answers 200 {"ok":true} and remembers when it answered each
// job (by Idempotency-Key).
type stampTarget struct {
	url string
	srv *http.Server
	mu  sync.Mutex
	at  map[string]time.Time
}

func startStampTarget() (*stampTarget, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: target: %w", err)
	}
	t := &stampTarget{url: "http://" + ln.Addr().String() + "/answer", at: map[string]time.Time{}}
	t.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		t.mu.Lock()
		t.at[r.Header.Get("Idempotency-Key")] = time.Now()
		t.mu.Unlock()
	})}
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

func (t *stampTarget) answered(id string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.at[id]
	return at, ok
}

func (t *stampTarget) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = t.srv.Shutdown(ctx)
}
