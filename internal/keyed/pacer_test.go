package keyed_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/leaky"
)

// The pacer's tests on virtual time: the clock stands still until a step
// table's row moves it (time as a value), the pair store is the memory one
// on that clock, and the queue, the leases and the workers are small
// in-memory implementations of the pacer's interfaces. The same pacer on
// JetStream and Redis is tested in order_test.go and leases_test.go, and
// end to end in internal/service.

// laneLimit and keyLimit: the lane starts 10 jobs/s, each key 2/s.
func laneLimit() bucket.Limit      { return bucket.Limit{Rate: 10, Burst: 1} }
func keyLimit(string) bucket.Limit { return bucket.Limit{Rate: 2, Burst: 1} }
func oneEach(string) keyed.Opts    { return keyed.Opts{MaxInflight: 1} }
func twoEach(string) keyed.Opts    { return keyed.Opts{MaxInflight: 2} }

// memJob is one stored job.
type memJob struct {
	id       string
	key      string
	seq      uint64
	r        *memReader
	attempts atomic.Int64
	released atomic.Int64
}

func (j *memJob) Seq() uint64 { return j.seq }
func (j *memJob) Release() error {
	j.released.Add(1)
	if f := j.r.requeued(); f != nil {
		f(j.key, j.seq) // as the queue tells the pacer (Pacer.Requeue)
	}
	return nil
}
func (j *memJob) AddAttempts(n int) { j.attempts.Add(int64(n)) }

// memReader is a keyed lane's stream in memory.
type memReader struct {
	mu          sync.Mutex
	jobs        []*memJob
	seq         uint64
	reads       int // Next calls that read the stream
	nextErr     error
	triesErr    error
	settlingErr error
	tries       map[uint64]int
	cleared     []uint64
	// onRequeue, when set, hears a job handed back (queue.KeyedReader's
	// OnRequeue).
	onRequeue func(key string, seq uint64)
}

func (r *memReader) requeued() func(key string, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.onRequeue
}

func (r *memReader) add(key, id string) *memJob {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	j := &memJob{id: id, key: key, seq: r.seq, r: r}
	r.jobs = append(r.jobs, j)
	return j
}

// waitReads waits until Next has read the stream n times.
func (r *memReader) waitReads(n int) {
	for {
		r.mu.Lock()
		got := r.reads
		r.mu.Unlock()
		if got >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// remove takes a settled job out of the stream.
func (r *memReader) remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.jobs = slices.DeleteFunc(r.jobs, func(j *memJob) bool { return j.id == id })
}

func (r *memReader) Keys(context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keys []string
	for _, j := range r.jobs {
		if !slices.Contains(keys, j.key) {
			keys = append(keys, j.key)
		}
	}
	return keys, nil
}

func (r *memReader) Next(ctx context.Context, key string, from uint64) (*memJob, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	if r.nextErr != nil {
		return nil, false, r.nextErr
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	for _, j := range r.jobs {
		if j.key == key && j.seq >= from {
			return j, true, nil
		}
	}
	return nil, false, nil
}

// Settling: a job leaves the stream as it settles (remove); settlingErr,
// when set, says its deletes are still under way.
func (r *memReader) Settling(context.Context, string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.settlingErr
}

func (r *memReader) Tries(_ context.Context, seq uint64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tries[seq], r.triesErr
}

func (r *memReader) SetTries(_ context.Context, seq uint64, n int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.triesErr != nil {
		return r.triesErr
	}
	if r.tries == nil {
		r.tries = map[uint64]int{}
	}
	r.tries[seq] = n
	return nil
}

func (r *memReader) ClearTries(_ context.Context, seq uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tries, seq)
	r.cleared = append(r.cleared, seq)
	return r.triesErr
}

// nopPair grants every slot at once.
type nopPair struct{}

func (nopPair) ReservePair(context.Context, bucket.Key, bucket.Limit, bucket.Limit, time.Duration, time.Duration) (bucket.PairReservation, error) {
	return bucket.PairReservation{OK: true, Free: true}, nil
}

// downPair is the memory pair store, or an error while err is set.
type downPair struct {
	*bucket.Memory
	err atomic.Pointer[error]
}

func (p *downPair) ReservePair(ctx context.Context, k bucket.Key, ll, kl bucket.Limit, ahead, carry time.Duration) (bucket.PairReservation, error) {
	if e := p.err.Load(); e != nil {
		return bucket.PairReservation{}, *e
	}
	return p.Memory.ReservePair(ctx, k, ll, kl, ahead, carry)
}

// memLeases holds the fleet's in-flight leases in memory; full or err,
// when set, refuse every acquire.
type memLeases struct {
	mu         sync.Mutex
	held       map[string]string // token → key
	full       keyed.Full
	err        error
	releaseErr error // ReleaseLease fails (the lease stays until it lapses)
	refreshErr error
	refreshed  []int            // the leases each Refresh extended
	onTake     func(key string) // runs inside Acquire (a requeue meanwhile)
	laneMax    int
}

func (m *memLeases) Acquire(_ context.Context, _, key, token string, laneMax, _ int) (keyed.Full, error) {
	if f := m.onTake; f != nil {
		f(key)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.laneMax = laneMax
	if m.err != nil {
		return keyed.Taken, m.err
	}
	if m.full != keyed.Taken {
		return m.full, nil
	}
	if m.held == nil {
		m.held = map[string]string{}
	}
	m.held[token] = key
	return keyed.Taken, nil
}

func (m *memLeases) ReleaseLease(_ context.Context, _, _, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.held, token)
	return m.releaseErr
}

func (m *memLeases) Refresh(_ context.Context, _ string, held map[string]string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refreshed = append(m.refreshed, len(held))
	return m.refreshErr
}

func (m *memLeases) Held(_ context.Context, _, key string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, k := range m.held {
		if k == key {
			n++
		}
	}
	return n, nil
}

// count is the number of leases held, of every key.
func (m *memLeases) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.held)
}

// memWorkers are a pull-mode lane's waiting workers: always one waiting.
type memWorkers struct {
	claims, unclaims, bounces, stops atomic.Int64
	backlog                          int64
}

func (w *memWorkers) Claim(context.Context, int) (int, error) { w.claims.Add(1); return 1, nil }
func (w *memWorkers) Unclaim(n int)                           { w.unclaims.Add(int64(n)) }
func (w *memWorkers) Bounce(time.Duration) int                { w.bounces.Add(1); return 0 }
func (w *memWorkers) StopPulls()                              { w.stops.Add(1) }
func (w *memWorkers) Backlog(context.Context, string, time.Duration) (int64, error) {
	return w.backlog, nil
}

// stillClock stands still until the test moves it: a job's wait for its
// slot returns at once, and the slot it was given is the value tested.
type stillClock struct {
	mu  sync.Mutex
	now time.Time
	// lateBy, when set, is how far a wait moves the clock: a stalled
	// machine that wakes a job that much after its wait began.
	lateBy time.Duration
	slept  []time.Duration // every wait asked, in order
}

// sleeps returns the waits asked since it was last called.
func (c *stillClock) sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.slept
	c.slept = nil
	return out
}

func (c *stillClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stillClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	if d > 0 {
		c.now = c.now.Add(c.lateBy)
	}
	return ctx.Err()
}

