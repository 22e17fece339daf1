package keyed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/leaky"
)

// Pacer drives a keyed lane (per_key), as leaky.Drain drives an unkeyed
// one: instead of one consumer and one drain, it asks Sched which key
// starts next, reads that key's next job (Reader), reserves its slot under
// the key's and the lane's limits in one step (PairReserver), and starts it
// at the slot (Config.Start). Keys are claimed (Claims) so that one
// instance at a time reads a key: its jobs then start in order.
//
// Every job chosen holds one of MaxInflight permits (and, in pull mode, a
// waiting worker's claim) from its choice until it settles or goes back;
// a permit is given back in one place (permit.giveBack), once.
//
// The package is pure: the queue, the state stores and the targets come in
// through the small interfaces below (their adapters live in lane and in
// redisclaims). Create a Pacer with NewPacer, Run it once. Its methods are
// safe for concurrent use.
type Pacer[T Item] struct {
	cfg   Config[T]
	log   *slog.Logger
	sched *Sched
	// slow is per_key.adaptive (nil when off): keys' own slow-downs.
	slow *Slowdown
	// permits bounds the lane's dispatches on this instance (max_inflight).
	permits chan struct{}
	wake    chan struct{}

	mu      sync.Mutex
	cursor  map[string]uint64 // per claimed key: the next sequence to read
	held    map[string]T      // per claimed key: its next job, read, not started
	tries   map[uint64]int    // ordered keys: failed attempts of a job retried in place
	pending map[string]struct{}
	idled   map[string]struct{} // keys with no jobs left, to release
	// epoch per key moves when one of its jobs goes back (a slot given
	// up, a wait in place): its later jobs waiting for their slots then go
	// back too, so that they never start before it (FIFO per key).
	epoch map[string]uint64
	// decided per key is closed once the key's last job taken has started
	// or gone back (startAt). The next job taken waits for it at its slot:
	// a job whose goroutine woke late (a stalled thread holds its timer)
	// and goes back must not find a later job of its key started already.
	decided map[string]chan struct{}
	// giveBackFn is giveBack, made once (a method value allocates).
	giveBackFn func(unclaim bool)
	// late per key: how long after their slots' theoretical times its jobs
	// started, carried into the key's state by its next reservation (G1
	// per key counts a start where it happened).
	late map[string]lateness

	// leases are the fleet's in-flight leases this instance holds (token →
	// key), refreshed by the claimer (Config.Leases).
	leases   map[string]string
	leaseSeq atomic.Uint64

	inflight atomic.Int64
	missed   atomic.Uint64 // slots given up: woken too late for them
	// waiting counts the jobs waiting for their slot on their own
	// goroutines (startAt).
	waiting sync.WaitGroup
	// releases counts the lease releases under way off the scheduling
	// loop (releaseLeaseAsync).
	releases sync.WaitGroup
}

// Item is one stored job as the pacer sees it.
type Item interface {
	// Seq is its position in the lane's stream: a key's jobs in order.
	Seq() uint64
	// Release hands it back unstarted: it stays stored, its key's next.
	Release() error
	// AddAttempts counts n failed attempts made in place before this read.
	AddAttempts(n int)
}

// Reader reads a keyed lane's stored jobs by key.
type Reader[T Item] interface {
	// Keys lists the keys with stored jobs.
	Keys(ctx context.Context) ([]string, error)
	// Next returns key's first job at or after sequence from; ok is false
	// when it has none.
	Next(ctx context.Context, key string, from uint64) (it T, ok bool, err error)
	// Settling waits until the deletes of key's settled jobs have ended
	// (a settled job's delete may still be on its way when its dispatch
	// ends): the key's claim is given up only then, so that no instance
	// that takes it over reads one of them again.
	Settling(ctx context.Context, key string) error
	// Tries, SetTries and ClearTries keep an ordered key's job's failed
	// attempts made in place, across restarts and instances.
	Tries(ctx context.Context, seq uint64) (int, error)
	SetTries(ctx context.Context, seq uint64, n int) error
	ClearTries(ctx context.Context, seq uint64) error
}

// PairReserver reserves a key's slot under its own and the lane's limit in
// one step, carrying the key's late starts into its state first
// (bucket.PairStore).
type PairReserver interface {
	ReservePair(ctx context.Context, k bucket.Key, ll, kl bucket.Limit, ahead, carry time.Duration) (bucket.PairReservation, error)
}

// KeyPauser pushes a key's shared state past a pause (bucket.Store), so
// that no instance starts the key meanwhile.
type KeyPauser interface {
	Pause(ctx context.Context, k bucket.Key, l bucket.Limit, d time.Duration) error
}

// Workers are a pull-mode lane's waiting workers (dispatch.Pull): a slot is
// reserved only for a worker waiting here.
type Workers interface {
	// Claim waits until a worker waits here for a job that no job taken
	// before is meant for, and claims up to max of them.
	Claim(ctx context.Context, max int) (int, error)
	// Unclaim gives back n claims of jobs that did not start.
	Unclaim(n int)
	// Bounce answers the workers that waited here for d or more, so that
	// they ask again (perhaps another instance).
	Bounce(d time.Duration) int
	// StopPulls answers every worker waiting here (the pacer stopped).
	StopPulls()
}

// Backlog counts a lane's stored jobs, as last read at most maxAge ago.
type Backlog interface {
	Backlog(ctx context.Context, lane string, maxAge time.Duration) (int64, error)
}

