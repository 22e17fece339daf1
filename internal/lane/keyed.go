package lane

import (
	"context"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/queue"
)

// keyedRun drives a keyed lane (per_key): instead of one consumer and one
// drain, it asks keyed.Sched which key starts next, reads that key's next
// job by subject (queue.KeyedReader), reserves its slot under the key's and
// the lane's limits in one step (bucket.PairStore), and starts it at the
// slot. Keys are claimed (keyed.Claims) so that one instance at a time reads
// a key: its jobs then start in order.
type keyedRun struct {
	l      *Lane
	reader *queue.KeyedReader
	sched  *keyed.Sched
	pair   bucket.PairStore
	claims keyed.Claims
	// slow is per_key.adaptive (nil when off): keys' own slow-downs.
	slow *keyed.Slowdown
	// permits bounds the lane's dispatches on this instance (max_inflight).
	permits chan struct{}
	wake    chan struct{}

	mu      sync.Mutex
	cursor  map[string]uint64     // per claimed key: the next sequence to read
	held    map[string]*queue.Msg // per claimed key: its next job, read, not started
	tries   map[uint64]int        // ordered keys: failed attempts of a job retried in place
	pending map[string]struct{}   // keys with new jobs, to claim
	idled   map[string]struct{}   // keys with no jobs left, to release
	// epoch per key moves when one of its jobs goes back (a slot given
	// up, a wait in place): its later jobs waiting for their slots then go
	// back too, so that they never start before it (FIFO per key).
	epoch map[string]uint64
	// decided per key is closed once the key's last job taken has started
	// or gone back (startAt). The next job taken waits for it at its slot:
	// a job whose goroutine woke late (a stalled thread holds its timer)
	// and goes back must not find a later job of its key started already.
	decided map[string]chan struct{}
	// begin starts a job (Lane.start; a test records the starts).
	begin func(ctx context.Context, msg *queue.Msg, done func())

	// slots are the fleet's in-flight slots this instance holds (token →
	// key), refreshed by the claimer (Deps.Slots).
	slots   map[string]string
	slotSeq atomic.Uint64

	inflight atomic.Int64
	missed   atomic.Uint64 // slots given up: woken too late for them
	// waiting counts the jobs waiting for their slot on their own
	// goroutines (startAt).
	waiting sync.WaitGroup
	// releases counts the slot releases under way off the scheduling
	// loop (releaseSlotAsync).
	releases sync.WaitGroup
}

// sweepEvery is how often an instance lists the keys with stored jobs and
// claims the ones nobody holds (after a crash, or at start); refreshEvery is
// how often it refreshes its claims (liveness and owner keys).
const (
	sweepEvery   = 5 * time.Second
	refreshEvery = 2 * time.Second
	ownEvery     = time.Minute
)

func newKeyedRun(l *Lane) (*keyedRun, error) {
	r, err := l.d.Queue.KeyedReader(l.cfg.Name)
	if err != nil {
		return nil, err
	}
	k := &keyedRun{
		l: l, reader: r, pair: l.d.Pair, claims: l.d.Claims,
		permits: make(chan struct{}, l.cfg.MaxInflight), wake: make(chan struct{}, 1),
		cursor: map[string]uint64{}, held: map[string]*queue.Msg{}, tries: map[uint64]int{}, pending: map[string]struct{}{}, slots: map[string]string{}, idled: map[string]struct{}{}, epoch: map[string]uint64{},
		decided: map[string]chan struct{}{}, begin: l.start,
	}
	k.sched = keyed.New(l.keyOpts)
	if a := l.cfg.PerKey.Adaptive; a.Enabled {
		k.slow = &keyed.Slowdown{Decrease: a.Decrease, Increase: a.Increase, Min: a.Min, Interval: a.Interval.D()}
	}
	r.OnRequeue = k.requeue
	l.d.Queue.OnStored(l.cfg.Name, k.announce)
	return k, nil
}

