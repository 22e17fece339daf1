package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
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
	drain := func(lane string) (float64, error) {
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
			return 0, err
		}
		werr := sk.wait(ctx, n, 2*e.dur+time.Duration(n)*time.Millisecond, e.prog, "drain "+lane)
		svc.stop()
		if werr != nil {
			return 0, werr
		}
		arrivals, _ := sk.snapshot()
		return pacingOf(arrivals, 0).Achieved, nil
	}
	var plainRate, destRate float64
	var runs []string
	for i, lane := range order {
		r, err := drain(lane)
		if err != nil {
			return Result{}, err
		}
		if i%2 == 1 {
			destRate = max(destRate, r)
			runs = append(runs, "with "+fmtRate(r))
		} else {
			plainRate = max(plainRate, r)
			runs = append(runs, "plain "+fmtRate(r))
		}
	}
	return Result{
		ID: Drain, Scenario: "drain, 1 lane → sink: jobs/s, each job with Throttle-Path + 2 Throttle-Forward headers (vs plain jobs)",
		Ours:      fmt.Sprintf("%s (%s jobs; best of %d)", fmtRate(destRate), fmtInt(int64(n)), rounds),
		Reference: fmtRate(plainRate),
		Ratio:     fmtRatio(destRate, plainRate),
		Goal:      "≥ 0.90×",
		Verdict:   verdict(destRate >= 0.9*plainRate),
		Note: "both lanes list GET and forward X-Api-Key and Accept; the jobs are published on the lane's subject, so the path and headers are checked " +
			"against the lane's lists at each delivery and the request goes to <base>/items/<i>?page=2; runs in order: " + strings.Join(runs, ", "),
	}, nil
}

// publishDest stores n jobs on subject; with dest, each asks for a path
// and forwards two headers.
func publishDest(ctx context.Context, js jetstream.JetStream, subject string, n int, dest bool) error {
	futures := make([]jetstream.PubAckFuture, 0, publishWindow)
	for i := range n {
		m := nats.NewMsg(subject)
		m.Data = drainPayload
		if dest {
			m.Header["Throttle-Path"] = []string{"items/" + strconv.Itoa(i) + "?page=2"}
			m.Header["Throttle-Forward-X-Api-Key"] = []string{"k-0123456789abcdef"}
			m.Header["Throttle-Forward-Accept"] = []string{"application/json"}
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("bench: publish to %s: %w", subject, err)
		}
		futures = append(futures, f)
		if len(futures) == cap(futures) || i == n-1 {
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					return fmt.Errorf("bench: publish to %s: %w", subject, err)
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			futures = futures[:0]
		}
	}
	return nil
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