// Config configures a Pacer of items of type T. Lane, Reader, Pair,
// Claims, Start, LaneLimit, KeyLimit, KeyOpts and MaxInflight are needed;
// the rest may stay zero.
type Config[T Item] struct {
	// Lane names the lane in the stores and in logs.
	Lane   string
	Reader Reader[T]
	Pair   PairReserver
	Claims Claims
	// Leases bounds the lane's and keys' jobs in flight across the fleet;
	// nil bounds them on this instance only (one instance).
	Leases Leases
	// Slow shares keys' slow-downs between instances; nil keeps them here.
	Slow SlowStore
	// Adaptive is per_key.adaptive's settings; nil when off.
	Adaptive *Slowdown
	// Pauser holds a key's shared state while its downstream asked it to
	// wait (PauseKey); nil pauses it on this instance only.
	Pauser KeyPauser
	// Workers is set on a pull-mode lane only; Backlog then tells whether
	// waiting workers should ask elsewhere (Leases set: a fleet).
	Workers Workers
	Backlog Backlog
	// Start starts one job's dispatch, as leaky.Config.Start.
	Start leaky.Starter[T]
	// Held, when set, returns a channel that closes when an operator's
	// hold on the lane ends, or nil while the lane is not held (as
	// leaky.Config.Held): no key is chosen and no slot taken meanwhile, and
	// a job whose slot came while the lane was held goes back.
	Held func() <-chan struct{}
	// Assigned, when set, is told the slot each job is given.
	Assigned func(it T, s leaky.Slot)
	// LaneLimit is the lane's limit now; KeyLimit a key's (per_key or its
	// override), before its adaptive factor; KeyOpts its scheduling
	// settings.
	LaneLimit func() bucket.Limit
	KeyLimit  func(key string) bucket.Limit
	KeyOpts   func(key string) Opts
	// MaxInflight bounds the lane's dispatches on this instance; at least 1.
	MaxInflight int
	// Ordered: a key's failing job waits in place (per_key.ordered), and
	// its failed attempts are read back when it is first read.
	Ordered bool
	// MaxPause bounds a key's pause (PauseKey).
	MaxPause time.Duration
	// Instance prefixes the tokens of the leases this instance holds.
	Instance string
	// Clock is the time source; nil means clock.Real.
	Clock    clock.Clock
	Logger   *slog.Logger
	Observer leaky.Observer
}

// ErrConfig says a Config lacks what a Pacer needs.
var ErrConfig = errors.New("keyed: invalid pacer config")

// NewPacer checks cfg and returns a Pacer. It starts nothing.
func NewPacer[T Item](cfg Config[T]) (*Pacer[T], error) {
	// An if chain, not a switch: the mutation run's coverage has no
	// counter for a case's expression (docs/MUTATION.md).
	if cfg.Reader == nil {
		return nil, errorField("Reader")
	}
	if cfg.Pair == nil {
		return nil, errorField("Pair")
	}
	if cfg.Claims == nil {
		return nil, errorField("Claims")
	}
	if cfg.Start == nil {
		return nil, errorField("Start")
	}
	if cfg.LaneLimit == nil {
		return nil, errorField("LaneLimit")
	}
	if cfg.KeyLimit == nil {
		return nil, errorField("KeyLimit")
	}
	if cfg.KeyOpts == nil {
		return nil, errorField("KeyOpts")
	}
	if cfg.MaxInflight < 1 {
		return nil, errorField("MaxInflight")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	k := &Pacer[T]{
		cfg: cfg, log: cfg.Logger, sched: New(cfg.KeyOpts), slow: cfg.Adaptive,
		permits: make(chan struct{}, cfg.MaxInflight), wake: make(chan struct{}, 1),
		cursor: map[string]uint64{}, held: map[string]T{}, tries: map[uint64]int{}, pending: map[string]struct{}{},
		leases: map[string]string{}, idled: map[string]struct{}{}, epoch: map[string]uint64{},
		decided: map[string]chan struct{}{}, late: map[string]lateness{},
	}
	k.giveBackFn = k.giveBack
	return k, nil
}

func errorField(name string) error { return fmt.Errorf("%w: %s is required", ErrConfig, name) }

type nopObserver struct{}

func (nopObserver) Started(time.Duration) {}
func (nopObserver) Reserved(int)          {}
func (nopObserver) PacerDown(bool, error) {}

// sweepEvery is how often an instance lists the keys with stored jobs and
// claims the ones nobody holds (after a crash, or at start); refreshEvery is
// how often it refreshes its claims (liveness and owner keys).
const (
	sweepEvery   = 5 * time.Second
	refreshEvery = 2 * time.Second
	ownEvery     = time.Minute
)

// Announce hears that key has a new job (stored by this instance). It does
// not block: the claim is made by the claimer goroutine.
func (k *Pacer[T]) Announce(key string) {
	k.mu.Lock()
	k.pending[key] = struct{}{}
	k.mu.Unlock()
	k.poke()
}

func (k *Pacer[T]) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Requeue hears that a job of key was handed back to wait in place: it is
// the key's next job again.
func (k *Pacer[T]) Requeue(key string, seq uint64) {
	k.mu.Lock()
	if c, ok := k.cursor[key]; !ok || seq < c {
		// Read again from it; the key's later jobs already read or
		// reserved go back too (a new epoch).
		k.cursor[key] = seq
		delete(k.held, key)
		k.epoch[key]++
	}
	k.mu.Unlock()
	k.sched.Add(key, k.cfg.Clock.Now())
}

// Run drives the lane until ctx ends, then waits for its dispatches: the
// jobs waiting for their slots go back, and the ones started settle.
// dispatch is handed to Start: the dispatches may outlive ctx; the calls to
// the stores made for them (lease releases and refreshes) use its values,
// not its cancellation.
func (k *Pacer[T]) Run(ctx, dispatch context.Context) {
	var claimer sync.WaitGroup
	claimer.Go(func() { k.claimer(ctx) })
	k.loop(ctx, dispatch)
	if k.cfg.Workers != nil {
		k.cfg.Workers.StopPulls()
	}
	// The claimer stops with ctx; the leases of the deliveries still in
	// flight stay refreshed until they settle, however long that takes.
	drained := make(chan struct{})
	var refresher sync.WaitGroup
	refresher.Go(func() { k.refreshUntil(context.WithoutCancel(dispatch), drained, refreshEvery) })
	k.waiting.Wait()
	close(drained)
	refresher.Wait()
	claimer.Wait()
	k.releases.Wait()
	// Hand back the jobs read and not started: they stay in the stream.
	k.mu.Lock()
	k.held = map[string]T{}
	k.mu.Unlock()
	for range cap(k.permits) {
		k.permits <- struct{}{}
	}
}

// claimer claims keys that got jobs, sweeps for keys nobody holds, and
// keeps this instance's claims alive.
func (k *Pacer[T]) claimer(ctx context.Context) {
	name := k.cfg.Lane
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	refresh := time.NewTicker(refreshEvery)
	defer refresh.Stop()
	lastOwn := time.Now()
	k.sweep(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		case <-sweep.C:
			k.sweep(ctx)
			k.pruneLate(k.cfg.Clock.Now())
			if k.slow != nil {
				k.slow.Sweep(k.cfg.Clock.Now())
			}
		case <-refresh.C:
			if time.Since(lastOwn) >= ownEvery {
				lastOwn = time.Now()
				keys := k.sched.Keys()
				got, err := k.cfg.Claims.Claim(ctx, name, keys)
				if err == nil {
					k.dropLost(keys, got)
				}
			} else {
				_, _ = k.cfg.Claims.Claim(ctx, name, nil)
			}
			k.refreshLeases(ctx)
		}
		k.claimPending(ctx)
		k.release(ctx)
	}
}