func (c *stillClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// recObserver records the pacer's events.
type recObserver struct {
	mu       sync.Mutex
	late     []time.Duration
	reserved int
	down     []bool
}

func (o *recObserver) Started(late time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.late = append(o.late, late)
}

func (o *recObserver) Reserved(n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reserved += n
}

func (o *recObserver) PacerDown(down bool, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.down = append(o.down, down)
}

// gatedClock stands still at now; a Sleep until an instant returns when the
// test opens that instant's gate: the test decides which job's goroutine
// wakes first, as a loaded machine may (a thread holding one job's timer
// stalls while another runs the next job's).
type gatedClock struct {
	mu    sync.Mutex
	now   time.Time
	gates map[time.Time]chan struct{}
}

func (c *gatedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *gatedClock) gate(at time.Time) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	g, ok := c.gates[at]
	if !ok {
		g = make(chan struct{})
		c.gates[at] = g
	}
	return g
}

func (c *gatedClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-c.gate(c.Now().Add(d)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wakeAt moves the clock to now and wakes the sleep until at.
func (c *gatedClock) wakeAt(at, now time.Time) {
	g := c.gate(at)
	c.mu.Lock()
	c.now = now
	c.mu.Unlock()
	close(g)
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// harness is a pacer on virtual time whose started jobs stay in flight
// until the test settles them.
type harness struct {
	t        *testing.T
	ctx      context.Context
	clk      *stillClock
	r        *memReader
	pair     *downPair
	leases   *memLeases
	workers  *memWorkers
	obs      *recObserver
	logs     *logRecords
	k        *keyed.Pacer[*memJob]
	laneNext time.Time

	mu       sync.Mutex
	started  []string
	at       map[string]time.Duration // job → when it started, from t0
	done     map[string]func()
	assigned map[string]time.Duration // job → its slot, from t0
	// onAssigned, when set, runs as a job is given its slot (between the
	// reservation and the wait for the slot).
	onAssigned func()
}

type harnessOpts struct {
	keyOpts func(string) keyed.Opts
	held    func() <-chan struct{} // Config.Held
	leases  bool
	workers bool
	ordered bool
}

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	clk := &stillClock{now: t0}
	h := &harness{t: t, ctx: context.Background(), clk: clk, r: &memReader{}, pair: &downPair{Memory: &bucket.Memory{Clock: clk}},
		obs: &recObserver{}, logs: &logRecords{}, laneNext: t0, done: map[string]func(){}, at: map[string]time.Duration{}, assigned: map[string]time.Duration{}}
	if o.keyOpts == nil {
		o.keyOpts = oneEach
	}
	cfg := keyed.Config[*memJob]{
		Lane: "demo", Reader: h.r, Pair: h.pair, Claims: keyed.Local{}, Clock: clk, Observer: h.obs,
		Start: func(_ context.Context, j *memJob, done func()) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.started = append(h.started, j.id)
			h.at[j.id] = clk.Now().Sub(t0)
			h.done[j.id] = done
		},
		Assigned: func(j *memJob, s leaky.Slot) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.assigned[j.id] = s.Due.Sub(t0)
			if h.onAssigned != nil {
				h.onAssigned()
			}
		},
		LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: o.keyOpts, MaxInflight: 4, Ordered: o.ordered,
		MaxPause: time.Minute, Instance: "a", Logger: slog.New(h.logs), Held: o.held,
	}
	if o.leases {
		h.leases = &memLeases{}
		cfg.Leases = h.leases
	}
	if o.workers {
		h.workers = &memWorkers{}
		cfg.Workers, cfg.Backlog = h.workers, h.workers
	}
	k, err := keyed.NewPacer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.k = k
	return h
}

// stepped is what one step did.
type stepped struct {
	started string        // the job started ("" none)
	due     time.Duration // its slot, from t0
	rest    time.Duration
	wake    bool
}

// step moves the clock to t0+at and runs one step; the job it starts, if
// any, has started when it returns.
func (h *harness) step(at time.Duration) stepped {
	h.t.Helper()
	h.clk.set(t0.Add(at))
	h.mu.Lock()
	before := len(h.started)
	h.mu.Unlock()
	d, wake, stop := h.k.Step(h.ctx, &h.laneNext)
	if stop {
		h.t.Fatalf("at %v: the step stopped", at)
	}
	h.k.WaitStarts()
	h.mu.Lock()
	defer h.mu.Unlock()
	s := stepped{rest: d, wake: wake}
	if len(h.started) > before {
		s.started = h.started[len(h.started)-1]
		s.due = h.assigned[s.started]
	}
	return s
}

// settle ends job id's dispatch (it calls done) and takes it out of the
// stream.
func (h *harness) settle(id string) {
	h.t.Helper()
	h.mu.Lock()
	done := h.done[id]
	delete(h.done, id)
	h.mu.Unlock()
	if done == nil {
		h.t.Fatalf("settle %s: not in flight", id)
	}
	h.r.remove(id)
	done()
}

// inflight is the number of jobs started and not settled.
func (h *harness) inflight() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.done)
}

// checkHeld: the permits held are the jobs in flight, and so are the
// fleet's leases and the workers' claims used up.
func (h *harness) checkHeld(row int) {
	h.t.Helper()
	n := h.inflight()
	if p := h.k.Permits(); p != n {
		h.t.Errorf("row %d: %d permits held with %d jobs in flight", row, p, n)
	}
	if got := int(h.k.Inflight()); got != n {
		h.t.Errorf("row %d: Inflight %d with %d jobs in flight", row, got, n)
	}
	if h.leases != nil {
		h.k.WaitReleases()
		if l := h.leases.count(); l != n {
			h.t.Errorf("row %d: %d leases held with %d jobs in flight", row, l, n)
		}
	}
	if w := h.workers; w != nil {
		if used := w.claims.Load() - w.unclaims.Load(); int(used) != len(h.started) {
			h.t.Errorf("row %d: %d workers' claims used with %d jobs started", row, used, len(h.started))
		}
	}
}

const ms = time.Millisecond

// TestPacerSteps: keys a (three jobs) and b (one) at 10 jobs/s for the lane
// and 2/s per key. Each row moves the clock, runs one step and says which
// job starts at which slot, or how long the loop rests.
func TestPacerSteps(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, id := range []string{"a1", "a2", "a3"} {
		h.r.add("a", id)
	}
	h.r.add("b", "b1")
	h.k.Claim(h.ctx, "a", "b")
	rows := []struct {
		at   time.Duration
		want stepped
		idle []string // keys handed to the claimer to release
	}{
		// a first (claimed first), at once; b at the lane's next slot,
		// chosen after a wait until just before it (below).
		{0, stepped{started: "a1", due: 0}, nil},
		{0, stepped{started: "b1", due: 100 * ms}, nil},
		// Neither key's own next slot has come: rest until a's (500 ms),
		// less the lookahead, or until the scheduler has news.
		{0, stepped{rest: 500*ms - keyed.Lookahead, wake: true}, nil},
		{100 * ms, stepped{rest: 400*ms - keyed.Lookahead, wake: true}, nil},
		// Within the lookahead of a's slot: reserved ahead, due at 500 ms.
		{500*ms - keyed.Lookahead, stepped{started: "a2", due: 500 * ms}, nil},
		// b's slot came, but it has no job left: it goes idle.
		{600 * ms, stepped{}, []string{"b"}},
		{600 * ms, stepped{rest: 400*ms - keyed.Lookahead, wake: true}, []string{"b"}},
		{1000 * ms, stepped{started: "a3", due: 1000 * ms}, []string{"b"}},
		// a has nothing left: it goes idle too, and no key has jobs.
		{1500 * ms, stepped{}, []string{"a", "b"}},
		{1500 * ms, stepped{rest: time.Second - keyed.Lookahead, wake: true}, []string{"a", "b"}},
	}
	for i, r := range rows {
		h.clk.sleeps()
		got := h.step(r.at)
		if got != r.want {
			t.Fatalf("row %d at %v: %+v, want %+v", i, r.at, got, r.want)
		}
		if i == 1 {
			// The step waited until the lane's next slot less the
			// lookahead before choosing b (a key that gets jobs meanwhile
			// competes for the slot); b1 then waited for its slot.
			if s := positive(h.clk.sleeps()); !slices.Equal(s, []time.Duration{100*ms - keyed.Lookahead, 100 * ms}) {
				t.Fatalf("row 1: waits %v, want [95ms 100ms]", s)
			}
		}
		h.checkHeld(i)
		if idle := h.k.Idled(); !sameKeys(idle, r.idle) {
			t.Fatalf("row %d: idle keys %v, want %v", i, idle, r.idle)
		}
		if got.started != "" {
			h.settle(got.started)
			h.checkHeld(i)
		}
	}
	if logged := h.logs.take(); len(logged) != 0 {
		t.Fatalf("logged %q on a path with no failure", logged)
	}
	if n := h.k.Deciding(); n != 0 {
		t.Fatalf("%d keys still waiting for a decision with every job started: memory held", n)
	}
	if h.obs.reserved != 4 || len(h.obs.late) != 4 {
		t.Fatalf("reserved %d, started %d; want 4 and 4", h.obs.reserved, len(h.obs.late))
	}
}

