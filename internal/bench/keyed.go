package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
)

// maxKeys bounds Config.Keys.
const maxKeys = 1_000_000

// Keyed lane settings of the drain runs: every key at 10/s (each key's
// state then lives a tenth of a second in Redis), the lane uncapped, 64 in
// flight. Not 1/s: 10,000 keys at 1/s cap the lane at 10,000 jobs/s, the
// pace itself, below what a plain lane drains on two idle cores (26,220/s),
// so the row measured the configured pace rather than the drain (9,960/s
// at 1/s, 17,151/s at 10/s, same machine and hour). The one-key reference
// runs its key uncapped instead, or it would measure the key's rate. With
// --smoke every key runs at keyedSmokeKeyRate: at 10/s the drains would
// wait in real time for
// figures that mean nothing (300 jobs on 20 keys take 15 s per pacer, and
// the Redis run's drain to the end as many seconds as jobs per key), while
// at 100/s the same code paths run (keys paced, claimed, released, their
// states expired) in a fraction of a second.
const (
	keyedKeyRate      = 10
	keyedSmokeKeyRate = 100
	keyedInflight     = 64
	// keyedIdleMax is the largest backlog the Redis run drains to the end
	// to measure idle keys (at 10/s per key, it takes a tenth of a second
	// per job of a key, or as long as the jobs take at the machine's pace).
	keyedIdleMax = 30_000
)

// Cold key runs: the hot key's backlog, the keys' rate, how many cold keys.
const (
	coldHotBacklog = 100_000
	coldKeyRate    = 100
	coldKeys       = 20
)

// runKeyed: what a keyed lane costs end to end. A throttler process (the
// real binary, so that its memory and CPU are its own) on a nats-server of
// the bench's own drains a keyed lane whose N keys each hold a backlog into
// the sink, with the memory pacer and with the Redis pacer; N is 1 (the
// reference) and each of Config.keys(). Per run: jobs/s at the sink over
// the first 10,000 jobs (300 with --smoke), the process's CPU time per job
// over the same jobs (/proc/<pid>/stat: all it does for a job, the key
// choice, the direct get, the reservation, the POST and the delete), its
// VmRSS then, and on Redis the used_memory per active key then and per idle
// key once the keys drained and their states expired. Then the delay of a
// cold key's first job, from its 202 to its arrival, behind a hot key with
// 100,000 jobs queued, against the same without the backlog.
func runKeyed(ctx context.Context, e *env) ([]Result, error) {
	sizes := e.cfg.keys()
	measure := 10_000
	if e.cfg.Smoke {
		measure = 300
	}
	hot := coldHotBacklog
	if e.cfg.Smoke {
		hot = 2_000
	}
	name := func(n int, pacer string) string {
		return fmt.Sprintf("keyed lane, %s keys with backlog → sink, %s: jobs/s · CPU/job · RSS", fmtInt(int64(n)), pacer)
	}
	coldName := func(pacer string) string {
		return fmt.Sprintf("keyed lane, a cold key's first job behind a hot key's %s backlog (202 → sink), %s", fmtInt(int64(hot)), pacer)
	}
	var why string
	if e.cfg.Binary == "" {
		why = "skipped: no throttler binary to start (pass --throttler, or run throttler-bench inside the module)"
	} else if _, err := readStatus(os.Getpid()); err != nil {
		why = "skipped: cannot read process memory here: " + err.Error()
	} else if _, err := cpuTime(os.Getpid()); err != nil {
		why = "skipped: cannot read process CPU time here: " + err.Error()
	}
	if why != "" {
		var rows []Result
		for _, n := range sizes {
			rows = append(rows, skipRow(Keyed, name(n, "memory pacer"), "—", why))
		}
		return append(rows, skipRow(Keyed, coldName("memory pacer"), "—", why)), nil
	}
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	redisURL, skip, err := e.redis()
	if err != nil {
		return nil, err
	}
	pacers := []struct{ name, redis string }{{"memory pacer", ""}}
	if skip == "" {
		pacers = append(pacers, struct{ name, redis string }{"Redis pacer", redisURL})
	}
	var rows []Result
	for _, p := range pacers {
		plain, err := e.keyedDrain(ctx, sk, p.redis, 0, measure)
		if err != nil {
			return rows, err
		}
		rows = append(rows, plain.plainRow(p.name))
		ref, err := e.keyedDrain(ctx, sk, p.redis, 1, measure)
		if err != nil {
			return rows, err
		}
		rows = append(rows, ref.row(name(1, p.name), nil))
		var at10k *keyedFigure
		for _, n := range sizes {
			f, err := e.keyedDrain(ctx, sk, p.redis, n, measure)
			if err != nil {
				return rows, err
			}
			rows = append(rows, f.row(name(n, p.name), &ref))
			if p.redis != "" {
				rows = append(rows, f.redisRow())
			}
			if n == 10_000 {
				at10k = &f
			}
		}
		if at10k != nil {
			rows = append(rows, at10k.vsPlain(plain, p.name, p.redis != ""))
			ratio := at10k.cpuPerJob.Seconds() / ref.cpuPerJob.Seconds()
			rows = append(rows, Result{
				ID: Keyed, Scenario: "keyed lane, scheduling cost per job at 10,000 keys vs 1 key, " + p.name,
				Ours:      fmt.Sprintf("%s CPU/job", fmtDur(at10k.cpuPerJob)),
				Reference: fmt.Sprintf("%s CPU/job (1 key)", fmtDur(ref.cpuPerJob)),
				Ratio:     strconv.FormatFloat(ratio, 'f', 2, 64) + "×",
				Goal:      "≤ 2.00×", Verdict: verdict(ratio <= 2),
				Note: "the throttler process's CPU time per dispatched job (/proc/<pid>/stat), all of its work for a job; " +
					"the key choice alone is BenchmarkSchedChoose (internal/keyed)",
			})
		}
		if p.redis == "" {
			row, err := e.keyedURLs(ctx, sk)
			if err != nil {
				return rows, err
			}
			rows = append(rows, row)
		}
		row, err := e.keyedCold(ctx, sk, p.redis, hot, coldName(p.name))
		if err != nil {
			return rows, err
		}
		rows = append(rows, row)
	}
	if skip != "" {
		rows = append(rows, skipRow(Keyed, "keyed lane, Redis pacer", "—", skip))
	}
	return rows, nil
}