// claimPending claims the keys announced since it last ran.
func (k *Pacer[T]) claimPending(ctx context.Context) {
	k.mu.Lock()
	var keys []string
	for key := range k.pending {
		keys = append(keys, key)
	}
	clear(k.pending)
	k.mu.Unlock()
	k.claim(ctx, keys) // none: claims nothing
}

// claim takes keys that got jobs; a key this instance already reads only
// needs telling.
func (k *Pacer[T]) claim(ctx context.Context, keys []string) {
	now := k.cfg.Clock.Now()
	var unknown []string
	for _, key := range keys {
		if k.sched.Key(key).Known {
			k.sched.Add(key, now)
		} else {
			unknown = append(unknown, key)
		}
	}
	if len(unknown) == 0 {
		return
	}
	got, err := k.cfg.Claims.Claim(ctx, k.cfg.Lane, unknown)
	if err != nil {
		k.log.Warn("claiming keys failed; the sweep tries again", "keys", len(unknown), "err", err)
	}
	k.loadSlow(ctx, got)
	now = k.cfg.Clock.Now()
	for _, key := range got {
		k.sched.Add(key, now)
	}
}

// loadSlow adopts the slow-downs other instances stored for keys, which
// this one just claimed.
func (k *Pacer[T]) loadSlow(ctx context.Context, keys []string) {
	if k.slow == nil || k.cfg.Slow == nil || len(keys) == 0 {
		return
	}
	got, err := k.cfg.Slow.LoadSlow(ctx, k.cfg.Lane, keys)
	if err != nil {
		k.log.Warn("reading keys' slow-downs failed; they start at their full rate", "keys", len(keys), "err", err)
	}
	now := k.cfg.Clock.Now()
	for _, s := range got {
		k.slow.Adopt(s.Key, s.Factor, now.Add(-s.Age), now)
	}
}

// PushedBack lowers key's rate after its downstream pushed back (at most
// once per adaptive.interval), and stores the factor for the other
// instances. Without per_key.adaptive it does nothing.
func (k *Pacer[T]) PushedBack(ctx context.Context, key string) {
	if k.slow == nil {
		return
	}
	f, changed := k.slow.Limited(key, k.cfg.Clock.Now())
	if !changed {
		return
	}
	k.log.Info("target pushed back on the key; slowing it down", "key", key, "rate", k.cfg.KeyLimit(key).Rate*f, "factor", f)
	if k.cfg.Slow == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := k.cfg.Slow.SaveSlow(ctx, k.cfg.Lane, key, f, k.slow.Recovery(f)); err != nil {
		k.log.Warn("storing the key's slow-down failed; other instances do not see it", "key", key, "err", err)
	}
}

// KeyLimit is key's limit at now: its rate (per_key, or its override)
// times its adaptive factor.
func (k *Pacer[T]) KeyLimit(key string, now time.Time) bucket.Limit {
	lim := k.cfg.KeyLimit(key)
	if k.slow != nil {
		lim.Rate = max(lim.Rate*k.slow.Factor(key, now), bucket.MinRate)
	}
	return lim
}

// sweep claims the keys with stored jobs that no live instance holds.
func (k *Pacer[T]) sweep(ctx context.Context) {
	keys, err := k.cfg.Reader.Keys(ctx)
	if err != nil {
		k.log.Debug("listing keys with jobs failed", "err", err)
		return
	}
	k.claim(ctx, keys)
}

// dropLost forgets the keys another instance took over (this one stopped
// answering for longer than the claims' liveness).
func (k *Pacer[T]) dropLost(had, kept []string) {
	still := make(map[string]bool, len(kept))
	for _, key := range kept {
		still[key] = true
	}
	for _, key := range had {
		if !still[key] && k.sched.Forget(key) {
			k.log.Warn("key taken over by another instance", "key", key)
			k.forget(key)
		}
	}
}

// forget drops what this instance remembers of key; lateness not yet
// carried into its state stays until it no longer matters (pruneLate).
func (k *Pacer[T]) forget(key string) {
	k.mu.Lock()
	delete(k.cursor, key)
	delete(k.held, key)
	delete(k.epoch, key)
	if l := k.late[key]; l.total == l.stored {
		delete(k.late, key)
	}
	k.mu.Unlock()
}

// lateness is a key's starts' lateness after their slots' theoretical
// times: total recorded, stored of it carried into the key's state (by a
// reservation granted), until when what is not stored still matters (the
// key's state after its last start, moved on by it).
type lateness struct {
	total, stored time.Duration
	until         time.Time
}

// owedLate returns the lateness of key's starts not yet in its state, and
// the total it is part of (what a reservation that carries it has seen).
func (k *Pacer[T]) owedLate(key string) (owed, seen time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.late[key]
	return l.total - l.stored, l.total
}