func sameKeys(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestPacerInflightBound: a key at its max_inflight is not chosen until
// one of its jobs settles; a key with two may have two in flight.
func TestPacerInflightBound(t *testing.T) {
	for _, c := range []struct {
		name   string
		opts   func(string) keyed.Opts
		second stepped // the step at a2's slot, a1 still in flight
	}{
		{"one", oneEach, stepped{rest: time.Second - keyed.Lookahead, wake: true}},
		{"two", twoEach, stepped{started: "a2", due: 500 * ms}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{keyOpts: c.opts})
			h.r.add("a", "a1")
			h.r.add("a", "a2")
			h.k.Claim(h.ctx, "a")
			if got := h.step(0); got.started != "a1" {
				t.Fatalf("first step: %+v", got)
			}
			if got := h.step(500 * ms); got != c.second {
				t.Fatalf("a1 in flight: %+v, want %+v", got, c.second)
			}
			h.checkHeld(1)
			h.settle("a1")
			if c.second.started == "" {
				if got := h.step(500 * ms); got.started != "a2" || got.due != 500*ms {
					t.Fatalf("a1 settled: %+v, want a2 at 500ms", got)
				}
			}
			if k := h.k.Key("a"); k.Inflight != 1 {
				t.Fatalf("a in flight: %d, want 1", k.Inflight)
			}
		})
	}
}

var errDown = errors.New("down")

// TestPacerStepRefusals: every way a step starts nothing gives back its
// permit, its lease and its worker's claim, and rests as long as the
// refusal says; the key is chosen again after its wait.
func TestPacerStepRefusals(t *testing.T) {
	rows := []struct {
		name  string
		set   func(h *harness)
		unset func(h *harness)
		rest  stepped
		// again is when the key may be chosen again.
		again time.Duration
		down  []bool   // the observer's PacerDown calls
		warn  []string // what it logs
	}{
		{"read fails", func(h *harness) { h.r.nextErr = errDown }, func(h *harness) { h.r.nextErr = nil },
			stepped{}, keyed.RetryWait, nil, []string{"reading a key's next job failed"}},
		{"ordered tries unreadable", func(h *harness) { h.r.triesErr = errDown }, func(h *harness) { h.r.triesErr = nil },
			stepped{}, keyed.RetryWait, nil, []string{"reading a key's next job failed"}},
		{"lease fails", func(h *harness) { h.leases.err = errDown }, func(h *harness) { h.leases.err = nil },
			stepped{}, keyed.RetryWait, nil, []string{"taking an in-flight lease failed, keyed lane waits"}},
		{"key full", func(h *harness) { h.leases.full = keyed.KeyFull }, func(h *harness) { h.leases.full = keyed.Taken },
			stepped{}, keyed.LeasePoll, nil, nil},
		{"lane full", func(h *harness) { h.leases.full = keyed.LaneFull }, func(h *harness) { h.leases.full = keyed.Taken },
			stepped{rest: keyed.LeasePoll}, keyed.LeasePoll, nil, nil},
		{"pacer down", func(h *harness) { h.pair.err.Store(&errDown) }, func(h *harness) { h.pair.err.Store(nil) },
			stepped{rest: keyed.RetryWait}, keyed.RetryWait, []bool{true, false}, []string{"pacer unavailable, keyed lane waits"}},
		{"lease release fails", func(h *harness) { h.leases.releaseErr = errDown; h.pair.err.Store(&errDown) },
			func(h *harness) { h.pair.err.Store(nil) },
			stepped{rest: keyed.RetryWait}, keyed.RetryWait, []bool{true, false}, []string{
				"pacer unavailable, keyed lane waits", "giving back an in-flight lease failed; it lapses by itself",
			}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{leases: true, workers: true, ordered: true})
			h.r.add("a", "a1")
			h.k.Claim(h.ctx, "a")
			r.set(h)
			if got := h.step(0); got != r.rest {
				t.Fatalf("refused step: %+v, want %+v", got, r.rest)
			}
			h.checkHeld(0)
			if got := h.logs.take(); !sameKeys(got, r.warn) {
				t.Fatalf("logged %q, want %q", got, r.warn)
			}
			r.unset(h)
			if r.again > 0 {
				// Not before its wait: the loop rests until then.
				if got := h.step(0); got.started != "" {
					t.Fatalf("chosen again at once: %+v", got)
				}
				h.checkHeld(1)
			}
			if got := h.step(r.again); got.started != "a1" || got.due != r.again {
				t.Fatalf("after %v: %+v, want a1 started at its slot", r.again, got)
			}
			h.checkHeld(2)
			// A job read and then refused its lease or its slot is held,
			// not read again; one whose read failed is read again.
			if want := 1 + b2i(r.name == "read fails" || r.name == "ordered tries unreadable"); h.r.reads != want {
				t.Fatalf("stream read %d times, want %d", h.r.reads, want)
			}
			if h.leases.laneMax != 4 {
				t.Fatalf("lane bound asked of the leases: %d, want max_inflight 4", h.leases.laneMax)
			}
			h.obs.mu.Lock()
			defer h.obs.mu.Unlock()
			if want := append(r.down, false); r.down == nil && !slices.Equal(h.obs.down, []bool{false, false}[:len(h.obs.down)]) || r.down != nil && !slices.Equal(h.obs.down, want[:len(r.down)]) {
				t.Fatalf("pacer down calls: %v, want %v", h.obs.down, r.down)
			}
		})
	}
}

// TestPacerWorkersWithNoJobDue: a pull-mode lane with no job due rests
// at most bounceAfter, and, in a fleet with jobs stored, sends the workers
// waiting here to ask again; other lanes rest up to a second.
func TestPacerWorkersWithNoJobDue(t *testing.T) {
	for _, c := range []struct {
		name            string
		leases, workers bool
		backlog         int64
		rest            time.Duration
		bounces         int64
	}{
		{"no workers", true, false, 5, time.Second - keyed.Lookahead, 0},
		{"one instance", false, true, 5, keyed.BounceAfter - keyed.Lookahead, 0},
		{"fleet, nothing stored", true, true, 0, keyed.BounceAfter - keyed.Lookahead, 0},
		{"fleet, jobs stored elsewhere", true, true, 5, keyed.BounceAfter - keyed.Lookahead, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{leases: c.leases, workers: c.workers})
			if h.workers != nil {
				h.workers.backlog = c.backlog
			}
			if got := h.step(0); got != (stepped{rest: c.rest, wake: true}) {
				t.Fatalf("no key: %+v, want a rest of %v", got, c.rest)
			}
			h.checkHeld(0)
			if h.workers != nil && h.workers.bounces.Load() != c.bounces {
				t.Fatalf("bounces %d, want %d", h.workers.bounces.Load(), c.bounces)
			}
		})
	}
}

