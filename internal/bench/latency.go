package bench

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

// latencyRate is the offered load of the latency scenario, jobs/s.
const latencyRate = 1000

// runLatency: jobs sent at 1,000/s to a lane whose rate (2,000/s, burst 200)
// admits them all; each body carries its send time and the sink measures
// HTTP in → target. The reference is the same load POSTed straight to the
// sink: the floor of loopback HTTP on this machine.
func runLatency(ctx context.Context, e *env) ([]Result, error) {
	name := fmt.Sprintf("admitted job, HTTP in → target @%s: p50 / p99 / max (vs direct POST)", fmtRate(latencyRate))
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	n := max(int(latencyRate*e.dur.Seconds()), 50)
	timeout := 2*time.Duration(n)*time.Second/latencyRate + 10*time.Second
	client := newClient(64)
	defer client.CloseIdleConnections()

	body := func() []byte {
		return []byte(stampPrefix + strconv.FormatInt(time.Now().UnixNano(), 10) + ` {"event":"bench.latency"}`)
	}
	// Reference: straight to the sink.
	sk.reset(n)
	failed, ferr := openLoop(ctx, latencyRate, n, 64, timeout, e.prog, "direct POST", func(ctx context.Context, _ int) error {
		_, err := post(ctx, client, sk.URL, body(), 200)
		return err
	})
	if failed > 0 || ferr != nil {
		return nil, fmt.Errorf("bench: latency reference: %d failed: %v", failed, ferr)
	}
	if err := sk.wait(ctx, n, timeout, e.prog, "direct POST"); err != nil {
		return nil, err
	}
	_, refLat := sk.snapshot()
	ref := summarise(refLat)

	lane := e.lane("latency")
	cfg, err := e.serviceConfig(svcOpts{dataDir: e.dir("latency"), target: sk.URL,
		lanes: map[string]laneOpts{lane: {rate: 2 * latencyRate, burst: 200, inflight: 64, backlog: int64(4 * n)}}})
	if err != nil {
		return nil, err
	}
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	url := "http://" + svc.svc.Addr() + "/v1/lanes/" + lane + "/jobs"
	// Warm up connections on both hops, then measure.
	warm := 50
	sk.reset(warm)
	if _, err := openLoop(ctx, latencyRate, warm, 64, timeout, e.prog, "warm-up", func(ctx context.Context, _ int) error {
		_, err := post(ctx, client, url, body(), 202)
		return err
	}); err != nil {
		return nil, err
	}
	if err := sk.wait(ctx, warm, timeout, e.prog, "warm-up"); err != nil {
		return nil, err
	}
	sk.reset(n)
	var queued atomic.Int64
	failed, ferr = openLoop(ctx, latencyRate, n, 64, timeout, e.prog, "via throttler", func(ctx context.Context, _ int) error {
		b, err := post(ctx, client, url, body(), 202)
		if err == nil && !bytes.Contains(b, []byte(`"state":"admitted"`)) {
			queued.Add(1)
		}
		return err
	})
	if failed > 0 || ferr != nil {
		return nil, fmt.Errorf("bench: latency: %d of %d submissions failed: %v", failed, n, ferr)
	}
	if err := sk.wait(ctx, n, timeout, e.prog, "via throttler"); err != nil {
		return nil, err
	}
	_, lat := sk.snapshot()
	ours := summarise(lat)
	cell := func(l latencies) string {
		return fmt.Sprintf("%s / %s / %s", fmtDur(l.P50), fmtDur(l.P99), fmtDur(l.Max))
	}
	row := Result{
		ID: Latency, Scenario: name,
		Ours: cell(ours), Reference: cell(ref),
		Ratio:   "p99 " + fmtRatio(float64(ours.P99), float64(ref.P99)),
		Goal:    "p99 ≤ 5 ms",
		Verdict: verdict(ours.P99 <= 5*time.Millisecond),
	}
	if q := queued.Load(); q > 0 {
		row.Note = fmt.Sprintf("%d of %d jobs were queued, not admitted", q, n)
	}
	return []Result{row}, nil
}