// announce hears that key has a new job (stored by this instance). It must
// not block: the claim is made by the claimer goroutine.
func (k *keyedRun) announce(key string) {
	k.mu.Lock()
	k.pending[key] = struct{}{}
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// requeue hears that a job of key was handed back to wait in place: it is
// the key's next job again.
func (k *keyedRun) requeue(key string, seq uint64) {
	k.mu.Lock()
	if c, ok := k.cursor[key]; !ok || seq < c {
		// Read again from it; the key's later jobs already read or
		// reserved go back too (a new epoch).
		k.cursor[key] = seq
		delete(k.held, key)
		k.epoch[key]++
	}
	k.mu.Unlock()
	k.sched.Add(key, k.l.d.Clock.Now())
}

// run drives the lane until ctx ends, then waits for its dispatches.
func (k *keyedRun) run(ctx context.Context) {
	var helpers sync.WaitGroup
	helpers.Go(func() { k.claimer(ctx) })
	helpers.Go(func() { k.l.d.Queue.RunIntake(ctx, k.l.cfg.Name, k.l.log) })
	helpers.Go(func() { k.l.d.Queue.MoveRetries(ctx, k.l.cfg.Name, k.l.log) })
	k.loop(ctx)
	k.l.stopPulls()
	// The claimer stops with ctx; the slots of the deliveries still in
	// flight stay refreshed until they settle, however long that takes.
	drained := make(chan struct{})
	var refresher sync.WaitGroup
	refresher.Go(func() { k.refreshUntil(drained, refreshEvery) })
	k.waiting.Wait()
	close(drained)
	refresher.Wait()
	helpers.Wait()
	k.releases.Wait()
	// Hand back the jobs read and not started: they stay in the stream.
	k.mu.Lock()
	k.held = map[string]*queue.Msg{}
	k.mu.Unlock()
	for range cap(k.permits) {
		k.permits <- struct{}{}
	}
}

// claimer claims keys that got jobs, sweeps for keys nobody holds, and
// keeps this instance's claims alive.
func (k *keyedRun) claimer(ctx context.Context) {
	name := k.l.cfg.Name
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
			if k.slow != nil {
				k.slow.Sweep(k.l.d.Clock.Now())
			}
		case <-refresh.C:
			if time.Since(lastOwn) >= ownEvery {
				lastOwn = time.Now()
				keys := k.sched.Keys()
				got, err := k.claims.Claim(ctx, name, keys)
				if err == nil {
					k.dropLost(keys, got)
				}
			} else {
				_, _ = k.claims.Claim(ctx, name, nil)
			}
			k.refreshSlots(ctx)
		}
		k.mu.Lock()
		var keys []string
		for key := range k.pending {
			keys = append(keys, key)
		}
		clear(k.pending)
		k.mu.Unlock()
		if len(keys) > 0 {
			k.claim(ctx, keys)
		}
		k.release(ctx)
	}
}

// claim takes keys that got jobs; a key this instance already reads only
// needs telling.
func (k *keyedRun) claim(ctx context.Context, keys []string) {
	now := k.l.d.Clock.Now()
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
	got, err := k.claims.Claim(ctx, k.l.cfg.Name, unknown)
	if err != nil {
		k.l.log.Warn("claiming keys failed; the sweep tries again", "keys", len(unknown), "err", err)
	}
	k.loadSlow(ctx, got)
	now = k.l.d.Clock.Now()
	for _, key := range got {
		k.sched.Add(key, now)
	}
}

// loadSlow adopts the slow-downs other instances stored for keys, which
// this one just claimed.
func (k *keyedRun) loadSlow(ctx context.Context, keys []string) {
	if k.slow == nil || k.l.d.Slow == nil || len(keys) == 0 {
		return
	}
	got, err := k.l.d.Slow.LoadSlow(ctx, k.l.cfg.Name, keys)
	if err != nil {
		k.l.log.Warn("reading keys' slow-downs failed; they start at their full rate", "keys", len(keys), "err", err)
	}
	now := k.l.d.Clock.Now()
	for _, s := range got {
		k.slow.Adopt(s.Key, s.Factor, now.Add(-s.Age), now)
	}
}