// TestPacerTakeRefusedAfterRequeue: a job of the key handed back while the
// step read and reserved the next one (a new epoch) must start first: the
// step gives up its slot, and the key reads again from the one handed back.
func TestPacerTakeRefusedAfterRequeue(t *testing.T) {
	h := newHarness(t, harnessOpts{leases: true, keyOpts: twoEach})
	a1 := h.r.add("a", "a1")
	h.r.add("a", "a2")
	h.k.Claim(h.ctx, "a")
	if got := h.step(0); got.started != "a1" {
		t.Fatalf("first step: %+v", got)
	}
	// a1 goes back to wait in place while the step reserves for a2: after
	// the step read a2 (the lease is taken on a goroutine of its own, which
	// may run before the read, and the step would then read a1 again).
	h.r.mu.Lock()
	reads := h.r.reads
	h.r.mu.Unlock()
	h.leases.onTake = func(key string) {
		h.leases.onTake = nil
		h.r.waitReads(reads + 1)
		h.mu.Lock()
		delete(h.done, "a1")
		h.mu.Unlock()
		h.k.Requeue(key, a1.seq)
	}
	if got := h.step(500 * ms); got.started != "" {
		t.Fatalf("a2 started before a1, handed back: %+v", got)
	}
	if h.k.Missed() != 1 {
		t.Fatalf("missed %d, want 1", h.k.Missed())
	}
	h.k.WaitReleases()
	if n := h.leases.count(); n != 1 {
		t.Fatalf("leases held %d, want 1 (a1's, not yet settled)", n)
	}
	if got := h.step(time.Second); got.started != "a1" || got.due != time.Second {
		t.Fatalf("after the requeue: %+v, want a1 again at 1s", got)
	}
}

// TestPacerDueJobStartsAsAStopBegins: a job whose slot is reserved and due
// now starts though the stop begins before its goroutine runs: the slot
// taken is used, not lost. One due later goes back unstarted.
func TestPacerDueJobStartsAsAStopBegins(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.r.add("a", "a1")
	b1 := h.r.add("b", "b1")
	h.k.Claim(h.ctx, "a", "b")
	for _, st := range []struct {
		at      time.Duration
		started []string
	}{
		{0, []string{"a1"}},       // due at once
		{10 * ms, []string{"a1"}}, // b1's slot is the lane's next, 100 ms on: handed back
	} {
		ctx, cancel := context.WithCancel(context.Background())
		h.onAssigned = cancel // the stop begins as the slot is given
		h.clk.set(t0.Add(st.at))
		h.k.Step(ctx, &h.laneNext)
		h.k.WaitStarts()
		cancel()
		h.mu.Lock()
		started := slices.Clone(h.started)
		h.mu.Unlock()
		if !slices.Equal(started, st.started) {
			t.Fatalf("at %v: started %v, want %v", st.at, started, st.started)
		}
	}
	h.onAssigned = nil
	if b1.released.Load() != 1 {
		t.Fatalf("b1 released %d times, want 1", b1.released.Load())
	}
	h.k.Requeue("b", b1.seq) // the queue hears b1 handed back
	if got := h.step(time.Second); got.started != "b1" {
		t.Fatalf("b1 read again: %+v", got)
	}
}

// TestPacerOperatorHold: with an operator's hold configured, a job starts
// while the lane is not held; one whose hold began after its slot was
// given goes back unstarted and is its key's next once the hold ends.
func TestPacerOperatorHold(t *testing.T) {
	var mu sync.Mutex
	var hold chan struct{} // nil: not held
	held := func() <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		return hold
	}
	h := newHarness(t, harnessOpts{held: held})
	// A step that waits for a hold nobody ends would wait for ever: past
	// this, it stops and the test fails (a step here takes microseconds).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h.ctx = ctx
	h.r.add("a", "a1")
	b1 := h.r.add("b", "b1")
	h.k.Claim(h.ctx, "a", "b")
	if got := h.step(0); got.started != "a1" {
		t.Fatalf("not held: %+v, want a1 started", got)
	}
	h.onAssigned = func() { // the hold begins as b1's slot is given
		mu.Lock()
		defer mu.Unlock()
		hold = make(chan struct{})
	}
	if got := h.step(10 * ms); got.started != "" || b1.released.Load() != 1 {
		t.Fatalf("held after its slot was given: %+v, released %d; want nothing started, b1 released once", got, b1.released.Load())
	}
	h.onAssigned = nil
	mu.Lock()
	close(hold)
	hold = nil
	mu.Unlock()
	h.k.Requeue("b", b1.seq) // the queue hears b1 handed back
	if got := h.step(time.Second); got.started != "b1" {
		t.Fatalf("after the hold: %+v, want b1 started", got)
	}
}

// TestPacerRequeueOnce: the queue may tell the same job handed back twice
// (or a job the key has not read past): the second time moves nothing, and
// the jobs read after the first are not sent back again.
func TestPacerRequeueOnce(t *testing.T) {
	h := newHarness(t, harnessOpts{leases: true})
	a1 := h.r.add("a", "a1")
	h.k.Claim(h.ctx, "a")
	h.k.Requeue("a", a1.seq)
	h.leases.onTake = func(key string) {
		h.leases.onTake = nil
		h.k.Requeue(key, a1.seq) // told again while the step reserves a1
	}
	if got := h.step(0); got.started != "a1" {
		t.Fatalf("a1 after a repeated requeue: %+v, want started", got)
	}
	if h.k.Missed() != 0 {
		t.Fatalf("missed %d, want 0", h.k.Missed())
	}
}

// TestPacerLateWakeGivesSlotUp: a job woken past its slot by more than the
// lateness bound is handed back unstarted (a missed slot), never started
// late; its key reads it again.
func TestPacerLateWakeGivesSlotUp(t *testing.T) {
	h := newHarness(t, harnessOpts{workers: true})
	h.r.add("a", "a1")
	b1 := h.r.add("b", "b1")
	h.k.Claim(h.ctx, "a", "b")
	if got := h.step(0); got.started != "a1" {
		t.Fatalf("first step: %+v", got)
	}
	// b1's slot is at 100 ms; its goroutine wakes 200 ms after its wait
	// began: 100 ms past the bound (the lane's period, 100 ms).
	h.clk.mu.Lock()
	h.clk.lateBy = 200 * ms
	h.clk.mu.Unlock()
	if got := h.step(100*ms - keyed.Lookahead); got.started != "" {
		t.Fatalf("started late: %+v", got)
	}
	if b1.released.Load() != 1 || h.k.Missed() != 1 {
		t.Fatalf("released %d, missed %d; want 1 and 1", b1.released.Load(), h.k.Missed())
	}
	h.checkHeld(1)
	h.clk.mu.Lock()
	h.clk.lateBy = 0
	h.clk.mu.Unlock()
	h.k.Requeue("b", b1.seq) // the queue hears b1 handed back
	if got := h.step(time.Second); got.started != "b1" {
		t.Fatalf("b1 read again: %+v", got)
	}
	h.checkHeld(2)
}

