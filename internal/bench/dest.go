package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
)

// Where a job goes (package dest), measured: the drain of jobs that each
// carry a path and two forwarded headers against plain jobs, and intake
// with those headers against without, in the same run.

// destForward are the headers the destination rows forward.
var destForward = []string{"X-Api-Key", "Accept"}

// withDest gives the lanes of cfg named in lanes the lists the
// destination rows use: GET besides POST, destForward forwarded.
func withDest(cfg *config.Config, lanes ...string) {
	for i := range cfg.Lanes {
		if h := cfg.Lanes[i].Target.HTTP; h != nil && slices.Contains(lanes, cfg.Lanes[i].Name) {
			h.Methods = []string{"GET"}
			h.ForwardHeaders = destForward
		}
	}
}

// drainDest drains n plain jobs and n jobs with a Throttle-Path and two
// Throttle-Forward headers each, in alternating rounds (best of each), on
// lanes that differ in nothing else.
func (e *env) drainDest(ctx context.Context, sk *sink, n int) (Result, error) {
	const rounds = 3
	lo := laneOpts{rate: bucket.MaxRate, burst: 1, inflight: drainInflight, backlog: int64(2 * n)}
	lanes := map[string]laneOpts{}
	var order []string // plain, dest, plain, dest, …
	for r := range rounds {
		plain, dest := e.lane("destplain"+strconv.Itoa(r)), e.lane("dest"+strconv.Itoa(r))
		lanes[plain], lanes[dest] = lo, lo
		order = append(order, plain, dest)
	}
	cfg, err := e.serviceConfig(svcOpts{dataDir: e.dir("dest"), target: sk.URL, lanes: lanes})
	if err != nil {
		return Result{}, err
	}
	withDest(&cfg, order...)
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	svc.stop()
	if err := e.withNATS(ctx, cfg.NATS.DataDir, func(js jetstream.JetStream) error {
		for i, lane := range order {
			if err := publishDest(ctx, js, queue.Subject(lane, ""), n, i%2 == 1); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return Result{}, err
	}
	// drain returns the lane's rate and this process's CPU time per job
	// (the service, its NATS server and the sink): on a shared machine the
	// rate moves with the neighbours' load, the CPU per job much less.
	drain := func(lane string) (float64, time.Duration, error) {
		c := cfg
		c.Lanes = nil
		for _, l := range cfg.Lanes {
			if l.Name == lane {
				c.Lanes = []config.Lane{l}
			}
		}
		sk.reset(n)
		cpu0, cerr := cpuTime(os.Getpid())
		svc, err := e.startService(ctx, c)
		if err != nil {
			return 0, 0, err
		}
		werr := sk.wait(ctx, n, 2*e.dur+time.Duration(n)*time.Millisecond, e.prog, "drain "+lane)
		cpu1, err := cpuTime(os.Getpid())
		svc.stop()
		if werr != nil {
			return 0, 0, werr
		}
		var perJob time.Duration
		if cerr == nil && err == nil {
			perJob = (cpu1 - cpu0) / time.Duration(n)
		}
		arrivals, _ := sk.snapshot()
		return pacingOf(arrivals, 0).Achieved, perJob, nil
	}
	var plainRate, destRate float64
	var plainCPU, destCPU []time.Duration
	var runs []string
	for i, lane := range order {
		r, cpu, err := drain(lane)
		if err != nil {
			return Result{}, err
		}
		if i%2 == 1 {
			destRate = max(destRate, r)
			destCPU = append(destCPU, cpu)
			runs = append(runs, "with "+fmtRate(r)+" ("+fmtCPU(cpu)+" CPU/job)")
		} else {
			plainRate = max(plainRate, r)
			plainCPU = append(plainCPU, cpu)
			runs = append(runs, "plain "+fmtRate(r)+" ("+fmtCPU(cpu)+" CPU/job)")
		}
	}
	cpuNote := ""
	if p, d := medianDuration(plainCPU), medianDuration(destCPU); p > 0 && d > 0 {
		cpuNote = fmt.Sprintf("; CPU per job (median): plain %s, with %s, a CPU-bound ratio of %.2f×", fmtCPU(p), fmtCPU(d), float64(p)/float64(d))
	}
	return Result{
		ID: Drain, Scenario: "drain, 1 lane → sink: jobs/s, each job with Throttle-Path + 2 Throttle-Forward headers (vs plain jobs)",
		Ours:      fmt.Sprintf("%s (%s jobs; best of %d)", fmtRate(destRate), fmtInt(int64(n)), rounds),
		Reference: fmtRate(plainRate),
		Ratio:     fmtRatio(destRate, plainRate),
		Goal:      "≥ 0.90×",
		Verdict:   verdict(destRate >= 0.9*plainRate),
		Note: "both lanes list GET and forward X-Api-Key and Accept; the jobs are published on the lane's subject, so the path and headers are checked " +
			"against the lane's lists at each delivery and the request goes to <base>/items/<i>?page=2; runs in order: " + strings.Join(runs, ", ") + cpuNote,
	}, nil
}

// publishDest stores n jobs on subject; with dest, each asks for a path
// and forwards two headers.
func publishDest(ctx context.Context, js jetstream.JetStream, subject string, n int, dest bool) error {
	_, err := publishWindowed(ctx, js, subject, n, drainPayload, false, false, nil, func(i int, m *nats.Msg) {
		if dest {
			m.Header["Throttle-Path"] = []string{"items/" + strconv.Itoa(i) + "?page=2"}
			m.Header["Throttle-Forward-X-Api-Key"] = []string{"k-0123456789abcdef"}
			m.Header["Throttle-Forward-Accept"] = []string{"application/json"}
		}
	})
	return err
}

// postDest is post with a Throttle-Method, a Throttle-Path and two
// Throttle-Forward headers.
func postDest(ctx context.Context, c *http.Client, url string, body []byte, i int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Throttle-Method", "GET")
	req.Header.Set("Throttle-Path", "items/"+strconv.Itoa(i)+"?page=2")
	req.Header.Set("Throttle-Forward-X-Api-Key", "k-0123456789abcdef")
	req.Header.Set("Throttle-Forward-Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

// keyedURLs stores 10,000 receivers' own URLs (200 with --smoke) on a
// keyed lane of a throttler process, by PATCH …/keys/{key} with a url, a
// header and a rate each, and reports what one receiver costs: the
// process's RSS growth and the THROTTLER_LIMITS bucket's bytes in
// JetStream, per receiver.
func (e *env) keyedURLs(ctx context.Context, sk *sink) (Result, error) {
	n := 10_000
	if e.cfg.Smoke {
		n = 200
	}
	name := fmt.Sprintf("keyed lane, %s receivers' URLs stored (PATCH …/keys/{key}: url, 1 header, rate): RSS and KV bytes per receiver", fmtInt(int64(n)))
	lane := e.lane("keyurls")
	lo := laneOpts{rate: 1000, burst: 1, inflight: 64, backlog: 1000, perKey: &perKeyOpts{rate: 1, burst: 1},
		jobURLs: []string{sk.URL + "/r/"}, forward: []string{"X-Api-Key"}}
	k, err := e.startKeyedEnv(ctx, "keyurls", "", sk, lane, lo)
	if err != nil {
		return Result{}, err
	}
	defer k.close()
	c, err := e.startChild(ctx, k.dir, k.opts)
	if err != nil {
		return Result{}, err
	}
	defer c.stop()
	client := newClient(16)
	defer client.CloseIdleConnections()
	patch := func(body string, i int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPatch, "http://"+c.listen+"/v1/lanes/"+lane+"/keys/"+keyName(i), strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("bench: PATCH key %d: status %d: %s", i, resp.StatusCode, b)
		}
		return nil
	}
	before, err := readStatus(c.pid())
	if err != nil {
		return Result{}, err
	}
	// 16 at a time: PATCHes are admin calls, each a KV put.
	work := make(chan int)
	errc := make(chan error, 16)
	for range 16 {
		go func() {
			var first error
			for i := range work {
				if first == nil {
					first = patch(fmt.Sprintf(`{"url":%q,"headers":{"X-Api-Key":"key-%06d-0123456789abcdef"},"rate":"2/s"}`, sk.URL+"/r/"+keyName(i), i), i)
				}
			}
			errc <- first
		}()
	}
	start := time.Now()
	for i := range n {
		if i%500 == 0 {
			e.prog.set("PATCH receivers' URLs", i, n)
		}
		work <- i
	}
	close(work)
	for range 16 {
		if err := <-errc; err != nil {
			return Result{}, c.fail(err)
		}
	}
	took := time.Since(start)
	after, err := readStatus(c.pid())
	if err != nil {
		return Result{}, err
	}
	st, err := k.js.Stream(ctx, "KV_"+queue.LimitsBucket)
	if err != nil {
		return Result{}, fmt.Errorf("bench: limits bucket: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("bench: limits bucket: %w", err)
	}
	rssPer := float64(after.rss-before.rss) / float64(n)
	kvPer := float64(info.State.Bytes) / float64(n)
	return Result{
		ID: Keyed, Scenario: name,
		Ours:      fmt.Sprintf("RSS +%.0f B per receiver (%s → %s) · KV %.0f B per receiver (%s msgs, %s bytes)", rssPer, fmtMB(before.rss), fmtMB(after.rss), kvPer, fmtInt(int64(info.State.Msgs)), fmtInt(int64(info.State.Bytes))),
		Reference: "—", Ratio: "—", Goal: "—", Verdict: NoGoal,
		Note: fmt.Sprintf("one throttler process, memory pacer, no job queued; the RSS growth includes the Go heap's headroom; %s PATCHes in %s (16 at a time)", fmtInt(int64(n)), fmtDur(took)),
	}, nil
}