// slowKey lowers key's rate after its downstream pushed back (at most once
// per adaptive.interval), and stores the factor for the other instances.
func (k *keyedRun) slowKey(key string) {
	l := k.l
	f, changed := k.slow.Limited(key, l.d.Clock.Now())
	if !changed {
		return
	}
	l.log.Info("target pushed back on the key; slowing it down", "key", key, "rate", l.keyLimit(key).Rate*f, "factor", f)
	if l.d.Slow == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.d.DispatchCtx), time.Second)
	defer cancel()
	if err := l.d.Slow.SaveSlow(ctx, l.cfg.Name, key, f, k.slow.Recovery(f)); err != nil {
		l.log.Warn("storing the key's slow-down failed; other instances do not see it", "key", key, "err", err)
	}
}

// effectiveLimit is key's limit at now: its rate (per_key, or its
// override) times its adaptive factor.
func (k *keyedRun) effectiveLimit(key string, now time.Time) bucket.Limit {
	lim := k.l.keyLimit(key)
	if k.slow != nil {
		lim.Rate = max(lim.Rate*k.slow.Factor(key, now), bucket.MinRate)
	}
	return lim
}

// sweep claims the keys with stored jobs that no live instance holds.
func (k *keyedRun) sweep(ctx context.Context) {
	keys, err := k.reader.Keys(ctx)
	if err != nil {
		k.l.log.Debug("listing keys with jobs failed", "err", err)
		return
	}
	k.claim(ctx, keys)
}

// dropLost forgets the keys another instance took over (this one stopped
// answering for longer than the claims' liveness).
func (k *keyedRun) dropLost(had, kept []string) {
	still := make(map[string]bool, len(kept))
	for _, key := range kept {
		still[key] = true
	}
	for _, key := range had {
		if !still[key] && k.sched.Forget(key) {
			k.l.log.Warn("key taken over by another instance", "key", key)
			k.forget(key)
		}
	}
}

// forget drops what this instance remembers of key.
func (k *keyedRun) forget(key string) {
	k.mu.Lock()
	delete(k.cursor, key)
	delete(k.held, key)
	delete(k.epoch, key)
	k.mu.Unlock()
}

// markIdle hands key, which has no jobs left here, to the claimer to
// release (claims and releases are made by one goroutine, in order).
func (k *keyedRun) markIdle(key string) {
	k.mu.Lock()
	k.idled[key] = struct{}{}
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// release gives up the claims of the keys that went idle, unless they got
// jobs again meanwhile, then looks once more: a job stored by another
// instance meanwhile (which could not claim the key) is found and the key
// claimed again.
func (k *keyedRun) release(ctx context.Context) {
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
		if err := k.claims.Release(rctx, k.l.cfg.Name, key); err != nil {
			k.l.log.Debug("releasing a key failed; its claim lapses by itself", "key", key, "err", err)
		}
		if m, err := k.reader.Next(rctx, key, 1); err != nil || m != nil {
			again = append(again, key)
		}
		cancel()
	}
	if len(again) > 0 {
		k.claim(ctx, again)
	}
}

// slotPoll is how long a key waits when the fleet has max_inflight of its
// jobs (or of the lane's) in flight: slots freed on other instances are
// not announced, so the key looks again after this.
const slotPoll = 20 * time.Millisecond

// acquire takes a fleet-wide in-flight slot of the lane and of key
// (Deps.Slots); without Slots this instance's own bounds are the only ones
// and the token is "".
func (k *keyedRun) acquire(ctx context.Context, key string) (string, keyed.Full, error) {
	l := k.l
	if l.d.Slots == nil {
		return "", keyed.Taken, nil
	}
	tok := l.d.Instance + "-" + strconv.FormatUint(k.slotSeq.Add(1), 36)
	full, err := l.d.Slots.Acquire(ctx, l.cfg.Name, key, tok, l.cfg.MaxInflight, l.keyOpts(key).MaxInflight)
	if err != nil {
		// The script may have run and the answer got lost (a timeout, a
		// broken connection): give the token's slots back, or they stay
		// held for a whole lease with nothing to release them.
		k.releaseSlotAsync(key, tok)
		return "", full, err
	}
	if full != keyed.Taken {
		return "", full, nil
	}
	k.mu.Lock()
	k.slots[tok] = key
	k.mu.Unlock()
	return tok, keyed.Taken, nil
}