// TestPacerLateStartCountsFromTheStart: a key's start that came late (the
// lane's cap put b1 at 100 ms, and its goroutine woke 96 ms after that,
// within the lateness bound) counts where it happened: the key's next job
// starts a key period (500 ms) after it, not after the slot; so do later
// late starts, each carried once, and one made before the key went idle
// and was claimed again. Each row moves the clock, sets how late waits
// wake, runs one step and says which job starts at which slot, and when;
// then does what the row's then says.
func TestPacerLateStartCountsFromTheStart(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.r.add("a", "a1")
	for _, id := range []string{"b1", "b2", "b3"} {
		h.r.add("b", id)
	}
	h.k.Claim(h.ctx, "a", "b")
	rows := []struct {
		at, lateBy time.Duration
		want       stepped
		startedAt  time.Duration // when want.started started
		then       func()
	}{
		{0, 0, stepped{started: "a1", due: 0}, 0, nil},
		// b's own slot is now, the lane's next is at 100 ms: b1 is due
		// then, and its wait ends 96 ms after its slot.
		{100*ms - keyed.Lookahead, 101 * ms, stepped{started: "b1", due: 100 * ms}, 196 * ms, nil},
		// 100 ms + 500 ms is not b's next slot: 196 ms + 500 ms is.
		{600*ms - keyed.Lookahead, 0, stepped{}, 0, nil},
		// a has no job left: it goes idle; then the loop rests until b's
		// slot less the lookahead.
		{600 * ms, 0, stepped{}, 0, nil},
		{600 * ms, 0, stepped{rest: 96*ms - keyed.Lookahead, wake: true}, 0, nil},
		// b2 wakes 20 ms late, b3 30 ms: each counts from its start.
		{696*ms - keyed.Lookahead, keyed.Lookahead + 20*ms, stepped{started: "b2", due: 696 * ms}, 716 * ms, nil},
		{1216*ms - keyed.Lookahead, keyed.Lookahead + 30*ms, stepped{started: "b3", due: 1216 * ms}, 1246 * ms, nil},
		// b has no job left: idle, released, forgotten; b4 comes and b is
		// claimed again. Its slot still counts from b3's start.
		{1741 * ms, 0, stepped{}, 0, func() {
			h.k.Release(h.ctx)
			h.r.add("b", "b4")
			h.k.Claim(h.ctx, "b")
		}},
		{1741 * ms, keyed.Lookahead, stepped{started: "b4", due: 1746 * ms}, 1746 * ms, nil},
	}
	for i, r := range rows {
		h.clk.mu.Lock()
		h.clk.lateBy = r.lateBy
		h.clk.mu.Unlock()
		got := h.step(r.at)
		if got != r.want {
			t.Fatalf("row %d at %v: %+v, want %+v", i, r.at, got, r.want)
		}
		if r.then != nil {
			r.then()
		}
		if got.started == "" {
			continue
		}
		h.mu.Lock()
		at := h.at[got.started]
		h.mu.Unlock()
		if at != r.startedAt {
			t.Fatalf("row %d: %s started at %v, want %v", i, got.started, at, r.startedAt)
		}
		h.settle(got.started)
		h.checkHeld(i)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	buckettest.CheckWindows(t, []time.Duration{h.at["b1"], h.at["b2"], h.at["b3"], h.at["b4"]}, keyLimit("b"), 0)
	if h.k.Missed() != 0 {
		t.Fatalf("%d slots given up; want none", h.k.Missed())
	}
}

// TestPacerOrderedTries: an ordered key's job carries the failed attempts
// stored for it when first read; a retry in place counts one more, stores
// it and holds the key for the wait; a settled job's count is cleared.
func TestPacerOrderedTries(t *testing.T) {
	h := newHarness(t, harnessOpts{ordered: true})
	a1 := h.r.add("a", "a1")
	h.r.add("a", "a2")
	if err := h.r.SetTries(h.ctx, a1.seq, 2); err != nil {
		t.Fatal(err)
	}
	h.k.Claim(h.ctx, "a")
	if got := h.step(0); got.started != "a1" {
		t.Fatalf("first step: %+v", got)
	}
	if n := a1.attempts.Load(); n != 2 {
		t.Fatalf("a1's attempts %d, want the 2 stored", n)
	}
	// a1 fails: it waits in place for 3 s, its key held.
	h.mu.Lock()
	done := h.done["a1"]
	delete(h.done, "a1")
	h.mu.Unlock()
	if n, err := h.k.RetryInPlace(h.ctx, "a", a1, 3*time.Second); err != nil || n != 3 {
		t.Fatalf("retry in place: %d, %v; want 3", n, err)
	}
	if n, _ := h.r.Tries(h.ctx, a1.seq); n != 3 {
		t.Fatalf("stored tries %d, want 3", n)
	}
	done()
	h.k.Requeue("a", a1.seq)
	if got := h.step(time.Second); got.started != "" {
		t.Fatalf("key held for the wait, yet %+v", got)
	}
	if got := h.step(3 * time.Second); got.started != "a1" {
		t.Fatalf("after the wait: %+v, want a1", got)
	}
	if n := a1.attempts.Load(); n != 2+3 {
		t.Fatalf("a1's attempts %d: the in-place count (3) is added to its read", n)
	}
	if err := h.k.Settled(h.ctx, a1); err != nil {
		t.Fatal(err)
	}
	h.settle("a1")
	if h.k.Tries(a1.seq) != 0 || !slices.Equal(h.r.cleared, []uint64{a1.seq}) {
		t.Fatalf("tries %d, cleared %v; want 0 and [%d]", h.k.Tries(a1.seq), h.r.cleared, a1.seq)
	}
	// A job without in-place attempts clears nothing.
	if err := h.k.Settled(h.ctx, &memJob{seq: 99}); err != nil || len(h.r.cleared) != 1 {
		t.Fatalf("settled without tries: %v, cleared %v", err, h.r.cleared)
	}
	h.r.triesErr = errDown
	if n, err := h.k.RetryInPlace(h.ctx, "a", &memJob{seq: 7}, time.Second); !errors.Is(err, errDown) || n != 1 || h.k.Tries(7) != 1 {
		t.Fatalf("unstored retry: %d, %v, kept %d; want 1, the error, 1 kept here", n, err, h.k.Tries(7))
	}
}

// recPauser records the keys paused in the shared state.
type recPauser struct {
	mu  sync.Mutex
	got []string
	err error
}

func (p *recPauser) Pause(_ context.Context, k bucket.Key, _ bucket.Limit, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, k.Lane+"/"+k.Sub+" "+d.String())
	return p.err
}

// TestPacerPauseKey: a key whose downstream asked it to wait is held alone,
// for at most MaxPause, here and in the shared state.
func TestPacerPauseKey(t *testing.T) {
	p := &recPauser{}
	clk := &stillClock{now: t0}
	r := &memReader{}
	r.add("a", "a1")
	r.add("b", "b1")
	var started []string
	var mu sync.Mutex
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: r, Pair: &bucket.Memory{Clock: clk}, Claims: keyed.Local{}, Clock: clk, Pauser: p,
		Start: func(_ context.Context, j *memJob, done func()) {
			mu.Lock()
			started = append(started, j.id)
			mu.Unlock()
			done()
		},
		LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: oneEach, MaxInflight: 4, MaxPause: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	k.Claim(ctx, "a", "b")
	k.PauseKey(ctx, "a", time.Hour)
	if !slices.Equal(p.got, []string{"demo/a 1m0s"}) {
		t.Fatalf("shared pauses %v, want a's for MaxPause", p.got)
	}
	laneNext := t0
	for _, at := range []time.Duration{0, 0} {
		clk.set(t0.Add(at))
		k.Step(ctx, &laneNext)
	}
	k.WaitStarts()
	if !slices.Equal(started, []string{"b1"}) {
		t.Fatalf("started %v while a is paused, want [b1]", started)
	}
	clk.set(t0.Add(time.Minute))
	laneNext = t0.Add(time.Minute)
	k.Step(ctx, &laneNext)
	k.WaitStarts()
	if !slices.Equal(started, []string{"b1", "a1"}) {
		t.Fatalf("started %v after a's pause, want [b1 a1]", started)
	}
}

