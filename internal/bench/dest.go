package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
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

// destPairs is how many plain and destination drains the destination row
// pairs up, each of half the drain rows' job count; smokePairs with
// --smoke, where the figures mean nothing.
const (
	destPairs  = 8
	smokePairs = 2
)

// drainDest drains plain jobs and jobs with a Throttle-Path and two
// Throttle-Forward headers each, n of each kind in all, on lanes that
// differ in nothing else.
//
// On the shared 2-core machine one drain's rate moves by a third from run
// to run with the neighbours' load, so the comparison is made to be fair
// under it: a warm-up drain of plain jobs first (the first drain after the
// backlogs are written pays for the cold page cache and the first
// connections, and counted for neither side), then destPairs pairs of
// n/2 jobs a drain (smokePairs with --smoke), each pair's two drains back to back, in ABBA order
// (plain, with; with, plain; …) so that a drift of the load over the run
// favours neither side; short drains in many pairs keep a pair's two
// drains close in time, under much the same load. The row's ratio is the
// median of the pairs' ratios; beside it, this process's CPU time per job
// (the service, its NATS server and the sink) from the tenth job to the
// last of each drain, which leaves out the service's start and stop and
// moves much less with the load than a rate.
func (e *env) drainDest(ctx context.Context, sk *sink, n int) (Result, error) {
	per := max(n/2, 10)
	// 128 MiB per stream holds 50,000 jobs with their headers many times
	// over; the default 1 GiB each would reserve 17 GiB of disk.
	lo := laneOpts{rate: bucket.MaxRate, burst: 1, inflight: drainInflight, backlog: int64(2 * per), maxBytes: 128 << 20}
	warm := e.lane("destwarm")
	lanes := map[string]laneOpts{warm: lo}
	type pair struct{ plain, dest string }
	np := destPairs
	if e.cfg.Smoke {
		np = smokePairs
	}
	pairs := make([]pair, np)
	for r := range pairs {
		pairs[r] = pair{e.lane("destplain" + strconv.Itoa(r)), e.lane("dest" + strconv.Itoa(r))}
		lanes[pairs[r].plain], lanes[pairs[r].dest] = lo, lo
	}
	warmN := max(per/5, 1)
	cfg, err := e.serviceConfig(svcOpts{dataDir: e.dir("dest"), target: sk.URL, lanes: lanes})
	if err != nil {
		return Result{}, err
	}
	withDest(&cfg, slices.Collect(maps.Keys(lanes))...)
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	svc.stop()
	if err := e.withNATS(ctx, cfg.NATS.DataDir, func(js jetstream.JetStream) error {
		if err := publishDest(ctx, js, queue.Subject(warm, ""), warmN, false); err != nil {
			return err
		}
		for _, p := range pairs {
			if err := publishDest(ctx, js, queue.Subject(p.plain, ""), per, false); err != nil {
				return err
			}
			if err := publishDest(ctx, js, queue.Subject(p.dest, ""), per, true); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return Result{}, err
	}
	// drain returns the lane's rate and this process's CPU time per job
	// from the tenth job to the last (0 when /proc cannot tell).
	drain := func(lane string, n int) (float64, time.Duration, error) {
		c := cfg
		c.Lanes = nil
		for _, l := range cfg.Lanes {
			if l.Name == lane {
				c.Lanes = []config.Lane{l}
			}
		}
		sk.reset(n)
		svc, err := e.startService(ctx, c)
		if err != nil {
			return 0, 0, err
		}
		wait := 2*e.dur + time.Duration(n)*time.Millisecond
		werr := sk.wait(ctx, min(10, n), wait, e.prog, "drain "+lane)
		got0 := sk.count.Load()
		cpu0, cerr := selfCPU()
		if werr == nil {
			werr = sk.wait(ctx, n, wait, e.prog, "drain "+lane)
		}
		cpu1, err := selfCPU()
		got1 := sk.count.Load()
		svc.stop()
		if werr != nil {
			return 0, 0, werr
		}
		var perJob time.Duration
		if cerr == nil && err == nil && got1 > got0 {
			perJob = (cpu1 - cpu0) / time.Duration(got1-got0)
		}
		arrivals, _ := sk.snapshot()
		return pacingOf(arrivals, 0).Achieved, perJob, nil
	}
	if _, _, err := drain(warm, warmN); err != nil {
		return Result{}, err
	}
	var plainRates, destRates, ratios []float64
	var plainCPU, destCPU []time.Duration
	var runs []string
	for i, p := range pairs {
		first, second := p.plain, p.dest
		if i%2 == 1 {
			first, second = p.dest, p.plain
		}
		var rate [2]float64
		var cpu [2]time.Duration
		for k, lane := range []string{first, second} {
			if rate[k], cpu[k], err = drain(lane, per); err != nil {
				return Result{}, err
			}
		}
		pr, dr, pc, dc := rate[0], rate[1], cpu[0], cpu[1]
		if i%2 == 1 {
			pr, dr, pc, dc = dr, pr, dc, pc
		}
		plainRates, destRates, ratios = append(plainRates, pr), append(destRates, dr), append(ratios, dr/pr)
		plainCPU, destCPU = append(plainCPU, pc), append(destCPU, dc)
		runs = append(runs, fmt.Sprintf("plain %s (%s CPU/job), with %s (%s) = %.2f×", fmtRate(pr), fmtCPU(pc), fmtRate(dr), fmtCPU(dc), dr/pr))
	}
	ratio := medianFloat(ratios)
	ours := fmt.Sprintf("%s (%s jobs a drain; median of %d)", fmtRate(medianFloat(destRates)), fmtInt(int64(per)), len(pairs))
	ref := fmtRate(medianFloat(plainRates))
	cpuNote := ""
	if p, d := medianDuration(plainCPU), medianDuration(destCPU); p > 0 && d > 0 {
		ours += "; CPU " + fmtCPU(d) + "/job"
		ref += "; CPU " + fmtCPU(p) + "/job"
		cpuNote = fmt.Sprintf("; CPU per job (median, tenth job to last): plain %s, with %s, a CPU-bound ratio of %.2f×", fmtCPU(p), fmtCPU(d), float64(p)/float64(d))
	}
	return Result{
		ID: Drain, Scenario: "drain, 1 lane → sink: jobs/s, each job with Throttle-Path + 2 Throttle-Forward headers (vs plain jobs)",
		Ours:      ours,
		Reference: ref,
		Ratio:     strconv.FormatFloat(ratio, 'f', 2, 64) + "×",
		Goal:      "≥ 0.90×",
		Verdict:   verdict(ratio >= 0.9),
		Note: "both lanes list GET and forward X-Api-Key and Accept; the jobs are published on the lane's subject, so the path and headers are checked " +
			"against the lane's lists at each delivery and the request goes to <base>/items/<i>?page=2; after a warm-up drain, pairs drained back to back in ABBA order, " +
			"the ratio is the median of the pairs' ratios: " + strings.Join(runs, "; ") + cpuNote,
	}, nil
}

// medianFloat is the median of xs (the mean of the middle two of an even
// count); 0 for none.
func medianFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if m := len(s) / 2; len(s)%2 == 0 {
		return (s[m-1] + s[m]) / 2
	}
	return s[len(s)/2]
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