// releaseSlot gives back the fleet-wide slot tok of key ("" holds none).
func (k *keyedRun) releaseSlot(key, tok string) {
	if tok == "" {
		return
	}
	k.mu.Lock()
	delete(k.slots, tok)
	k.mu.Unlock()
	l := k.l
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.d.DispatchCtx), releaseSlotTimeout)
	defer cancel()
	if err := l.d.Slots.ReleaseSlot(ctx, l.cfg.Name, key, tok); err != nil {
		l.log.Warn("giving back an in-flight slot failed; it lapses by itself", "key", key, "err", err)
	}
}

// releaseSlotTimeout bounds a slot release made off the scheduling loop.
const releaseSlotTimeout = time.Second

// releaseSlotAsync gives back the fleet-wide slot tok of key ("" holds
// none) on a goroutine of its own, so that the scheduling loop never waits
// for the state store; run waits for it at a stop.
func (k *keyedRun) releaseSlotAsync(key, tok string) {
	if tok == "" {
		return
	}
	k.mu.Lock()
	delete(k.slots, tok)
	k.mu.Unlock()
	k.releases.Go(func() { k.releaseSlot(key, tok) })
}

// refreshUntil refreshes the slots held every period until stop closes:
// at a stop, while deliveries settle after the claimer ended.
func (k *keyedRun) refreshUntil(stop <-chan struct{}, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.WithoutCancel(k.l.d.DispatchCtx), period)
			k.refreshSlots(ctx)
			cancel()
		}
	}
}