// carried records that key's state holds its starts' lateness up to seen.
func (k *Pacer[T]) carried(key string, seen time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l, ok := k.late[key]; ok {
		l.stored = max(l.stored, seen)
		k.late[key] = l
	}
}

// lateSince is the lateness recorded for key since a reservation saw seen:
// starts its slot did not count, which the job of that reservation waits
// out.
func (k *Pacer[T]) lateSince(key string, seen time.Duration) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return max(k.late[key].total-seen, 0)
}

// recordLate counts a start of key d after its slot's theoretical time;
// until is when that no longer moves the key's next slot.
func (k *Pacer[T]) recordLate(key string, d time.Duration, until time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.late[key]
	l.total += d
	l.until = until
	k.late[key] = l
}

// pruneLate forgets the lateness of keys forgotten whose state has passed
// it by now.
func (k *Pacer[T]) pruneLate(now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, l := range k.late {
		if _, active := k.cursor[key]; !active && !l.until.After(now) {
			delete(k.late, key)
		}
	}
}

// markIdle hands key, which has no jobs left here, to the claimer to
// release (claims and releases are made by one goroutine, in order).
func (k *Pacer[T]) markIdle(key string) {
	k.mu.Lock()
	k.idled[key] = struct{}{}
	k.mu.Unlock()
	k.poke()
}

// release gives up the claims of the keys that went idle, unless they got
// jobs again meanwhile, then looks once more: a job stored by another
// instance meanwhile (which could not claim the key) is found and the key
// claimed again.
func (k *Pacer[T]) release(ctx context.Context) {
	k.mu.Lock()
	keys := make([]string, 0, len(k.idled))
	for key := range k.idled {
		keys = append(keys, key)
	}
	clear(k.idled)
	k.mu.Unlock()
	var again []string
	for _, key := range keys {
		if k.sched.Key(key).Known {
			continue // it got jobs again: still this instance's
		}
		k.forget(key)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if err := k.cfg.Reader.Settling(rctx, key); err != nil {
			// Its deletes are slow: the claim is kept, and given up at a
			// later look.
			k.log.Debug("a key's settled jobs are still being deleted; releasing it later", "key", key, "err", err)
			cancel()
			k.markIdle(key)
			continue
		}
		if err := k.cfg.Claims.Release(rctx, k.cfg.Lane, key); err != nil {
			k.log.Debug("releasing a key failed; its claim lapses by itself", "key", key, "err", err)
		}
		if _, ok, err := k.cfg.Reader.Next(rctx, key, 1); err != nil || ok {
			again = append(again, key)
		}
		cancel()
	}
	k.claim(ctx, again) // none: claims nothing
}

// leasePoll is how long a key waits when the fleet has max_inflight of its
// jobs (or of the lane's) in flight: leases freed on other instances are
// not announced, so the key looks again after this.
const leasePoll = 20 * time.Millisecond

// acquire takes a fleet-wide in-flight lease of the lane and of key
// (Config.Leases); without Leases this instance's own bounds are the only
// ones and the token is "".
func (k *Pacer[T]) acquire(ctx context.Context, key string) (string, Full, error) {
	if k.cfg.Leases == nil {
		return "", Taken, nil
	}
	tok := k.cfg.Instance + "-" + strconv.FormatUint(k.leaseSeq.Add(1), 36)
	full, err := k.cfg.Leases.Acquire(ctx, k.cfg.Lane, key, tok, k.cfg.MaxInflight, k.cfg.KeyOpts(key).MaxInflight)
	if err != nil {
		// The script may have run and the answer got lost (a timeout, a
		// broken connection): give the token's leases back, or they stay
		// held for a whole lease with nothing to release them.
		k.releaseLeaseAsync(ctx, key, tok)
		return "", full, err
	}
	if full != Taken {
		return "", full, nil
	}
	k.mu.Lock()
	k.leases[tok] = key
	k.mu.Unlock()
	return tok, Taken, nil
}

// acquireWhile starts acquire of key's leases on a goroutine of its own
// and returns its answer's wait; without Leases there is no round trip to
// overlap, and acquire runs when the answer is asked for.
func (k *Pacer[T]) acquireWhile(ctx context.Context, key string) func() (string, Full, error) {
	if k.cfg.Leases == nil {
		return func() (string, Full, error) { return k.acquire(ctx, key) }
	}
	var (
		tok  string
		full Full
		err  error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tok, full, err = k.acquire(ctx, key)
	}()
	return func() (string, Full, error) {
		<-done
		return tok, full, err
	}
}

// releaseLease gives back the fleet-wide lease tok of key ("" holds none).
func (k *Pacer[T]) releaseLease(ctx context.Context, key, tok string) {
	if tok == "" {
		return
	}
	k.mu.Lock()
	delete(k.leases, tok)
	k.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseLeaseTimeout)
	defer cancel()
	if err := k.cfg.Leases.ReleaseLease(ctx, k.cfg.Lane, key, tok); err != nil {
		k.log.Warn("giving back an in-flight lease failed; it lapses by itself", "key", key, "err", err)
	}
}

// releaseLeaseTimeout bounds a lease release made off the scheduling loop.
const releaseLeaseTimeout = time.Second

// releaseLeaseAsync gives back the fleet-wide lease tok of key ("" holds
// none) on a goroutine of its own, so that the scheduling loop never waits
// for the state store; Run waits for it at a stop.
func (k *Pacer[T]) releaseLeaseAsync(ctx context.Context, key, tok string) {
	if tok == "" {
		return
	}
	k.mu.Lock()
	delete(k.leases, tok)
	k.mu.Unlock()
	k.releases.Go(func() { k.releaseLease(ctx, key, tok) })
}

// refreshUntil refreshes the leases held every period until stop closes:
// at a stop, while deliveries settle after the claimer ended.
func (k *Pacer[T]) refreshUntil(ctx context.Context, stop <-chan struct{}, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, period)
			k.refreshLeases(rctx)
			cancel()
		}
	}
}

