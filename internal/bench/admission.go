package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/quota/redisquota"
)

// admissionGoroutines is the number of concurrent deciders on each side.
const admissionGoroutines = 64

// noBacklog is an empty backlog: in the service the count comes from a
// JetStream figure cached for 250 ms, so it costs nothing per decision.
type noBacklog struct{}

func (noBacklog) Backlog(context.Context, string, time.Duration) (int64, error) { return 0, nil }

// runAdmission: admission decisions/s (admission.Admitter over the Redis
// store, on the autopipelined client the service uses) against
// go-redis/redis_rate Allow on a plain client to the same Redis, 64
// goroutines on 64 keys each, with limits so high that every decision
// admits; and redis_rate on the autopipeliner too, for the record.
func runAdmission(ctx context.Context, e *env) ([]Result, error) {
	const goal = "≥ 1.50×"
	name := fmt.Sprintf("admission decisions/s, Redis store, %d goroutines (vs redis_rate Allow)", admissionGoroutines)
	url, skip, err := e.redis()
	if err != nil {
		return nil, err
	}
	if skip != "" {
		return []Result{skipRow(Admission, name, goal, skip)}, nil
	}
	client := func() (*redis.Client, error) {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, err
		}
		// The service's options, with a pool as large as the callers so
		// that the figure is Redis and not pool waits.
		opt.ContextTimeoutEnabled = true
		opt.PoolSize = admissionGoroutines
		return redis.NewClient(opt), nil
	}
	c1, err := client()
	if err != nil {
		return nil, err
	}
	defer c1.Close()
	c2, err := client()
	if err != nil {
		return nil, err
	}
	defer c2.Close()
	// The store as the service builds it: go-redis's autopipeliner over the
	// client, so that concurrent calls share round trips.
	pipe, err := c1.AutoPipeline()
	if err != nil {
		return nil, fmt.Errorf("bench: redis: %w", err)
	}
	defer pipe.Close()
	lanesStore := redisbucket.New(pipe, redisbucket.DefaultConfig())
	adm, err := admission.New(admission.Config{Store: lanesStore, Backlog: noBacklog{}})
	if err != nil {
		return nil, err
	}
	lim := bucket.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst}
	lanes := make([]admission.Lane, admissionGoroutines)
	keys := make([]string, admissionGoroutines)
	for i := range lanes {
		lanes[i] = admission.Lane{Name: "bench-" + e.run + "-adm-" + strconv.Itoa(i), Limit: lim, MaxBacklog: 1 << 40}
		keys[i] = "bench-" + e.run + "-rr-" + strconv.Itoa(i)
	}
	rl := redis_rate.NewLimiter(c2)
	rlim := redis_rate.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst, Period: time.Second}

	decide := func(ctx context.Context, w, _ int) error {
		d, err := adm.Decide(ctx, lanes[w], "")
		if err == nil && d.Degraded {
			err = fmt.Errorf("decision degraded (store unavailable)")
		}
		return err
	}
	allow := func(ctx context.Context, w, _ int) error {
		_, err := rl.Allow(ctx, keys[w], rlim)
		return err
	}
	maxOps := 10_000_000
	closedLoop(ctx, admissionGoroutines, min(e.dur/5, time.Second), maxOps, e.prog, "warm-up", decide)
	closedLoop(ctx, admissionGoroutines, min(e.dur/5, time.Second), maxOps, e.prog, "warm-up redis_rate", allow)
	rounds := 3
	if e.cfg.Smoke {
		rounds = 1
	}
	var bestOurs, bestRef loadResult
	for r := range rounds {
		o := closedLoop(ctx, admissionGoroutines, e.dur, maxOps, e.prog, fmt.Sprintf("ours round %d/%d", r+1, rounds), decide)
		if o.Err != nil {
			return nil, fmt.Errorf("bench: admission: %w", o.Err)
		}
		if o.Rate() > bestOurs.Rate() {
			bestOurs = o
		}
		f := closedLoop(ctx, admissionGoroutines, e.dur, maxOps, e.prog, fmt.Sprintf("redis_rate round %d/%d", r+1, rounds), allow)
		if f.Err != nil {
			return nil, fmt.Errorf("bench: admission reference: %w", f.Err)
		}
		if f.Rate() > bestRef.Rate() {
			bestRef = f
		}
	}
	// The same library on the autopipeliner, to tell what the client gives
	// from what the scripts give.
	rlp := redis_rate.NewLimiter(pipe)
	piped := closedLoop(ctx, admissionGoroutines, e.dur, maxOps, e.prog, "redis_rate on the autopipeliner", func(ctx context.Context, w, _ int) error {
		_, err := rlp.Allow(ctx, keys[w], rlim)
		return err
	})
	if piped.Err != nil {
		return nil, fmt.Errorf("bench: admission reference on the autopipeliner: %w", piped.Err)
	}
	// Both caller quota layers in front of the same admission, as a
	// single job's submission makes them: one script checks the per-IP
	// window and the plan bucket and peeks the lane's state, and the
	// lane's decision is made on that peek. Each goroutine is its own
	// client IP and key, with limits so high that every check admits.
	quotas := redisquota.New(pipe, redisquota.Config{Prefix: "bench-" + e.run, Lanes: lanesStore})
	reqs := make([]quota.Request, admissionGoroutines)
	for i := range reqs {
		reqs[i] = quota.Request{IP: "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256), PerIP: quota.Window{Limit: 1_000_000_000, Length: time.Hour},
			Caller: "key:bench-" + strconv.Itoa(i), Plan: lim, Cost: 1, Lane: bucket.Key{Lane: lanes[i].Name}, LaneLimit: lim}
	}
	both := func(ctx context.Context, w, i int) error {
		res, err := quotas.Check(ctx, reqs[w])
		switch {
		case err != nil:
			return err
		case !res.IP.Allowed || !res.Plan.Allowed:
			return fmt.Errorf("caller quota refused: %+v", res)
		case !res.LaneChecked:
			return fmt.Errorf("the lane was not peeked with the caller quotas")
		}
		d, err := adm.DecideFrom(ctx, lanes[w], admission.Peeked{D: res.Lane, At: time.Now()}, time.Now())
		if err == nil && d.Degraded {
			err = fmt.Errorf("decision degraded (store unavailable)")
		}
		return err
	}
	// The same layers in a script of their own before the lane's peek: two
	// round trips, as for a batch and on Redis Cluster.
	separate := redisquota.New(pipe, redisquota.Config{Prefix: "bench-" + e.run + "-sep"})
	twoTrips := func(ctx context.Context, w, i int) error {
		r := reqs[w]
		r.Lane = bucket.Key{}
		res, err := separate.Check(ctx, r)
		if err == nil && (!res.IP.Allowed || !res.Plan.Allowed) {
			err = fmt.Errorf("caller quota refused: %+v", res)
		}
		if err != nil {
			return err
		}
		return decide(ctx, w, i)
	}
	closedLoop(ctx, admissionGoroutines, min(e.dur/5, time.Second), maxOps, e.prog, "warm-up caller quotas", both)
	closedLoop(ctx, admissionGoroutines, min(e.dur/5, time.Second), maxOps, e.prog, "warm-up caller quotas, two round trips", twoTrips)
	var bestBoth, bestLane, bestTwo loadResult
	for r := range rounds {
		o := closedLoop(ctx, admissionGoroutines, e.dur, maxOps, e.prog, fmt.Sprintf("caller quotas + lane round %d/%d", r+1, rounds), both)
		if o.Err != nil {
			return nil, fmt.Errorf("bench: admission with caller quotas: %w", o.Err)
		}
		if o.Rate() > bestBoth.Rate() {
			bestBoth = o
		}
		l := closedLoop(ctx, admissionGoroutines, e.dur, maxOps, e.prog, fmt.Sprintf("lane only round %d/%d", r+1, rounds), decide)
		if l.Err != nil {
			return nil, fmt.Errorf("bench: admission: %w", l.Err)
		}
		if l.Rate() > bestLane.Rate() {
			bestLane = l
		}
		o2 := closedLoop(ctx, admissionGoroutines, e.dur, maxOps, e.prog, fmt.Sprintf("caller quotas, then the lane round %d/%d", r+1, rounds), twoTrips)
		if o2.Err != nil {
			return nil, fmt.Errorf("bench: admission with caller quotas in two round trips: %w", o2.Err)
		}
		if o2.Rate() > bestTwo.Rate() {
			bestTwo = o2
		}
	}
	const quotaGoal = "≤ 1.30×"
	return []Result{{
		ID: Admission, Scenario: name,
		Ours:      fmt.Sprintf("%s (%s)", fmtRate(bestOurs.Rate()), fmtLat(bestOurs.Lat)),
		Reference: fmt.Sprintf("%s (%s)", fmtRate(bestRef.Rate()), fmtLat(bestRef.Lat)),
		Ratio:     fmtRatio(bestOurs.Rate(), bestRef.Rate()),
		Goal:      goal,
		Verdict:   verdict(bestOurs.Rate() >= 1.5*bestRef.Rate()),
		Note: fmt.Sprintf("ours runs on go-redis's autopipeliner as in the service, redis_rate on a plain client with a pool of %d as its docs show; "+
			"redis_rate on the same autopipeliner makes %s (%s)", admissionGoroutines, fmtRate(piped.Rate()), fmtLat(piped.Lat)),
	}, {
		ID: Admission, Scenario: fmt.Sprintf("admission with both caller quota layers, Redis, %d goroutines (vs lane-only admission)", admissionGoroutines),
		Ours:      fmt.Sprintf("%s (%s)", fmtRate(bestBoth.Rate()), fmtLat(bestBoth.Lat)),
		Reference: fmt.Sprintf("%s (%s)", fmtRate(bestLane.Rate()), fmtLat(bestLane.Lat)),
		// The cost of the layers: how many times slower a decision is.
		Ratio:   fmtRatio(bestLane.Rate(), bestBoth.Rate()),
		Goal:    quotaGoal,
		Verdict: verdict(bestLane.Rate() <= 1.3*bestBoth.Rate()),
		Note: fmt.Sprintf("per-IP window, plan bucket and the lane's peek in one script (one round trip), then the lane's decision on that peek, as intake makes it for a single job; "+
			"that script calls four commands, two of them writes (the window's count, the plan's tat), where the lane-only peek calls two reads: "+
			"the least an exact check of both layers writes, and what bounds the ratio while redis-server's thread is the bottleneck (docs/BENCHMARKS.md); "+
			"the ratio is lane-only decisions/s over decisions/s with both layers; in two round trips (the layers' script, then the lane's peek: batches, Redis Cluster) "+
			"the same rounds made %s (%s), %s", fmtRate(bestTwo.Rate()), fmtLat(bestTwo.Lat), fmtRatio(bestLane.Rate(), bestTwo.Rate())),
	}}, nil
}