// memSlow is the fleet's stored slow-downs in memory.
type memSlow struct {
	mu    sync.Mutex
	saved map[string]float64
}

func (m *memSlow) SaveSlow(_ context.Context, _, key string, f float64, _ time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.saved[key] = f
	return nil
}

func (m *memSlow) LoadSlow(_ context.Context, _ string, keys []string) ([]keyed.SlowState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []keyed.SlowState
	for _, k := range keys {
		if f, ok := m.saved[k]; ok {
			out = append(out, keyed.SlowState{Key: k, Factor: f})
		}
	}
	return out, nil
}

// TestPacerPushedBack: per_key.adaptive slows the key that was pushed back,
// alone, stores its factor, and an instance that claims the key adopts it;
// without adaptive mode nothing changes.
func TestPacerPushedBack(t *testing.T) {
	ctx := context.Background()
	clk := &stillClock{now: t0}
	slow := &memSlow{saved: map[string]float64{}}
	logs := &logRecords{}
	newPacer := func(adaptive bool) *keyed.Pacer[*memJob] {
		cfg := keyed.Config[*memJob]{
			Lane: "demo", Reader: &memReader{}, Pair: nopPair{}, Claims: keyed.Local{}, Clock: clk, Slow: slow, Logger: slog.New(logs),
			Start: func(context.Context, *memJob, func()) {}, LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: oneEach, MaxInflight: 1,
		}
		if adaptive {
			cfg.Adaptive = &keyed.Slowdown{Decrease: 0.5, Increase: 0.1, Min: 0.1, Interval: time.Second}
		}
		k, err := keyed.NewPacer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	off := newPacer(false)
	off.PushedBack(ctx, "a")
	if r := off.KeyLimit("a", t0).Rate; r != 2 || len(slow.saved) != 0 {
		t.Fatalf("without adaptive: rate %v, saved %v; want 2 and nothing", r, slow.saved)
	}
	on := newPacer(true)
	on.PushedBack(ctx, "a")
	if r := on.KeyLimit("a", t0).Rate; r != 1 {
		t.Fatalf("a's rate after a push-back: %v, want 1", r)
	}
	if r := on.KeyLimit("b", t0).Rate; r != 2 {
		t.Fatalf("b's rate: %v, want 2 (untouched)", r)
	}
	if slow.saved["a"] != 0.5 {
		t.Fatalf("saved %v, want a at 0.5", slow.saved)
	}
	// The operator reads the key's new rate and factor in the log.
	attrs, ok := logs.find("slowing it down")
	if !ok {
		t.Fatalf("no log of the slow-down; logged %v", logs.take())
	}
	if key, rate, f := attrs["key"].String(), attrs["rate"].Float64(), attrs["factor"].Float64(); key != "a" || rate != 1 || f != 0.5 {
		t.Fatalf("logged key %q rate %v factor %v, want a, 1 (2/s halved), 0.5", key, rate, f)
	}
	other := newPacer(true)
	other.Claim(ctx, "a")
	if r := other.KeyLimit("a", t0).Rate; r != 1 {
		t.Fatalf("a's rate on the instance that took it over: %v, want 1", r)
	}
}

// TestNewPacerNamesTheMissingField: a config without what the pacer needs
// is refused, naming the field.
func TestNewPacerNamesTheMissingField(t *testing.T) {
	full := func() keyed.Config[*memJob] {
		return keyed.Config[*memJob]{Lane: "demo", Reader: &memReader{}, Pair: nopPair{}, Claims: keyed.Local{},
			Start: func(context.Context, *memJob, func()) {}, LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: oneEach, MaxInflight: 1}
	}
	for _, c := range []struct {
		field string
		drop  func(*keyed.Config[*memJob])
	}{
		{"Reader", func(c *keyed.Config[*memJob]) { c.Reader = nil }},
		{"Pair", func(c *keyed.Config[*memJob]) { c.Pair = nil }},
		{"Claims", func(c *keyed.Config[*memJob]) { c.Claims = nil }},
		{"Start", func(c *keyed.Config[*memJob]) { c.Start = nil }},
		{"LaneLimit", func(c *keyed.Config[*memJob]) { c.LaneLimit = nil }},
		{"KeyLimit", func(c *keyed.Config[*memJob]) { c.KeyLimit = nil }},
		{"KeyOpts", func(c *keyed.Config[*memJob]) { c.KeyOpts = nil }},
		{"MaxInflight", func(c *keyed.Config[*memJob]) { c.MaxInflight = 0 }},
	} {
		cfg := full()
		c.drop(&cfg)
		_, err := keyed.NewPacer(cfg)
		if !errors.Is(err, keyed.ErrConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("without %s: %v", c.field, err)
		}
	}
	if _, err := keyed.NewPacer(full()); err != nil {
		t.Fatalf("full config: %v", err)
	}
}

// TestPacerAnnounceClaims: a key announced (a job stored here) is claimed
// when the claimer wakes, and only then; a key that is known already is
// told without a claim.
func TestPacerAnnounceClaims(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.r.add("a", "a1")
	h.k.Announce("a")
	if h.k.Key("a").Known {
		t.Fatal("a known before the claimer ran")
	}
	h.k.ClaimPending(h.ctx)
	if !h.k.Key("a").Known {
		t.Fatal("a announced, not claimed")
	}
	h.k.ClaimPending(h.ctx) // nothing pending: nothing changes
	if got := h.step(0); got.started != "a1" {
		t.Fatalf("a1: %+v", got)
	}
}

// logRecords is a slog handler that keeps the messages logged: a store
// that fails is seen only there.
type logRecords struct {
	mu   sync.Mutex
	msgs []string
	// attrs are each message's attributes, by key.
	attrs []map[string]slog.Value
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	attrs := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value
		return true
	})
	l.attrs = append(l.attrs, attrs)
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

func (l *logRecords) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.msgs
	l.msgs, l.attrs = nil, nil
	return out
}

// find returns the attributes of the first message logged that contains
// msg, and whether there is one.
func (l *logRecords) find(msg string) (map[string]slog.Value, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, m := range l.msgs {
		if strings.Contains(m, msg) {
			return l.attrs[i], true
		}
	}
	return nil, false
}

// failClaims refuses every claim.
type failClaims struct{ keyed.Local }

func (failClaims) Claim(context.Context, string, []string) ([]string, error) { return nil, errDown }
func (failClaims) Release(context.Context, string, string) error             { return errDown }

// failSlow fails every call.
type failSlow struct{}

func (failSlow) SaveSlow(context.Context, string, string, float64, time.Duration) error {
	return errDown
}
func (failSlow) LoadSlow(context.Context, string, []string) ([]keyed.SlowState, error) {
	return nil, errDown
}