// refreshLeases keeps this instance's fleet-wide leases alive while their
// jobs are in flight.
func (k *Pacer[T]) refreshLeases(ctx context.Context) {
	if k.cfg.Leases == nil {
		return
	}
	k.mu.Lock()
	held := maps.Clone(k.leases)
	k.mu.Unlock()
	if err := k.cfg.Leases.Refresh(ctx, k.cfg.Lane, held); err != nil {
		k.log.Warn("refreshing in-flight leases failed", "leases", len(held), "err", err)
	}
}

// retryWait is how long a key waits after its read or its reservation
// failed (JetStream or the state store away).
const retryWait = 100 * time.Millisecond

// lookahead is how far ahead of a slot the loop chooses its key and
// reserves it: the read and the reservation then happen before the slot,
// which starts exactly on time (a reservation made after its key's slot
// would push every later slot of the key back by the delay). It is also
// how long a key's first job may wait behind other keys: a pair
// reservation counts the lane's slot at the key's due time, so the lane's
// state is taken up to lookahead ahead of now by a key that reserves early,
// and a cold key's first slot comes after it. 5 ms covers a direct get and
// a reservation on a loaded machine; at 50 ms a cold key's first job waited
// about 48 ms behind a hot key (throttler-bench --only keyed, BENCHMARKS.md).
const lookahead = 5 * time.Millisecond

// rest is what the loop does after a step: nothing (go on at once), wait
// until the scheduler has news or d passed (wake), or sleep d.
type rest struct {
	d    time.Duration
	wake bool
	stop bool // ctx ended
}

// maxSteps bounds the steps under way at once (concurrentSteps): the reads
// and the reservations of that many keys overlap, so that a lane whose cap
// does not bind drains at the pace of its round trips times maxSteps, not
// one round trip (a direct get, a lease and a reservation) per job.
const maxSteps = 32

// concurrentSteps is how many steps may be under way at once under the
// lane's limit l: as many as lane slots fit in the lookahead, so that the
// lane's state is never taken further ahead than it is by one step (a key
// that reserves early takes it up to lookahead ahead of now, see
// lookahead). A lane with a period of lookahead or more takes one step at
// a time: each chooses at the lane's next slot, as a cold key's first job
// needs.
func concurrentSteps(l bucket.Limit) int {
	// A valid limit's period is at least 1 ns; max keeps an invalid one
	// from dividing by zero.
	return min(max(int(lookahead/max(l.Period(), 1)), 1), maxSteps)
}

// steps is the loop's state shared with the steps under way: the lane's
// next slot as the last reservation saw it, how long the loop rests after
// a step's refusal, and how many steps run.
type steps struct {
	mu       sync.Mutex
	laneNext time.Time
	until    time.Time // no choice before then (a step said rest)
	running  int
	// done hears that a step ended: a slot for the next one, and keys
	// whose state it changed (they may be due before the loop's wait).
	done chan struct{}
	work chan func()
	wg   sync.WaitGroup
}

// finish ends a step that asked to rest r from now; tell says it ran off
// the loop's goroutine, which then hears of it (done).
func (s *steps) finish(r rest, now time.Time, tell bool) {
	s.mu.Lock()
	s.running--
	if r.d > 0 && now.Add(r.d).After(s.until) {
		s.until = now.Add(r.d)
	}
	s.mu.Unlock()
	if !tell {
		return
	}
	select {
	case s.done <- struct{}{}:
	default:
	}
}

// loop chooses keys and reserves their slots a little ahead of the lane's
// next slot; each job waits for its slot on its own goroutine, so a key
// whose slot is further away never holds another. Up to concurrentSteps
// steps run at once (a key is in one step at a time: Sched.Next marks it
// busy until the step says Started, NotReady or Empty); with one, each
// step runs on the loop's goroutine and ends before the next choice.
func (k *Pacer[T]) loop(ctx, dispatch context.Context) {
	clk := k.cfg.Clock
	st := &steps{laneNext: clk.Now(), done: make(chan struct{}, 1), work: make(chan func())}
	for range maxSteps {
		st.wg.Go(func() {
			for f := range st.work {
				f()
			}
		})
	}
	defer func() {
		close(st.work)
		st.wg.Wait()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		r := k.step(ctx, dispatch, st, concurrentSteps(k.cfg.LaneLimit()))
		if r.stop {
			return
		}
		if !r.wake {
			// Sleep returns at once for a rest of zero.
			if clk.Sleep(ctx, r.d) != nil {
				return
			}
			continue
		}
		timer.Reset(r.d) // fires at once for a rest of zero
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-k.sched.Wake():
			if !timer.Stop() {
				<-timer.C
			}
		case <-st.done:
			if !timer.Stop() {
				<-timer.C
			}
		}
	}
}

// slot waits until fewer than n steps run and counts one more; false when
// ctx ended first.
func (st *steps) slot(ctx context.Context, n int) bool {
	for {
		st.mu.Lock()
		if st.running < n {
			st.running++
			st.mu.Unlock()
			return true
		}
		st.mu.Unlock()
		select {
		case <-st.done:
		case <-ctx.Done():
			return false
		}
	}
}

// step chooses one key at the lane's next slot (st.laneNext, moved by the
// reservations) and hands it to reserve: on the loop's goroutine when one
// step runs at a time (n), else on one of the loop's step goroutines. Or it
// says why no key and how long to rest. The permit it takes goes back when
// no job takes it over.
func (k *Pacer[T]) step(ctx, dispatch context.Context, st *steps, n int) rest {
	clk := k.cfg.Clock
	if !st.slot(ctx, n) {
		return rest{stop: true}
	}
	r, run := k.choose(ctx, dispatch, st)
	if run == nil {
		st.finish(rest{}, clk.Now(), false)
		return r
	}
	if n == 1 {
		r = run()
		st.finish(rest{}, clk.Now(), false)
		return r
	}
	// Never blocks for long: fewer than maxSteps steps run, and each step
	// goroutine is back at the channel right after its finish.
	st.work <- func() { st.finish(run(), clk.Now(), true) }
	return rest{}
}