// keyedFigure is what one keyed drain measured.
type keyedFigure struct {
	pacer      string
	keys, jobs int     // keys, jobs measured
	keyRate    float64 // every key's rate in the runs with more than one key
	backlog    int     // jobs stored before the start
	fill       time.Duration
	firstAfter time.Duration // start of the process to its first arrival
	rate       float64
	cpuPerJob  time.Duration
	missed     int64 // slots given up by then (throttler_slots_missed_total)
	// Calls per job over the measured jobs: Redis commands the process
	// sent (INFO commandstats, scripts counted once), and messages it sent
	// to the nats-server (direct gets, deletes, fetches, acks: Varz in_msgs).
	redisCalls, natsMsgs float64
	rss, hwm             int64
	// Redis pacer only: used_memory growth per key with every key active
	// (and the Redis keys of the lane then: claims, key states), and per
	// key once every key drained and went idle (idleNote says why not).
	redisActive         float64
	claims, states      int64
	redisIdle           float64
	idleLeft            int64
	idleMeasured        bool
	idleNote, idleAfter string
}

// keyedKeyRate is every key's rate in the drain runs (see keyedKeyRate).
func (e *env) keyedKeyRate() float64 {
	if e.cfg.Smoke {
		return keyedSmokeKeyRate
	}
	return keyedKeyRate
}