// TestPacerWarnsWhenAStoreFails: each store call that fails is logged as a
// warning, and only a failure is.
func TestPacerWarnsWhenAStoreFails(t *testing.T) {
	ctx := context.Background()
	newPacer := func(logs *logRecords, claims keyed.Claims, slow keyed.SlowStore, pauser keyed.KeyPauser) *keyed.Pacer[*memJob] {
		k, err := keyed.NewPacer(keyed.Config[*memJob]{
			Lane: "demo", Reader: &memReader{}, Pair: nopPair{}, Claims: claims, Slow: slow, Pauser: pauser,
			Adaptive: &keyed.Slowdown{Decrease: 0.5, Increase: 0.1, Min: 0.1, Interval: time.Second},
			Start:    func(context.Context, *memJob, func()) {}, LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: oneEach,
			MaxInflight: 1, MaxPause: time.Minute, Clock: &stillClock{now: t0}, Logger: slog.New(logs),
		})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	for _, c := range []struct {
		name   string
		claims keyed.Claims
		slow   keyed.SlowStore
		pauser keyed.KeyPauser
		want   []string
	}{
		{"stores answer", keyed.Local{}, &memSlow{saved: map[string]float64{}}, &recPauser{}, []string{
			"target pushed back on the key; slowing it down", "downstream asked the key to wait",
		}},
		{"stores fail", failClaims{}, failSlow{}, &recPauser{err: errDown}, []string{
			"claiming keys failed; the sweep tries again",
			"target pushed back on the key; slowing it down",
			"storing the key's slow-down failed; other instances do not see it",
			"pausing the key in the shared state failed",
		}},
		{"slow-downs unreadable", keyed.Local{}, failSlow{}, &recPauser{}, []string{
			"reading keys' slow-downs failed; they start at their full rate",
			"target pushed back on the key; slowing it down",
			"storing the key's slow-down failed; other instances do not see it",
			"downstream asked the key to wait",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := &logRecords{}
			k := newPacer(logs, c.claims, c.slow, c.pauser)
			k.Claim(ctx, "a")
			k.PushedBack(ctx, "a")
			k.PauseKey(ctx, "a", time.Second)
			if got := logs.take(); !slices.Equal(got, c.want) {
				t.Fatalf("warnings %q, want %q", got, c.want)
			}
		})
	}
}

// TestPacerAdoptsAStoredSlowDownByItsAge: a factor another instance stored
// 2 s ago has recovered for 2 s by the time this one claims the key.
func TestPacerAdoptsAStoredSlowDownByItsAge(t *testing.T) {
	ctx := context.Background()
	slowdown := func() *keyed.Slowdown {
		return &keyed.Slowdown{Decrease: 0.5, Increase: 0.1, Min: 0.1, Interval: time.Second}
	}
	slow := &agedSlow{factor: 0.5, age: 2 * time.Second}
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: &memReader{}, Pair: nopPair{}, Claims: keyed.Local{}, Slow: slow, Adaptive: slowdown(),
		Start: func(context.Context, *memJob, func()) {}, LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: oneEach,
		MaxInflight: 1, Clock: &stillClock{now: t0},
	})
	if err != nil {
		t.Fatal(err)
	}
	k.Claim(ctx, "a")
	ref := slowdown()
	ref.Adopt("a", 0.5, t0.Add(-2*time.Second), t0)
	want := 2 * ref.Factor("a", t0)
	if got := k.KeyLimit("a", t0).Rate; math.Abs(got-want) > 1e-9 || want <= 1 || want >= 2 {
		t.Fatalf("a's rate %v, want %v (0.5 decided 2 s ago, recovering)", got, want)
	}
}

// agedSlow stores one factor decided age ago, for every key.
type agedSlow struct {
	factor float64
	age    time.Duration
}

func (s *agedSlow) SaveSlow(context.Context, string, string, float64, time.Duration) error {
	return nil
}
func (s *agedSlow) LoadSlow(_ context.Context, _ string, keys []string) ([]keyed.SlowState, error) {
	var out []keyed.SlowState
	for _, k := range keys {
		out = append(out, keyed.SlowState{Key: k, Factor: s.factor, Age: s.age})
	}
	return out, nil
}