// choose takes a permit (and, in pull mode, a waiting worker's claim),
// waits for the lane's next slot and the rest a step asked for, and
// chooses a key due by then. It returns the rest of the loop when it chose
// none, else run: the rest of the step for that key (reserve), which
// returns the rest the loop takes after it.
func (k *Pacer[T]) choose(ctx, dispatch context.Context, st *steps) (rest, func() rest) {
	clk := k.cfg.Clock
	if k.cfg.Held != nil {
		if wait := k.cfg.Held(); wait != nil {
			// Held by an operator: choose no key, take no slot.
			select {
			case <-wait:
			case <-ctx.Done():
				return rest{stop: true}, nil
			}
		}
	}
	select {
	case k.permits <- struct{}{}:
	case <-ctx.Done():
		return rest{stop: true}, nil
	}
	p := &permit{release: k.giveBackFn}
	defer p.giveBack(false)
	st.mu.Lock()
	laneNext, until := st.laneNext, st.until
	st.mu.Unlock()
	// Choose at the lane's next slot (less the lookahead), not before: a
	// key that gets jobs meanwhile competes for it. A step's refusal (the
	// lane full across the fleet, the pacer down) rests the loop too.
	if clk.Sleep(ctx, later(laneNext.Add(-lookahead), until).Sub(clk.Now())) != nil { // none when due
		return rest{stop: true}, nil
	}
	// Pull mode: a slot is reserved only for a worker waiting here, as on
	// unkeyed lanes; a job that does not start gives the claim back with
	// the permit.
	if w := k.cfg.Workers; w != nil {
		if _, err := w.Claim(ctx, 1); err != nil {
			return rest{stop: true}, nil
		}
		p.worker = true
	}
	now := clk.Now()
	// Keys due within the lookahead; when the lane's cap binds, only those
	// ready by the lane's slot (no lane capacity lost).
	key, wait := k.sched.Next(now, later(now.Add(lookahead), laneNext.Add(bucket.PairSlack)))
	if key == "" {
		longest := time.Second
		if k.bounceWorkers(ctx) {
			// Look again at the workers waiting here soon.
			longest = bounceAfter
		}
		if wait < 0 { // no key has jobs
			wait = longest
		}
		wait = min(wait, longest)
		return rest{d: wait - lookahead, wake: true}, nil
	}
	q := p.handOver()
	return rest{}, func() rest {
		defer q.giveBack(false)
		return k.reserve(ctx, dispatch, st, key, now, q)
	}
}

// reserve reads key's next job, takes its leases and reserves its slot,
// and starts it at the slot on a goroutine of its own, or at once when the
// slot has come (the job takes the permit p over); or says why not and how
// long the loop rests.
func (k *Pacer[T]) reserve(ctx, dispatch context.Context, st *steps, key string, now time.Time, p *permit) rest {
	clk := k.cfg.Clock
	// The read and the leases are two round trips to two stores: they
	// overlap. A lease taken for a key with no job to read goes back.
	lease := k.acquireWhile(ctx, key)
	msg, readEpoch, ok, err := k.next(ctx, key)
	tok, full, lerr := lease()
	if err != nil || !ok {
		if lerr == nil && full == Taken {
			k.releaseLeaseAsync(ctx, key, tok)
		}
	}
	if err != nil {
		k.log.Warn("reading a key's next job failed", "key", key, "err", err)
		k.sched.NotReady(key, now.Add(retryWait))
		return rest{}
	}
	if !ok {
		if k.sched.Empty(key, now) {
			k.markIdle(key)
		}
		return rest{}
	}
	keyLim := k.KeyLimit(key, now)
	err = lerr
	if err != nil || full != Taken {
		wait := leasePoll
		if err != nil {
			k.log.Warn("taking an in-flight lease failed, keyed lane waits", "key", key, "err", err)
			wait = retryWait
		}
		k.sched.NotReady(key, now.Add(wait))
		if full == LaneFull {
			return rest{d: wait}
		}
		return rest{}
	}
	laneLim := k.cfg.LaneLimit()
	// The key's earlier starts that came after their slots' theoretical
	// times move its state on first: its next slot counts from them.
	owed, seen := k.owedLate(key)
	res, err := k.cfg.Pair.ReservePair(ctx, bucket.Key{Lane: k.cfg.Lane, Sub: key}, laneLim, keyLim, lookahead, owed)
	now = clk.Now()
	if err != nil {
		k.releaseLeaseAsync(ctx, key, tok)
		k.cfg.Observer.PacerDown(true, err)
		k.log.Warn("pacer unavailable, keyed lane waits", "err", err)
		k.sched.NotReady(key, now.Add(retryWait))
		return rest{d: retryWait}
	}
	k.cfg.Observer.PacerDown(false, nil)
	st.mu.Lock()
	st.laneNext = now.Add(res.LaneNext)
	st.mu.Unlock()
	if !res.OK {
		k.releaseLeaseAsync(ctx, key, tok)
		k.sched.NotReady(key, now.Add(res.KeyNext))
		return rest{}
	}
	if owed > 0 {
		k.carried(key, seen)
	}
	epoch, prev, decided, ok := k.take(key, msg, readEpoch)
	if !ok {
		// An earlier job of the key went back while this one was read and
		// reserved: it must not start first. Its slot is lost; the key
		// reads again in order.
		k.releaseLeaseAsync(ctx, key, tok)
		k.missed.Add(1)
		k.sched.NotReady(key, now.Add(res.KeyNext))
		return rest{}
	}
	k.sched.Started(key, now.Add(res.KeyNext))
	due := now.Add(res.Due)
	if k.cfg.Assigned != nil {
		k.cfg.Assigned(msg, leaky.Slot{Due: due, Free: res.Free})
	}
	k.cfg.Observer.Reserved(1)
	k.inflight.Add(1)
	k.waiting.Add(1)
	// A start may come at most max(2 ms, the shorter of the two periods)
	// after its slot, as on unkeyed lanes: both bounds then hold with W
	// widened by that much.
	maxLate := max(leaky.DefaultMaxLate, min(laneLim.Period(), keyLim.Period()))
	j := &job[T]{
		key: key, tok: tok, msg: msg, due: due, theo: now.Add(res.KeyLatest), keyPeriod: keyLim.Period(), seen: seen,
		maxLate: maxLate, epoch: epoch, prev: prev, decided: decided, permit: p.handOver(),
	}
	if prev == nil && !due.After(clk.Now()) {
		// Due already, with no earlier job of its key to wait for: the
		// step starts it at once (startAt neither sleeps nor waits then).
		// A goroutine of its own would have to be scheduled first, and on
		// a loaded machine, with many steps under way, that took past the
		// lateness bound often enough to give up one slot in twenty.
		k.startAt(ctx, dispatch, j)
		return rest{}
	}
	go k.startAt(ctx, dispatch, j)
	return rest{}
}