// refreshSlots keeps this instance's fleet-wide slots alive while their
// jobs are in flight.
func (k *keyedRun) refreshSlots(ctx context.Context) {
	if k.l.d.Slots == nil {
		return
	}
	k.mu.Lock()
	held := maps.Clone(k.slots)
	k.mu.Unlock()
	if err := k.l.d.Slots.Refresh(ctx, k.l.cfg.Name, held); err != nil {
		k.l.log.Warn("refreshing in-flight slots failed", "slots", len(held), "err", err)
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

// loop chooses keys and reserves their slots, one at a time, a little ahead
// of the lane's next slot; each job waits for its slot on its own
// goroutine, so a key whose slot is further away never holds another.
func (k *keyedRun) loop(ctx context.Context) {
	l := k.l
	clk := l.d.Clock
	laneNext := clk.Now()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	pause := func(d time.Duration) bool {
		if d <= 0 {
			return ctx.Err() == nil
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
		case <-k.sched.Wake():
			if !timer.Stop() {
				<-timer.C
			}
		}
		return true
	}
	for ctx.Err() == nil {
		if wait := l.hold.held(); wait != nil {
			// Held by an operator: choose no key, take no slot.
			select {
			case <-wait:
			case <-ctx.Done():
				return
			}
		}
		select {
		case k.permits <- struct{}{}:
		case <-ctx.Done():
			return
		}
		// Choose at the lane's next slot (less the lookahead), not
		// before: a key that gets jobs meanwhile competes for it.
		if d := laneNext.Add(-lookahead).Sub(clk.Now()); d > 0 && clk.Sleep(ctx, d) != nil {
			<-k.permits
			return
		}
		// Pull mode: a slot is reserved only for a worker waiting here,
		// as on unkeyed lanes (pull.go); each path below that starts no
		// job gives the claim back with the permit.
		if !k.claimWorker(ctx) {
			<-k.permits
			return
		}
		now := clk.Now()
		// Keys due within the lookahead; when the lane's cap binds, only
		// those ready by the lane's slot (no lane capacity lost).
		key, wait := k.sched.Next(now, later(now.Add(lookahead), laneNext.Add(bucket.PairSlack)))
		if key == "" {
			k.unclaimWorker()
			<-k.permits
			longest := time.Second
			if k.bounceWorkers(ctx) {
				// Look again at the workers waiting here soon.
				longest = bounceAfter
			}
			if wait < 0 || wait > longest {
				wait = longest
			}
			if !pause(wait - lookahead) {
				return
			}
			continue
		}
		msg, readEpoch, err := k.next(ctx, key)
		if err != nil {
			k.unclaimWorker()
			<-k.permits
			l.log.Warn("reading a key's next job failed", "key", key, "err", err)
			k.sched.NotReady(key, now.Add(retryWait))
			continue
		}
		if msg == nil {
			k.unclaimWorker()
			<-k.permits
			if k.sched.Empty(key, now) {
				k.markIdle(key)
			}
			continue
		}
		keyLim := k.effectiveLimit(key, now)
		tok, full, err := k.acquire(ctx, key)
		if err != nil || full != keyed.Taken {
			k.unclaimWorker()
			<-k.permits
			wait := slotPoll
			if err != nil {
				l.log.Warn("taking an in-flight slot failed, keyed lane waits", "key", key, "err", err)
				wait = retryWait
			}
			k.sched.NotReady(key, now.Add(wait))
			if full == keyed.LaneFull && clk.Sleep(ctx, wait) != nil {
				return
			}
			continue
		}
		res, err := k.pair.ReservePair(ctx, bucket.Key{Lane: l.cfg.Name, Sub: key}, l.EffectiveLimit(), keyLim, lookahead)
		now = clk.Now()
		if err != nil {
			k.unclaimWorker()
			<-k.permits
			k.releaseSlotAsync(key, tok)
			(*observer)(l).PacerDown(true, err)
			l.log.Warn("pacer unavailable, keyed lane waits", "err", err)
			k.sched.NotReady(key, now.Add(retryWait))
			if clk.Sleep(ctx, retryWait) != nil {
				return
			}
			continue
		}
		(*observer)(l).PacerDown(false, nil)
		laneNext = now.Add(res.LaneNext)
		if !res.OK {
			k.unclaimWorker()
			<-k.permits
			k.releaseSlotAsync(key, tok)
			k.sched.NotReady(key, now.Add(res.KeyNext))
			continue
		}
		epoch, prev, decided, ok := k.take(key, msg, readEpoch)
		if !ok {
			// An earlier job of the key went back while this one was
			// read and reserved: it must not start first. Its slot is
			// lost; the key reads again in order.
			k.unclaimWorker()
			<-k.permits
			k.releaseSlotAsync(key, tok)
			k.missed.Add(1)
			k.sched.NotReady(key, now.Add(res.KeyNext))
			continue
		}
		k.sched.Started(key, now.Add(res.KeyNext))
		due := now.Add(res.Due)
		l.assigned(msg, leaky.Slot{Due: due, Free: res.Free})
		l.d.Metrics.SlotsReserved.WithLabelValues(l.cfg.Name).Inc()
		k.inflight.Add(1)
		k.waiting.Add(1)
		// A start may come at most max(2 ms, the shorter of the two
		// periods) after its slot, as on unkeyed lanes: both bounds then
		// hold with W widened by that much.
		maxLate := max(leaky.DefaultMaxLate, min(l.EffectiveLimit().Period(), keyLim.Period()))
		go k.startAt(ctx, key, tok, msg, due, maxLate, epoch, prev, decided)
	}
}

// claimWorker waits, on a pull-mode lane, until a worker waits here for a
// job that no job taken before is meant for, and claims it; false when ctx
// ended first. Other lanes claim nothing.
func (k *keyedRun) claimWorker(ctx context.Context) bool {
	if k.l.pull == nil {
		return true
	}
	_, err := k.l.pull.Claim(ctx, 1)
	return err == nil
}

// bounceAfter is how long a pull-mode worker may wait at an instance that
// has no job due for it, while the lane has jobs stored, before it is sent
// to ask again (bounceWorkers).
const bounceAfter = 100 * time.Millisecond

// bounceWorkers answers the workers that have waited here for bounceAfter
// with no job due for them, so that they ask again: a pull goes to one
// instance of the fleet, and the keys with jobs may be held by another one.
// With no job stored in the lane (as last read, at most a second ago), or
// on the embedded pacer's one instance (no Deps.Slots), they wait here as
// on any pull lane: there is no better place to ask. It reports whether
// workers may wait here (a pull-mode lane).
func (k *keyedRun) bounceWorkers(ctx context.Context) bool {
	l := k.l
	if l.pull == nil {
		return false
	}
	if l.d.Slots == nil {
		return true
	}
	if n, err := l.d.Queue.Backlog(ctx, l.cfg.Name, time.Second); err == nil && n > 0 {
		l.pull.Bounce(bounceAfter)
	}
	return true
}

// unclaimWorker gives back the claim of a job that did not start.
func (k *keyedRun) unclaimWorker() {
	if k.l.pull != nil {
		k.l.pull.Unclaim(1)
	}
}

// startAt starts msg at due (its permit is held), or hands it back when ctx
// ends first. The key's job taken before it (prev, nil for none) has
// started or gone back by then: jobs of a key start in the order they were
// taken, however late their goroutines wake. It closes decided when it has
// started msg or handed it back.
func (k *keyedRun) startAt(ctx context.Context, key, tok string, msg *queue.Msg, due time.Time, maxLate time.Duration, epoch uint64, prev, decided chan struct{}) {
	l, clk := k.l, k.l.d.Clock
	defer k.waiting.Done()
	defer k.decide(key, decided)
	done := func() {
		k.releaseSlot(key, tok)
		k.inflight.Add(-1)
		if k.sched.Settled(key, clk.Now()) {
			k.markIdle(key)
		}
		<-k.permits
	}
	// A job that does not start gives its worker's claim back (pull
	// mode); one that starts uses it up when it is handed over.
	unstarted := func() {
		k.unclaimWorker()
		done()
	}
	if d := due.Sub(clk.Now()); d > 0 && clk.Sleep(ctx, d) != nil {
		_ = msg.Release()
		unstarted()
		return
	}
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			// The stop began while it waited (select picks at random
			// when both are ready): hand it back unstarted.
			_ = msg.Release()
			unstarted()
			return
		}
	}
	k.mu.Lock()
	behind := k.epoch[key] != epoch // an earlier job of the key went back
	k.mu.Unlock()
	if behind {
		// An earlier job of the key went back, and the key reads again
		// from it: this one stays stored and is read again in its turn.
		// It must not move the key's cursor or epoch itself.
		unstarted()
		return
	}
	late := clk.Now().Sub(due)
	if late > maxLate {
		// Woken too late (a stall, a loaded machine): the slot is given
		// up, never used closer to the next one; the job is again its
		// key's next.
		k.missed.Add(1)
		_ = msg.Release()
		unstarted()
		return
	}
	if l.hold.held() != nil {
		// Held since its slot was taken: the job goes back, as a missed
		// slot's does, and is its key's next again at the release.
		_ = msg.Release()
		unstarted()
		return
	}
	(*observer)(l).Started(max(late, 0))
	k.begin(ctx, msg, done)
}