func (f keyedFigure) row(name string, ref *keyedFigure) Result {
	r := Result{
		ID: Keyed, Scenario: name,
		Ours: fmt.Sprintf("%s · %s CPU/job · RSS %s (peak %s) · first job %s after exec",
			fmtRate(f.rate), fmtDur(f.cpuPerJob), fmtMB(f.rss), fmtMB(f.hwm), fmtDur(f.firstAfter)),
		Reference: "—", Ratio: "—", Goal: "— (measured)", Verdict: NoGoal,
		Note: fmt.Sprintf("%s jobs stored on %s keys before the start (%s); figures over the first %s jobs at the sink; %d slots given up (woken too late)",
			fmtInt(int64(f.backlog)), fmtInt(int64(f.keys)), fmtRate(rate(f.backlog, f.fill)), fmtInt(int64(f.jobs)), f.missed),
	}
	if ref != nil {
		r.Reference = fmt.Sprintf("1 key: %s · %s CPU/job", fmtRate(ref.rate), fmtDur(ref.cpuPerJob))
		r.Ratio = fmtRatio(f.cpuPerJob.Seconds(), ref.cpuPerJob.Seconds()) + " CPU/job"
	} else {
		r.Note += "; the reference of the rows below: its key is uncapped, theirs run at " + fmtRate(f.keyRate) + " each"
	}
	return r
}

// callsNote says the calls per job of f.
func (f keyedFigure) callsNote() string {
	c := fmt.Sprintf("%.2f NATS msgs/job", f.natsMsgs)
	if f.pacer == "redis" {
		c = fmt.Sprintf("%.2f Redis calls/job · ", f.redisCalls) + c
	}
	return c
}

// plainRow is the row of the plain lane drained the same way (keys 0).
func (f keyedFigure) plainRow(pacer string) Result {
	return Result{
		ID: Keyed, Scenario: "plain lane (no per_key) with backlog → sink, same process and sink, " + pacer + ": jobs/s · CPU/job · calls/job",
		Ours:      fmt.Sprintf("%s · %s CPU/job · %s", fmtRate(f.rate), fmtDur(f.cpuPerJob), f.callsNote()),
		Reference: "—", Ratio: "—", Goal: "— (measured)", Verdict: NoGoal,
		Note: fmt.Sprintf("the reference of the keyed rows below: %s jobs stored before the start, figures over the first %s at the sink, lane uncapped, max_inflight %d",
			fmtInt(int64(f.backlog)), fmtInt(int64(f.jobs)), keyedInflight),
	}
}

// vsPlain compares a keyed drain with the plain drain of the same run:
// jobs/s at least 0.5× (Redis pacer) or 0.7× (memory pacer), CPU per job
// at most 2×.
func (f keyedFigure) vsPlain(plain keyedFigure, pacer string, redis bool) Result {
	goal := 0.7
	if redis {
		goal = 0.5
	}
	speed := f.rate / plain.rate
	cpu := f.cpuPerJob.Seconds() / plain.cpuPerJob.Seconds()
	return Result{
		ID: Keyed, Scenario: fmt.Sprintf("keyed drain vs plain drain, %s keys, %s: jobs/s · CPU/job · calls/job", fmtInt(int64(f.keys)), pacer),
		Ours:      fmt.Sprintf("%s · %s CPU/job · %s", fmtRate(f.rate), fmtDur(f.cpuPerJob), f.callsNote()),
		Reference: fmt.Sprintf("plain: %s · %s CPU/job · %s", fmtRate(plain.rate), fmtDur(plain.cpuPerJob), plain.callsNote()),
		Ratio:     fmt.Sprintf("%.2f× jobs/s · %.2f× CPU/job", speed, cpu),
		Goal:      fmt.Sprintf("≥ %.2f× jobs/s · ≤ 2.00× CPU/job", goal),
		Verdict:   verdict(speed >= goal && cpu <= 2),
		Note:      "both drained by a throttler process of their own on the same nats-server, sink and Redis, one after the other",
	}
}