// permit is one of the MaxInflight permits, with a pull-mode worker's claim
// when one was taken for it. It has one owner at a time (the loop's step,
// then the job it chose) and goes back exactly once.
type permit struct {
	worker  bool // a waiting worker's claim is held with it
	release func(worker bool)
	gone    atomic.Bool
}

// giveBack returns the permit; started says the job was handed to its
// dispatch, which used up the worker's claim. Later calls do nothing.
func (p *permit) giveBack(started bool) {
	if p == nil || !p.gone.CompareAndSwap(false, true) {
		return
	}
	p.release(p.worker && !started)
}

// handOver moves the permit to a new owner: the old one's give-back then
// does nothing.
func (p *permit) handOver() *permit {
	q := &permit{worker: p.worker, release: p.release}
	p.gone.Store(true)
	return q
}

// giveBack returns one permit, and a worker's claim with it (unclaim).
func (k *Pacer[T]) giveBack(unclaim bool) {
	if unclaim {
		k.cfg.Workers.Unclaim(1)
	}
	<-k.permits
}

// bounceAfter is how long a pull-mode worker may wait at an instance that
// has no job due for it, while the lane has jobs stored, before it is sent
// to ask again (bounceWorkers).
const bounceAfter = 100 * time.Millisecond

// bounceWorkers answers the workers that have waited here for bounceAfter
// with no job due for them, so that they ask again: a pull goes to one
// instance of the fleet, and the keys with jobs may be held by another one.
// With no job stored in the lane (as last read, at most a second ago), or
// on one instance (no Leases), they wait here as on any pull lane: there is
// no better place to ask. It reports whether workers may wait here (a
// pull-mode lane).
func (k *Pacer[T]) bounceWorkers(ctx context.Context) bool {
	if k.cfg.Workers == nil {
		return false
	}
	if k.cfg.Leases == nil || k.cfg.Backlog == nil {
		return true
	}
	if n, err := k.cfg.Backlog.Backlog(ctx, k.cfg.Lane, time.Second); err == nil && n > 0 {
		k.cfg.Workers.Bounce(bounceAfter)
	}
	return true
}

// job is one job chosen and reserved, waiting for its slot.
type job[T Item] struct {
	key, tok string // tok: its lease ("" none)
	msg      T
	due      time.Time
	// theo is the slot's theoretical time in the key's state, keyPeriod
	// the key's period then, and seen the key's lateness its reservation
	// carried (Pacer.late): a start after theo counts from the start.
	theo      time.Time
	keyPeriod time.Duration
	seen      time.Duration
	maxLate   time.Duration
	epoch     uint64
	// prev is closed once the key's job taken before it has started or
	// gone back (nil: none); decided is its own.
	prev, decided chan struct{}
	permit        *permit
}

// startAt starts j at its slot (its permit is held), or hands it back when
// ctx ends first; the dispatch runs under dispatch. The key's job taken before it has started or gone back
// by then: jobs of a key start in the order they were taken, however late
// their goroutines wake. It closes j.decided when it has started j or
// handed it back.
func (k *Pacer[T]) startAt(ctx, dispatch context.Context, j *job[T]) {
	clk := k.cfg.Clock
	defer k.waiting.Done()
	defer k.decide(j.key, j.decided)
	// settle gives back what j holds, once: its lease, its count, its
	// permit (and its worker's claim unless j started).
	settle := func(started bool) {
		k.releaseLease(dispatch, j.key, j.tok)
		k.inflight.Add(-1)
		if k.sched.Settled(j.key, clk.Now()) {
			k.markIdle(j.key)
		}
		j.permit.giveBack(started)
	}
	if d := j.due.Sub(clk.Now()); d > 0 && clk.Sleep(ctx, d) != nil {
		_ = j.msg.Release()
		settle(false)
		return
	}
	if j.prev != nil {
		select {
		case <-j.prev:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			// The stop began while it waited (select picks at random when
			// both are ready): hand it back unstarted.
			_ = j.msg.Release()
			settle(false)
			return
		}
	}
	k.mu.Lock()
	behind := k.epoch[j.key] != j.epoch // an earlier job of the key went back
	k.mu.Unlock()
	if behind {
		// An earlier job of the key went back, and the key reads again
		// from it: this one stays stored and is read again in its turn. It
		// must not move the key's cursor or epoch itself.
		settle(false)
		return
	}
	// Starts of the key recorded late since j's reservation, which its
	// slot does not count: j starts that much later (G1 per key).
	shift := k.lateSince(j.key, j.seen)
	if shift > 0 && clk.Sleep(ctx, j.due.Add(shift).Sub(clk.Now())) != nil {
		_ = j.msg.Release()
		settle(false)
		return
	}
	now := clk.Now()
	late := now.Sub(j.due)
	if late > j.maxLate {
		// Woken too late (a stall, a loaded machine): the slot is given
		// up, never used closer to the next one; the job is again its
		// key's next.
		k.missed.Add(1)
		_ = j.msg.Release()
		settle(false)
		return
	}
	if k.cfg.Held != nil && k.cfg.Held() != nil {
		// Held since its slot was taken: the job goes back, as a missed
		// slot's does, and is its key's next again at the release.
		_ = j.msg.Release()
		settle(false)
		return
	}
	// Started after its theoretical time (over > 0): the key's next slot
	// counts from now, not from the slot.
	k.recordLate(j.key, max(now.Sub(j.theo.Add(shift)), 0), now.Add(j.keyPeriod))
	k.cfg.Observer.Started(max(late, 0))
	k.cfg.Start(dispatch, j.msg, func() { settle(true) })
}