// decide says that the job taken with decided has started or gone back:
// the key's next job taken may start.
func (k *keyedRun) decide(key string, decided chan struct{}) {
	k.mu.Lock()
	if k.decided[key] == decided {
		delete(k.decided, key) // the key's last job taken: nobody waits
	}
	k.mu.Unlock()
	close(decided)
}

func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// next returns key's next job: the one read before, or a fresh read after
// the key's cursor; and the key's epoch it was read under.
func (k *keyedRun) next(ctx context.Context, key string) (*queue.Msg, uint64, error) {
	k.mu.Lock()
	m, from, epoch := k.held[key], k.cursor[key], k.epoch[key]
	k.mu.Unlock()
	if m != nil {
		return m, epoch, nil
	}
	m, err := k.reader.Next(ctx, key, from)
	if err != nil || m == nil {
		return m, epoch, err
	}
	stored := 0
	if from == 0 && k.l.cfg.PerKey.Ordered {
		// The key's oldest job, read here for the first time: it may
		// have failed attempts from before a restart or on another
		// instance (queue.TriesBucket).
		if stored, err = k.reader.Tries(ctx, m.Seq()); err != nil {
			return nil, epoch, err
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if stored > k.tries[m.Seq()] {
		k.tries[m.Seq()] = stored
	}
	if n := k.tries[m.Seq()]; n > 0 {
		m.AddAttempts(n)
	}
	if k.epoch[key] == epoch {
		k.held[key] = m
	}
	return m, epoch, nil
}

// take marks msg as started: the key's cursor moves past it. It refuses
// (ok false) when the key's epoch moved since msg was read under readEpoch:
// an earlier job went back and must start first. prev is closed once the
// key's job taken before msg has started or gone back (nil: none waits);
// decided is msg's own, for startAt to close.
func (k *keyedRun) take(key string, msg *queue.Msg, readEpoch uint64) (epoch uint64, prev, decided chan struct{}, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.epoch[key] != readEpoch {
		return 0, nil, nil, false
	}
	delete(k.held, key)
	if c := msg.Seq() + 1; c > k.cursor[key] {
		k.cursor[key] = c
	}
	prev, decided = k.decided[key], make(chan struct{})
	k.decided[key] = decided
	return readEpoch, prev, decided, true
}

// retryInPlace counts a failed attempt of an ordered key's job, which waits
// in place (a retry behind the key's later jobs would break their order).
// The count is stored (queue.TriesBucket) so that max_attempts holds
// across a restart; when that fails it is kept here only.
func (k *keyedRun) retryInPlace(msg *queue.Msg) {
	k.mu.Lock()
	k.tries[msg.Seq()]++
	n := k.tries[msg.Seq()]
	k.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.l.d.DispatchCtx), settleTimeout)
	defer cancel()
	if err := k.reader.SetTries(ctx, msg.Seq(), n); err != nil {
		k.l.log.Warn("storing an ordered job's failed attempts failed; a restart counts them from its message", "id", msg.Job().ID, "tries", n, "err", err)
	}
}