func (f keyedFigure) redisRow() Result {
	r := Result{
		ID: Keyed, Scenario: fmt.Sprintf("keyed lane, Redis memory per active key · per idle key, %s keys", fmtInt(int64(f.keys))),
		Ours: fmt.Sprintf("%s B per active key (%s claims, %s key states live)",
			strconv.FormatFloat(f.redisActive, 'f', 0, 64), fmtInt(f.claims), fmtInt(f.states)),
		Reference: "—", Ratio: "—", Goal: "idle: no Redis key left", Verdict: NoGoal,
	}
	if f.idleMeasured {
		r.Ours += fmt.Sprintf(" · %s B per idle key (%s Redis keys left, %s after the last job)",
			strconv.FormatFloat(f.redisIdle, 'f', 1, 64), fmtInt(f.idleLeft), f.idleAfter)
		r.Verdict = verdict(f.idleLeft == 0)
	} else {
		r.Ours += " · idle not measured"
		r.Note = f.idleNote
	}
	return r
}

// keyName is the i-th key of a run.
func keyName(i int) string { return fmt.Sprintf("customer-%06d", i) }

// keyedDrain runs one keyed drain of n keys: see runKeyed. With n 0 it
// drains a plain lane (no per_key) the same way: the reference.
func (e *env) keyedDrain(ctx context.Context, sk *sink, redisURL string, n, measure int) (keyedFigure, error) {
	f := keyedFigure{pacer: "memory", keys: n, jobs: measure, keyRate: e.keyedKeyRate()}
	if redisURL != "" {
		f.pacer = "redis"
	}
	// Every key keeps jobs until the measured ones arrived (2 more each).
	perKey := max(2, (measure+max(n, 1)-1)/max(n, 1)+2)
	if n <= 1 {
		perKey = measure + 2
	}
	f.backlog = max(n, 1) * perKey
	keyRate := e.keyedKeyRate()
	if n == 1 {
		keyRate = bucket.MaxRate
	}
	lane := e.lane(fmt.Sprintf("keyed-%s-%d", f.pacer, n))
	lo := laneOpts{rate: bucket.MaxRate, burst: 1, inflight: keyedInflight, backlog: int64(2 * f.backlog),
		perKey: &perKeyOpts{rate: keyRate, burst: 1}}
	subject := func(i int) string { return queue.InternalSubject(lane, keyName(i%n)) }
	if n == 0 {
		lo.perKey = nil
		subject = func(int) string { return queue.InternalSubject(lane, "") }
	}
	k, err := e.startKeyedEnv(ctx, fmt.Sprintf("keyed-%d", n), redisURL, sk, lane, lo)
	if err != nil {
		return f, err
	}
	defer k.close()

	// The stream exists (the first start made it): store the backlog on
	// the keys' internal subjects, as the intake does, a round of keys at a
	// time so that every key has jobs from the start.
	start := time.Now()
	err = publishSubjects(ctx, k.js, f.backlog, subject,
		drainPayload, func(d int) { e.prog.set(fmt.Sprintf("fill %s keys", fmtInt(int64(n))), d, f.backlog) })
	if err != nil {
		return f, err
	}
	f.fill = time.Since(start)

	var base float64
	if k.rdb != nil {
		if base, err = usedMemory(ctx, k.rdb); err != nil {
			return f, err
		}
	}
	sk.reset(f.backlog)
	start = time.Now()
	c, err := e.startChild(ctx, k.dir, k.opts)
	if err != nil {
		return f, err
	}
	defer c.stop()
	phase := fmt.Sprintf("drain %s keys, %s pacer", fmtInt(int64(n)), f.pacer)
	// The first job comes once the process swept the stream's subjects and
	// claimed every key.
	if err := sk.wait(ctx, 1, 5*time.Minute, e.prog, phase+" (start)"); err != nil {
		return f, c.fail(err)
	}
	t0 := time.Now()
	f.firstAfter = t0.Sub(start)
	a0 := int(sk.count.Load())
	cpu0, err := cpuTime(c.pid())
	if err != nil {
		return f, err
	}
	calls0, msgs0, err := k.calls(ctx)
	if err != nil {
		return f, err
	}
	// At keyRate per key, fewer keys than jobs to measure take
	// measure/n/keyRate s.
	timeout := 5*time.Minute + time.Duration(float64(measure)/float64(max(1, min(n, 1000)))/keyRate*float64(time.Second))
	if err := sk.wait(ctx, measure, timeout, e.prog, phase); err != nil {
		return f, c.fail(err)
	}
	t1 := time.Now()
	a1 := int(sk.count.Load())
	cpu1, err := cpuTime(c.pid())
	if err != nil {
		return f, err
	}
	calls1, msgs1, err := k.calls(ctx)
	if err != nil {
		return f, err
	}
	f.redisCalls = float64(calls1-calls0) / float64(max(1, a1-a0))
	f.natsMsgs = float64(msgs1-msgs0) / float64(max(1, a1-a0))
	mem, err := readStatus(c.pid())
	if err != nil {
		return f, err
	}
	f.rss, f.hwm = mem.rss, mem.hwm
	f.missed = c.missed(ctx, lane)
	f.rate = rate(a1-a0, t1.Sub(t0))
	f.cpuPerJob = (cpu1 - cpu0) / time.Duration(max(1, a1-a0))
	if k.rdb == nil || n == 0 {
		return f, nil
	}

	used, err := usedMemory(ctx, k.rdb)
	if err != nil {
		return f, err
	}
	f.redisActive = (used - base) / float64(n)
	if f.claims, f.states, err = laneRedisKeys(ctx, k.rdb, lane); err != nil {
		return f, err
	}
	if f.backlog > keyedIdleMax {
		f.idleNote = fmt.Sprintf("idle keys measured only where the backlog drains within a minute (≤ %s jobs): %s jobs at this machine's pace would take minutes",
			fmtInt(keyedIdleMax), fmtInt(int64(f.backlog)))
		return f, nil
	}
	// Drain to the end: every key goes idle, releases its claim, and its
	// state expires once its bucket is full again (100 ms at 10/s, 10 ms
	// at the smoke rate).
	if err := sk.wait(ctx, f.backlog, 5*time.Minute, e.prog, phase+" (to the end)"); err != nil {
		return f, c.fail(err)
	}
	last := time.Now()
	deadline := last.Add(30 * time.Second)
	for {
		claims, states, err := laneRedisKeys(ctx, k.rdb, lane)
		if err != nil {
			return f, err
		}
		f.idleLeft = claims + states
		if f.idleLeft == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return f, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	f.idleAfter = fmtDur(time.Since(last))
	if used, err = usedMemory(ctx, k.rdb); err != nil {
		return f, err
	}
	f.redisIdle = (used - base) / float64(n)
	f.idleMeasured = true
	return f, nil
}

// keyedCold measures a cold key's first job behind a hot key's backlog: the
// same HTTP submission of coldKeys fresh keys, first on the empty lane (the
// reference), then with hot jobs stored on one key that drains at its own
// rate meanwhile.
func (e *env) keyedCold(ctx context.Context, sk *sink, redisURL string, hot int, name string) (Result, error) {
	pacer := "memory"
	if redisURL != "" {
		pacer = "redis"
	}
	lane := e.lane("cold-" + pacer)
	lo := laneOpts{rate: bucket.MaxRate, burst: 1, inflight: keyedInflight, backlog: int64(2 * hot),
		perKey: &perKeyOpts{rate: coldKeyRate, burst: 1}}
	k, err := e.startKeyedEnv(ctx, "cold", redisURL, sk, lane, lo)
	if err != nil {
		return Result{}, err
	}
	defer k.close()
	client := newClient(1)
	defer client.CloseIdleConnections()

	// The reference: the empty lane.
	sk.reset(coldKeys)
	c, err := e.startChild(ctx, k.dir, k.opts)
	if err != nil {
		return Result{}, err
	}
	ref, refWhole, err := e.coldDelays(ctx, client, sk, c, lane, "ref-")
	c.stop()
	if err != nil {
		return Result{}, err
	}

	if err := publishSubjects(ctx, k.js, hot, func(int) string { return queue.InternalSubject(lane, "hot") },
		drainPayload, func(d int) { e.prog.set("fill the hot key", d, hot) }); err != nil {
		return Result{}, err
	}
	sk.reset(hot)
	if c, err = e.startChild(ctx, k.dir, k.opts); err != nil {
		return Result{}, err
	}
	defer c.stop()
	if err := sk.wait(ctx, 20, time.Minute, e.prog, "hot key draining"); err != nil {
		return Result{}, c.fail(err)
	}
	h0, t0 := sk.count.Load(), time.Now()
	got, gotWhole, err := e.coldDelays(ctx, client, sk, c, lane, "cold-")
	if err != nil {
		return Result{}, err
	}
	hotRate := rate(int(sk.count.Load()-h0)-coldKeys, time.Since(t0))
	missed := c.missed(ctx, lane)
	st, err := k.js.Stream(ctx, queue.StreamName(lane))
	if err != nil {
		return Result{}, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return Result{}, err
	}
	period := time.Second / coldKeyRate
	// "That key's own pacing plus a small constant": the first job of a
	// fresh key is due at once, so its delay is the reference's plus at
	// most one period of its own.
	const slack = 50 * time.Millisecond
	return Result{
		ID: Keyed, Scenario: name,
		Ours: fmt.Sprintf("p50 %s · max %s (%d fresh keys; the hot key meanwhile at %s, %s jobs still stored)",
			fmtDur(percentile(got, 50)), fmtDur(percentile(got, 100)), coldKeys, fmtRate(hotRate), fmtInt(int64(info.State.Msgs))),
		Reference: fmt.Sprintf("p50 %s · max %s (empty lane)", fmtDur(percentile(ref, 50)), fmtDur(percentile(ref, 100))),
		Ratio:     "—",
		Goal:      fmt.Sprintf("max ≤ reference max + 1 key period (%s) + %s", fmtDur(period), fmtDur(slack)),
		Verdict:   verdict(percentile(got, 100) <= percentile(ref, 100)+period+slack),
		Note: fmt.Sprintf("every key at %d/s, burst 1; one POST /v1/lanes/{lane}/jobs with a fresh Throttle-Key at a time, timed from its 202 to its arrival at the sink (from the request's start: p50 %s · max %s, empty lane p50 %s · max %s); %d slots given up (woken too late) by the end",
			coldKeyRate, fmtDur(percentile(gotWhole, 50)), fmtDur(percentile(gotWhole, 100)),
			fmtDur(percentile(refWhole, 50)), fmtDur(percentile(refWhole, 100)), missed),
	}, nil
}

// coldDelays submits coldKeys jobs, one at a time, each on a fresh key
// prefix+i, and returns for each the time from its 202 to its arrival, and
// from the request's start to its arrival.
func (e *env) coldDelays(ctx context.Context, client *http.Client, sk *sink, c *child, lane, prefix string) (out, whole []time.Duration, err error) {
	url := "http://" + c.listen + "/v1/lanes/" + lane + "/jobs"
	for i := range coldKeys {
		key := fmt.Sprintf("%s%02d", prefix, i)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"event":"bench.cold"}`))
		if err != nil {
			return nil, nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Throttle-Key", key)
		sent := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return nil, nil, c.fail(fmt.Errorf("bench: cold key: %w", err))
		}
		resp.Body.Close()
		answered := time.Now()
		if resp.StatusCode != http.StatusAccepted {
			return nil, nil, c.fail(fmt.Errorf("bench: cold key: POST %s answered %d, want 202", url, resp.StatusCode))
		}
		deadline := answered.Add(30 * time.Second)
		for {
			if at, ok := sk.first(key); ok {
				// Arrived before the answer was read: no delay.
				out = append(out, max(0, at.Sub(answered)))
				whole = append(whole, at.Sub(sent))
				break
			}
			if time.Now().After(deadline) {
				return nil, nil, c.fail(fmt.Errorf("bench: cold key %s: not at the sink 30s after its 202", key))
			}
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		e.prog.set("cold keys "+prefix, i+1, coldKeys)
	}
	return out, whole, nil
}

// keyedEnv is a nats-server of the bench's own (so that the throttler's
// memory and CPU are its own), the config of one keyed lane on it, a
// JetStream client, and a Redis client for the Redis pacer.
type keyedEnv struct {
	dir  string
	srv  *server.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	rdb  *redis.Client
	opts svcOpts
}

// startKeyedEnv starts the server, and the throttler once so that it makes
// the lane's stream and consumers exactly as it does.
func (e *env) startKeyedEnv(ctx context.Context, name, redisURL string, sk *sink, lane string, lo laneOpts) (*keyedEnv, error) {
	k := &keyedEnv{dir: e.dir(name)}
	srv, err := server.NewServer(&server.Options{
		ServerName: "bench-keyed", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: filepath.Join(k.dir, "nats"), NoSigs: true, NoLog: true,
	})
	if err != nil {
		return nil, fmt.Errorf("bench: nats-server: %w", err)
	}
	go srv.Start()
	k.srv = srv
	if !srv.ReadyForConnections(10 * time.Second) {
		k.close()
		return nil, errors.New("bench: nats-server not ready within 10s")
	}
	listen, err := freeAddr()
	if err != nil {
		k.close()
		return nil, err
	}
	k.opts = svcOpts{dataDir: filepath.Join(k.dir, "data"), natsURL: srv.ClientURL(), redisURL: redisURL, listen: listen,
		target: sk.URL, lanes: map[string]laneOpts{lane: lo}}
	if redisURL != "" {
		opt, err := redis.ParseURL(redisURL)
		if err != nil {
			k.close()
			return nil, fmt.Errorf("bench: redis-url: %w", err)
		}
		k.rdb = redis.NewClient(opt)
	}
	if k.nc, err = nats.Connect(srv.ClientURL(), nats.Timeout(5*time.Second)); err != nil {
		k.close()
		return nil, fmt.Errorf("bench: nats: %w", err)
	}
	if k.js, err = jetstream.New(k.nc, jetstream.WithPublishAsyncMaxPending(publishWindow)); err != nil {
		k.close()
		return nil, err
	}
	c, err := e.startChild(ctx, k.dir, k.opts)
	if err != nil {
		k.close()
		return nil, err
	}
	c.stop()
	return k, nil
}

// calls reads the Redis commands processed so far (INFO commandstats:
// a script and the commands it ran count once; 0 without Redis) and the
// messages the nats-server received from clients (Varz in_msgs).
func (k *keyedEnv) calls(ctx context.Context) (redisCalls, natsMsgs int64, err error) {
	v, err := k.srv.Varz(nil)
	if err != nil {
		return 0, 0, fmt.Errorf("bench: nats varz: %w", err)
	}
	if k.rdb == nil {
		return 0, v.InMsgs, nil
	}
	info, err := k.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, fmt.Errorf("bench: redis info: %w", err)
	}
	// Calls of the commands a script runs are counted beside the
	// script's own: count what a client sent.
	inScripts := map[string]bool{"time": true, "get": true, "set": true, "del": true, "hset": true, "hget": true, "pexpire": true,
		"zadd": true, "zrem": true, "zremrangebyscore": true, "zscore": true, "zcard": true, "zcount": true, "pttl": true}
	for line := range strings.SplitSeq(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, stats, ok := strings.Cut(rest, ":")
		if !ok || inScripts[name] {
			continue
		}
		for kv := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				c, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("bench: redis commandstats %q: %w", line, err)
				}
				redisCalls += c
			}
		}
	}
	return redisCalls, v.InMsgs, nil
}

func (k *keyedEnv) close() {
	if k.nc != nil {
		k.nc.Close()
	}
	if k.rdb != nil {
		_ = k.rdb.Close()
	}
	if k.srv != nil {
		k.srv.Shutdown()
		k.srv.WaitForShutdown()
	}
}

// child is a throttler process started by startChild.
type child struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
	listen  string
	stopped bool
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop stops the process (SIGTERM, then SIGKILL after 20s); a second call
// does nothing.
func (c *child) stop() {
	if !c.stopped {
		c.stopped = true
		stopChild(c.cmd, c.exited)
	}
}

// fail adds the end of the process's log to err.
func (c *child) fail(err error) error {
	b, _ := os.ReadFile(c.logPath)
	s := strings.TrimSpace(string(b))
	if len(s) > 1000 {
		s = "…" + s[len(s)-1000:]
	}
	if s == "" {
		return err
	}
	return fmt.Errorf("%w (throttler log: %s)", err, s)
}

// missed reads the child's throttler_slots_missed_total of lane from its
// /metrics (slots given up: woken too late for them); -1 when unreadable.
func (c *child) missed(ctx context.Context, lane string) int64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.listen+"/metrics", nil)
	if err != nil {
		return -1
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "throttler_slots_missed_total{"); ok && strings.Contains(rest, `lane="`+lane+`"`) {
			f := strings.Fields(rest)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				return int64(v)
			}
		}
	}
	return -1
}

// startChild writes opts as dir/throttler.yaml and starts the throttler
// binary on it (`serve --config`), and waits until it is ready.
func (e *env) startChild(ctx context.Context, dir string, opts svcOpts) (*child, error) {
	// The child reads the file with the same loader; check it here first.
	if _, err := config.Parse("generated bench config", opts.yaml(), nil); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	path := filepath.Join(dir, "throttler.yaml")
	if err := os.WriteFile(path, opts.yaml(), 0o644); err != nil {
		return nil, err
	}
	c := &child{logPath: filepath.Join(dir, "throttler.log"), listen: opts.listen, exited: make(chan struct{})}
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	c.cmd = exec.Command(e.cfg.Binary, "serve", "--config", path)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "THROTTLER_") { // the file alone configures the child
			c.cmd.Env = append(c.cmd.Env, kv)
		}
	}
	dieWithParent(c.cmd)
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", e.cfg.Binary, err)
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	if err := waitReady(ctx, "http://"+opts.listen+"/readyz", c.exited); err != nil {
		c.stop()
		return nil, c.fail(err)
	}
	return c, nil
}

// publishSubjects stores n messages with payload, the i-th on subject(i),
// through async publishes a window at a time, and returns when JetStream
// acked them all.
func publishSubjects(ctx context.Context, js jetstream.JetStream, n int, subject func(i int) string, payload []byte, progress func(done int)) error {
	futures := make([]jetstream.PubAckFuture, 0, publishWindow)
	for i := range n {
		f, err := js.PublishAsync(subject(i), payload)
		if err != nil {
			return fmt.Errorf("bench: publish to %s: %w", subject(i), err)
		}
		futures = append(futures, f)
		if len(futures) < cap(futures) && i < n-1 {
			continue
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("bench: publish to %s: %w", f.Msg().Subject, err)
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(30 * time.Second):
				return fmt.Errorf("bench: publish to %s: no ack within 30s", f.Msg().Subject)
			}
		}
		futures = futures[:0]
		if progress != nil {
			progress(i + 1)
		}
	}
	return nil
}

// usedMemory is Redis's INFO memory used_memory, in bytes.
func usedMemory(ctx context.Context, rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("bench: redis info: %w", err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, errors.New("bench: redis info: no used_memory")
}

// laneRedisKeys counts the Redis keys of a keyed lane's keys: claims
// (thr:{lane}:own:<key>) and GCRA states (thr:{lane}:k:<key>).
func laneRedisKeys(ctx context.Context, rdb *redis.Client, lane string) (claims, states int64, err error) {
	head := "thr:{" + lane + "}:"
	iter := rdb.Scan(ctx, 0, head+"*", 10_000).Iterator()
	for iter.Next(ctx) {
		switch k := iter.Val(); {
		case strings.HasPrefix(k, head+"own:"):
			claims++
		case strings.HasPrefix(k, head+"k:"):
			states++
		}
	}
	if err := iter.Err(); err != nil {
		return 0, 0, fmt.Errorf("bench: redis scan: %w", err)
	}
	return claims, states, nil
}