// decide says that the job taken with decided has started or gone back:
// the key's next job taken may start.
func (k *Pacer[T]) decide(key string, decided chan struct{}) {
	k.mu.Lock()
	if k.decided[key] == decided {
		delete(k.decided, key) // the key's last job taken: nobody waits
	}
	k.mu.Unlock()
	close(decided)
}

// next returns key's next job: the one read before, or a fresh read after
// the key's cursor; and the key's epoch it was read under.
func (k *Pacer[T]) next(ctx context.Context, key string) (T, uint64, bool, error) {
	var none T
	k.mu.Lock()
	m, isHeld := k.held[key]
	from, epoch := k.cursor[key], k.epoch[key]
	k.mu.Unlock()
	if isHeld {
		return m, epoch, true, nil
	}
	m, ok, err := k.cfg.Reader.Next(ctx, key, from)
	if err != nil || !ok {
		return none, epoch, false, err
	}
	stored := 0
	if from == 0 && k.cfg.Ordered {
		// The key's oldest job, read here for the first time: it may have
		// failed attempts from before a restart or on another instance.
		if stored, err = k.cfg.Reader.Tries(ctx, m.Seq()); err != nil {
			return none, epoch, false, err
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if stored > k.tries[m.Seq()] {
		k.tries[m.Seq()] = stored
	}
	m.AddAttempts(k.tries[m.Seq()]) // none: adds nothing
	if k.epoch[key] == epoch {
		k.held[key] = m
	}
	return m, epoch, true, nil
}

// take marks msg as started: the key's cursor moves past it. It refuses
// (ok false) when the key's epoch moved since msg was read under readEpoch:
// an earlier job went back and must start first. prev is closed once the
// key's job taken before msg has started or gone back (nil: none waits);
// decided is msg's own, for startAt to close.
func (k *Pacer[T]) take(key string, msg T, readEpoch uint64) (epoch uint64, prev, decided chan struct{}, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.epoch[key] != readEpoch {
		return 0, nil, nil, false
	}
	delete(k.held, key)
	k.cursor[key] = max(k.cursor[key], msg.Seq()+1)
	prev, decided = k.decided[key], make(chan struct{})
	k.decided[key] = decided
	return readEpoch, prev, decided, true
}

// RetryInPlace counts a failed attempt of an ordered key's job, which waits
// in place for d (a retry behind the key's later jobs would break their
// order): the key is held meanwhile. The count is stored (Reader.SetTries)
// so that max_attempts holds across a restart; when that fails it is kept
// here only, and the error says so.
func (k *Pacer[T]) RetryInPlace(ctx context.Context, key string, msg T, d time.Duration) (tries int, err error) {
	k.mu.Lock()
	k.tries[msg.Seq()]++
	n := k.tries[msg.Seq()]
	k.mu.Unlock()
	k.sched.Pause(key, k.cfg.Clock.Now().Add(d))
	return n, k.cfg.Reader.SetTries(ctx, msg.Seq(), n)
}

// Settled forgets a job's in-place attempts once it left the stream.
func (k *Pacer[T]) Settled(ctx context.Context, msg T) error {
	k.mu.Lock()
	n, ok := k.tries[msg.Seq()]
	delete(k.tries, msg.Seq())
	k.mu.Unlock()
	if !ok || n == 0 {
		return nil
	}
	return k.cfg.Reader.ClearTries(ctx, msg.Seq())
}

// PauseKey holds one key for d (its downstream asked to wait): locally, and
// in the key's shared state (Config.Pauser) so that no instance starts it
// meanwhile. The state is pushed at the key's limit now, its slow-down
// included (PushedBack comes first): its slots are reserved at that limit,
// whose tolerance a slow-down lengthens, so a pause written at the full
// rate would let a slot start before the wait ends.
func (k *Pacer[T]) PauseKey(ctx context.Context, key string, d time.Duration) {
	d = min(d, k.cfg.MaxPause)
	now := k.cfg.Clock.Now()
	k.sched.Pause(key, now.Add(d))
	if k.cfg.Pauser == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := k.cfg.Pauser.Pause(ctx, bucket.Key{Lane: k.cfg.Lane, Sub: key}, k.KeyLimit(key, now), d); err != nil {
		k.log.Warn("pausing the key in the shared state failed", "key", key, "for", d.String(), "err", err)
		return
	}
	k.log.Info("downstream asked the key to wait", "key", key, "for", d.String())
}

// Key is key's state on this instance.
func (k *Pacer[T]) Key(key string) KeyState { return k.sched.Key(key) }

// Stats counts the keys with jobs on this instance at now.
func (k *Pacer[T]) Stats(now time.Time) Stats { return k.sched.Stats(now) }

// SetOpts changes key's scheduling settings (an override changed).
func (k *Pacer[T]) SetOpts(key string, o Opts) { k.sched.SetOpts(key, o) }

// Inflight counts the jobs started here and not settled, with the ones
// waiting for their slot.
func (k *Pacer[T]) Inflight() int64 { return k.inflight.Load() }

// Missed counts the slots given up: woken too late for them, or taken
// while an earlier job of the key went back.
func (k *Pacer[T]) Missed() uint64 { return k.missed.Load() }