// settledJob forgets a job's in-place attempts once it left the stream.
func (k *keyedRun) settledJob(msg *queue.Msg) {
	k.mu.Lock()
	n, ok := k.tries[msg.Seq()]
	delete(k.tries, msg.Seq())
	k.mu.Unlock()
	if !ok || n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.l.d.DispatchCtx), settleTimeout)
	defer cancel()
	if err := k.reader.ClearTries(ctx, msg.Seq()); err != nil {
		k.l.log.Warn("forgetting a settled ordered job's failed attempts failed; the entry lapses by itself", "id", msg.Job().ID, "err", err)
	}
}

// pauseKey holds one key for d (its downstream asked to wait): locally, and
// in the key's shared state so that no instance starts it meanwhile.
func (k *keyedRun) pauseKey(key string, d time.Duration) {
	l := k.l
	d = min(d, l.bounds.MaxPause)
	k.sched.Pause(key, l.d.Clock.Now().Add(d))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.d.DispatchCtx), time.Second)
	defer cancel()
	if err := l.d.Store.Pause(ctx, bucket.Key{Lane: l.cfg.Name, Sub: key}, l.keyLimit(key), d); err != nil {
		l.log.Warn("pausing the key in the shared state failed", "key", key, "for", d.String(), "err", err)
		return
	}
	l.log.Info("downstream asked the key to wait", "key", key, "for", d.String())
}