// TestPacerReleaseIdleKeys: the claimer gives up the claim of a key with no
// job left, unless it got jobs again meanwhile, and then looks once more: a
// job stored meanwhile by another instance claims the key again.
func TestPacerReleaseIdleKeys(t *testing.T) {
	for _, c := range []struct {
		name      string
		between   func(h *harness) // after a goes idle, before the release
		released  bool
		known     bool
		releaseOK bool
		settling  bool // a's settled jobs' deletes still under way
	}{
		{"idle", func(*harness) {}, true, false, true, false},
		{"a job stored meanwhile", func(h *harness) { h.r.add("a", "a2") }, true, true, true, false},
		{"claimed again meanwhile", func(h *harness) { h.r.add("a", "a2"); h.k.Claim(h.ctx, "a") }, false, true, true, false},
		{"release fails", func(*harness) {}, true, false, false, false},
		// The claim is kept while a settled job of a may still be read
		// (its delete on its way), and given up at a later look.
		{"deletes under way", func(*harness) {}, false, false, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := &logRecords{}
			claims := &recClaims{fail: !c.releaseOK}
			clk := &stillClock{now: t0}
			r := &memReader{}
			k, err := keyed.NewPacer(keyed.Config[*memJob]{
				Lane: "demo", Reader: r, Pair: &bucket.Memory{Clock: clk}, Claims: claims, Clock: clk, Logger: slog.New(logs),
				Start:     func(_ context.Context, _ *memJob, done func()) { done() },
				LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: oneEach, MaxInflight: 1,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			k.Claim(ctx, "a")
			laneNext := t0
			k.Step(ctx, &laneNext) // a has no job: idle
			if idle := k.Idled(); !slices.Equal(idle, []string{"a"}) {
				t.Fatalf("idle %v, want [a]", idle)
			}
			c.between(&harness{ctx: ctx, r: r, k: k})
			logs.take()
			if c.settling {
				r.mu.Lock()
				r.settlingErr = context.DeadlineExceeded
				r.mu.Unlock()
			}
			k.Release(ctx)
			if rel := claims.releasedKeys(); (len(rel) == 1) != c.released {
				t.Fatalf("released %v, want released %v", rel, c.released)
			}
			if got := k.Key("a").Known; got != c.known {
				t.Fatalf("a known %v, want %v", got, c.known)
			}
			if c.settling {
				if idle := k.Idled(); !slices.Equal(idle, []string{"a"}) {
					t.Fatalf("idle %v while its deletes are under way, want [a] (released later)", idle)
				}
				r.mu.Lock()
				r.settlingErr = nil
				r.mu.Unlock()
				k.Release(ctx)
				if rel := claims.releasedKeys(); len(rel) != 1 {
					t.Fatalf("released %v once the deletes ended, want [a]", rel)
				}
			}
			if len(k.Idled()) != 0 {
				t.Fatalf("still idle: %v", k.Idled())
			}
			want := []string(nil)
			if !c.releaseOK {
				want = []string{"releasing a key failed; its claim lapses by itself"}
			}
			if c.settling {
				want = []string{"a key's settled jobs are still being deleted; releasing it later"}
			}
			if got := logs.take(); !slices.Equal(got, want) {
				t.Fatalf("logged %q, want %q", got, want)
			}
		})
	}
}

// TestPacerRefreshesItsLeases: the leases of the jobs in flight are
// refreshed, all of them in one call; a failed refresh is logged.
func TestPacerRefreshesItsLeases(t *testing.T) {
	h := newHarness(t, harnessOpts{leases: true, keyOpts: twoEach})
	h.r.add("a", "a1")
	h.r.add("b", "b1")
	h.k.Claim(h.ctx, "a", "b")
	h.step(0)
	h.step(0)
	h.k.RefreshLeases(h.ctx)
	if got := h.logs.take(); len(got) != 0 {
		t.Fatalf("a refresh that worked logged %q", got)
	}
	h.settle("a1")
	h.leases.refreshErr = errDown
	h.k.RefreshLeases(h.ctx)
	if !slices.Equal(h.leases.refreshed, []int{2, 1}) {
		t.Fatalf("refreshed %v, want [2 1]", h.leases.refreshed)
	}
	if got := h.logs.take(); !slices.Equal(got, []string{"refreshing in-flight leases failed"}) {
		t.Fatalf("logged %q", got)
	}
	// Without fleet leases there is nothing to refresh.
	newHarness(t, harnessOpts{}).k.RefreshLeases(h.ctx)
}

// TestPacerStartsInTakeOrder: a key's job whose goroutine wakes after its
// slot, and after the slot of the key's next job, goes back (a slot
// missed); the next job, taken after it, must not have started first.
// Then, woken on time, the two start in order. (TestKeyedStartsInTakeOrder
// runs the same on a JetStream stream.)
func TestPacerStartsInTakeOrder(t *testing.T) {
	ctx := context.Background()
	r := &memReader{}
	r.add("k", "j0")
	r.add("k", "j1")
	clk := &gatedClock{now: t0, gates: map[time.Time]chan struct{}{}}
	var mu sync.Mutex
	var started []string
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: r, Pair: nopPair{}, Claims: keyed.Local{}, Clock: clk,
		Start: func(_ context.Context, j *memJob, done func()) {
			mu.Lock()
			started = append(started, j.id)
			mu.Unlock()
			done()
		},
		LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: func(string) keyed.Opts { return keyed.Opts{MaxInflight: 4} }, MaxInflight: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.onRequeue = k.Requeue
	r.mu.Unlock()
	startedNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(started)
	}
	const period, maxLate = 100 * time.Millisecond, 20 * time.Millisecond
	takeTwo := func(base time.Time) (due [2]time.Time) {
		for i := range due {
			due[i] = base.Add(time.Duration(i+1) * period)
			if _, ok := k.TakeNext(ctx, "k", due[i], maxLate); !ok {
				t.Fatalf("job %d: not read or not taken", i)
			}
		}
		return due
	}
	due := takeTwo(t0)
	// j1's goroutine wakes at its slot, j0's not yet: j1 waits for j0's
	// decision (a j1 that did not would start now, and be seen below).
	clk.wakeAt(due[1], due[1].Add(time.Millisecond))
	// j0 wakes a period late: its slot is missed and it goes back.
	clk.wakeAt(due[0], due[1].Add(time.Millisecond))
	k.WaitStarts()
	if s := startedNow(); len(s) != 0 {
		t.Fatalf("started %v while j0, the key's first job, went back: a later job of the key started before it", s)
	}
	if k.Missed() != 1 || k.Inflight() != 0 {
		t.Fatalf("missed %d, in flight %d; want 1 (j0's slot) and 0", k.Missed(), k.Inflight())
	}
	// Both read again, from j0; woken on time they start in order.
	due = takeTwo(due[1].Add(time.Millisecond))
	clk.wakeAt(due[0], due[0])
	eventually(t, 5*time.Second, "j0 starts", func() bool { return len(startedNow()) == 1 })
	clk.wakeAt(due[1], due[1])
	k.WaitStarts()
	if s := startedNow(); !slices.Equal(s, []string{"j0", "j1"}) {
		t.Fatalf("started %v, want [j0 j1]", s)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestPacerLatenessBound: a job woken exactly at its lateness bound after
// its slot (the shorter period, 100 ms) still starts; later it would not.
func TestPacerLatenessBound(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.r.add("a", "a1")
	h.r.add("b", "b1")
	h.k.Claim(h.ctx, "a", "b")
	h.step(0)
	// b1's slot is at 100 ms; its wait begins at 95 ms and ends 105 ms
	// later: 100 ms late, the bound.
	h.clk.mu.Lock()
	h.clk.lateBy = 105 * ms
	h.clk.mu.Unlock()
	if got := h.step(100*ms - keyed.Lookahead); got.started != "b1" {
		t.Fatalf("woken at the bound: %+v, want b1 started", got)
	}
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	if late := h.obs.late[len(h.obs.late)-1]; late != 100*ms {
		t.Fatalf("started %v late, want 100ms", late)
	}
}

// positive keeps the waits longer than zero (a wait of zero returns at
// once).
func positive(ds []time.Duration) []time.Duration {
	return slices.DeleteFunc(ds, func(d time.Duration) bool { return d <= 0 })
}

// TestPacerLeaseWithoutJobGoesBack: a step takes a key's leases while it
// reads the key's next job (two round trips that overlap); when there is
// no job to read, or the read fails, the leases go back.
func TestPacerLeaseWithoutJobGoesBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail bool
	}{{"no job", false}, {"read failed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{leases: true})
			h.r.add("a", "a1")
			h.k.Claim(h.ctx, "a")
			h.r.remove("a1") // settled elsewhere since
			if tc.fail {
				h.r.mu.Lock()
				h.r.nextErr = errDown
				h.r.mu.Unlock()
			}
			if got := h.step(0); got.started != "" {
				t.Fatalf("started %q with nothing to read", got.started)
			}
			h.k.WaitReleases()
			if n := h.leases.count(); n != 0 {
				t.Fatalf("%d leases held after a step that read no job, want 0", n)
			}
			if n := h.k.HeldLeases(); n != 0 {
				t.Fatalf("%d tokens kept after a step that read no job, want 0", n)
			}
		})
	}
}

// TestPacerLateStartDelaysAJobReservedBefore: j1 was reserved before j0,
// the key's job before it, started 10 ms after its slot: j1's slot does not
// count that lateness, so j1 starts 10 ms after its own slot, not at it.
func TestPacerLateStartDelaysAJobReservedBefore(t *testing.T) {
	ctx := context.Background()
	r := &memReader{}
	r.add("k", "j0")
	r.add("k", "j1")
	clk := &gatedClock{now: t0, gates: map[time.Time]chan struct{}{}}
	var mu sync.Mutex
	started := map[string]time.Time{}
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: r, Pair: nopPair{}, Claims: keyed.Local{}, Clock: clk,
		Start: func(_ context.Context, j *memJob, done func()) {
			mu.Lock()
			started[j.id] = clk.Now()
			mu.Unlock()
			done()
		},
		LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: func(string) keyed.Opts { return keyed.Opts{MaxInflight: 4} }, MaxInflight: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	startedAt := func(id string) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		at, ok := started[id]
		return at, ok
	}
	const period, maxLate = 500 * time.Millisecond, 100 * time.Millisecond
	due0, due1 := t0.Add(period), t0.Add(2*period)
	for _, due := range []time.Time{due0, due1} {
		if _, ok := k.TakeNext(ctx, "k", due, maxLate); !ok {
			t.Fatal("not taken")
		}
	}
	clk.wakeAt(due0, due0.Add(10*time.Millisecond)) // j0 10 ms late
	eventually(t, 5*time.Second, "j0 starts", func() bool { _, ok := startedAt("j0"); return ok })
	clk.wakeAt(due1, due1) // j1's slot: it waits 10 ms more
	late := due1.Add(10 * time.Millisecond)
	eventually(t, 5*time.Second, "j1 waiting for its slot moved on", func() bool {
		clk.mu.Lock()
		defer clk.mu.Unlock()
		_, ok := clk.gates[late]
		return ok
	})
	if _, ok := startedAt("j1"); ok {
		t.Fatal("j1 started at its slot, 490 ms after j0's start")
	}
	clk.wakeAt(late, late)
	k.WaitStarts()
	if at, ok := startedAt("j1"); !ok || !at.Equal(late) {
		t.Fatalf("j1 started %v (%v), want at %v: a key period after j0's start", at.Sub(t0), ok, late.Sub(t0))
	}
	if k.Missed() != 0 {
		t.Fatalf("%d slots given up; want none", k.Missed())
	}
}
