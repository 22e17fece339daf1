// Package leaky is the pacer: it drains a lane's queue at a constant rate by
// reserving dispatch slots from the lane's shared GCRA state and starting each
// job at its slot, never earlier.
//
// A Drain repeats three steps: take up to Batch queued items from its Source
// (read ahead on a goroutine of its own, so the next items are there before
// the current ones have all started),
// take an in-flight permit for each (at most MaxInflight dispatches run at
// once), and start each item at a slot, reserving Batch slots in one call to
// the Pacer whenever the slots left from the last call do not cover the items
// held. Permits are taken before items are started, and a slot is never used
// after its deadline (below), so a slow target never makes reserved slots
// pile up and fire in a clump: they are given up instead.
//
// The drain is the only place that takes slots from a lane's state: an item
// whose slot is due at once (an idle lane with room in its bucket) starts at
// once, and Config.Assigned tells the caller so (intake answers "admitted"
// only then). Admission itself only looks at the state.
//
// Starts are never earlier than their slots, and never later than their
// deadline: less than one period after the slot's theoretical time in the
// lane's state (bucket.Reservation.Latest: the slot itself with burst 1,
// up to (burst−1) periods after it with a larger burst). A slot passed by
// more (the process stalled: GC, scheduler, a loaded machine) is given up
// as lost capacity and its item takes the next slot, instead of starting in
// a clump with the ones after it. Every slot reserved from one state, by
// any instance, has a theoretical time of its own, a period or more from
// any other's, and starts in [theoretical − τ, theoretical + T) (τ =
// (burst−1)·T), so the starts of any window of a whole number of periods
// (a second, at an integer rate) number at most burst + rate·W, exactly;
// a window of another length may hold one more, as a start's own jitter
// would. A stall shorter than τ is caught up at once, in a clump the burst
// allows (a micro-batch: with a burst, a drain that woke late starts every
// slot that passed, as the limit lets it). A limit lowered at run time
// (Pacer.Current: a longer period or a smaller burst) makes the drain give
// up the slots it holds under the old one before any of them starts, so
// the windows from the change on keep the new limit.
//
// A store far away changes none of this: the slots of a reservation are
// placed where the store put them on its own clock (bucket.Reservation.At,
// mapped onto the drain's clock, see addSlots), not where its answer came,
// so the starts of every instance keep their theoretical times' order and
// spacing whatever each answer's return leg was; and once answers take
// time, top-ups are sent ahead, on a goroutine of their own, so that no
// start waits for a round trip.
//
// The package is pure: it knows nothing of NATS, Redis or HTTP. Those come in
// through the small interfaces below.
package leaky

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
)

// Source yields queued items in queue order.
type Source[T any] interface {
	// Next blocks until at least one item is available (or ctx ends), then
	// returns up to max items that are available without waiting further.
	Next(ctx context.Context, max int) ([]T, error)
	// Release gives items back to the queue unstarted (shutdown, no slot);
	// it may be called with none.
	Release(items []T)
}

// Pacer reserves dispatch slots of one lane (or key).
type Pacer interface {
	Reserve(ctx context.Context, n int) (bucket.Reservation, error)
	// Current is the limit the next reservation takes. The drain reads it
	// before every start: slots in hand reserved under a limit with a
	// longer period or a larger burst are given up (see heldSlot).
	Current() bucket.Limit
}

// Starter starts one item's dispatch. It must not block for the dispatch: it
// runs it on its own and calls done exactly once when the dispatch finished,
// whatever the outcome. Its ctx is the dispatch context given to RunWith
// (Run's own context by Run): dispatches may outlive the drain's stop.
type Starter[T any] func(ctx context.Context, it T, done func())

// Observer receives the drain's events; every method must be cheap. The zero
// Config uses a no-op observer.
type Observer interface {
	// Started is called when an item starts, with how late it started
	// relative to its slot.
	Started(late time.Duration)
	// Reserved is called after each successful Reserve call with n slots.
	Reserved(n int)
	// PacerDown is called when Reserve fails (down=true) and when it works
	// again after failing (down=false).
	PacerDown(down bool, err error)
}

type nopObserver struct{}

func (nopObserver) Started(time.Duration) {}
func (nopObserver) Reserved(int)          {}
func (nopObserver) PacerDown(bool, error) {}

// Config configures a Drain of items of type T.
type Config[T any] struct {
	Source Source[T]
	Pacer  Pacer
	Start  Starter[T]
	// MaxInflight bounds concurrent dispatches; at least 1.
	MaxInflight int
	// Batch bounds the slots reserved in one Pacer call; at least 1. See
	// BatchFor for a good value.
	Batch int
	// RetryBackoff is the wait before calling a failed Pacer again.
	RetryBackoff time.Duration
	// GiveBackAfter: while the Pacer keeps failing for this long, held items
	// go back to the queue so that another instance may take them.
	GiveBackAfter time.Duration
	// PausedUntil, when set, tells until when the lane must not start any
	// job (a downstream asked it to wait). It is read before every start, so
	// slots reserved before a pause are given up rather than used during it.
	PausedUntil func() time.Time
	// Held, when set, says whether an operator holds the lane: while it
	// returns a non-nil channel, the drain reserves no slot and starts
	// nothing (slots already reserved are given up) until that channel
	// closes. Items in hand stay in hand. It is read before every
	// reservation and every start, so it must be cheap.
	Held func() <-chan struct{}
	// Assigned, when set, is told the slot each item is given, before the
	// drain waits for it; a slot due at or before now (and not past its
	// deadline) starts the item at once. An item that then wakes too late
	// for a future slot is told again with its next one; one whose slot
	// passed during the checks before its start starts in the later slot
	// in hand whose window holds that moment, and is told it right after
	// the start. It must be cheap.
	Assigned func(it T, s Slot)
	// MaxLate, when positive, narrows how long after its slot's
	// theoretical time an item may still start: the drain allows less than
	// one period (the most that keeps burst + rate·W in every window of
	// whole periods), or MaxLate if that is shorter. A slot missed by more
	// is given up (lost capacity, never a clump). Zero allows just under
	// one period.
	MaxLate time.Duration
	// Clock is the time source; nil means clock.Real.
	Clock    clock.Clock
	Logger   *slog.Logger
	Observer Observer
}

// MaxHeld bounds the slots a drain with this Batch holds reserved and not
// yet started: it reserves Batch more only while it holds fewer than the
// items in hand (at most Batch) plus Batch/2. A fleet that loses its shared
// state restores it past what the other instances may still hold
// (redisbucket.Config.Held), so this bound must follow startBatch.
func MaxHeld(batch int) int {
	batch = max(batch, 1)
	return 2*batch + batch/2
}

// BatchFor returns the slots to reserve per call at rate: about 20 ms worth
// of slots, at least 1 and at most maxInflight and 512. At 1,000 jobs/s that is
// one Pacer call per 20 jobs; at 20 jobs/s one call per job.
func BatchFor(rate float64, maxInflight int) int {
	return min(max(int(rate*0.020), 1), 512, maxInflight)
}

// errPaused: startBatch stopped for a downstream pause; the rest must get
// fresh slots.
var errPaused = errors.New("leaky: lane paused")

// errTightened: startBatch gave up every slot it had left because the
// lane's limit was lowered since they were reserved; the rest must get
// fresh slots.
var errTightened = errors.New("leaky: limit lowered")

// errLate: startBatch gave up every slot it had left because the drain woke
// too late for them; the rest must get fresh slots.
var errLate = errors.New("leaky: slots missed")

// DefaultMaxLate bounds how late after its slot a start of a keyed lane may
// be (lane.keyed: max(DefaultMaxLate, period)), and the lateness a quota's
// derived rate allows for (bucket.Quota.Rate). A plain lane's drain keeps a
// tighter bound, under one period after the slot's theoretical time (see
// Config.MaxLate), so what is derived with it holds for both.
const DefaultMaxLate = 2 * time.Millisecond

// Slot is a dispatch slot the drain gives an item.
type Slot struct {
	// Due is when the item may start.
	Due time.Time
	// Free: the slot was due at once when it was reserved, because the
	// lane had room in its bucket; the item does not wait for the rate.
	// Such an item is what intake calls "admitted".
	Free bool
}

// heldSlot is a reserved slot with the last moment it may start.
type heldSlot struct {
	Slot
	// deadline is the latest start that keeps the lane's limit: less than a
	// period after the slot's theoretical time (or after Due, for a store
	// that does not tell its clock reading and answered so late that Due
	// is later; see addSlots).
	deadline time.Time
	// period and burst are the limit the slot was reserved under. Slots
	// reserved ahead at a faster rate or a larger burst than the lane's
	// limit now would start at the old spacing after a change, beyond what
	// the new limit allows in a window from the change on: they are given
	// up instead (capacity lost once). Slots of a raised limit are kept:
	// they fit in the new one.
	period time.Duration
	burst  int
}

// tighter reports whether l, the lane's limit now, is stricter than the
// one s was reserved under: a longer period or a smaller burst. A slot of
// a reservation without a period (none the stores make) is never given up
// for it.
func (s heldSlot) tighter(l bucket.Limit) bool {
	return s.period > 0 && (l.Period() > s.period || l.Burst < s.burst)
}

// Drain paces one lane. Create it with New; Run it once.
type Drain[T any] struct {
	cfg     Config[T]
	permits chan struct{}
	// downSince is when the Pacer started failing; zero while it works.
	// Only Run's goroutine touches it.
	downSince time.Time
	// slots are the slots reserved and not yet used, in order, and period
	// their spacing; only Run's goroutine touches them.
	slots  []heldSlot
	period time.Duration
	// clk maps the store's clock onto the drain's; pending is the answer
	// of a top-up under way (nil when none is), stale set when the slots
	// it brings must be given up (a pause or hold since it was sent). Only
	// Run's goroutine touches them.
	clk     storeClock
	pending chan reserved
	stale   bool
	missed  atomic.Uint64
}

// reserved is the answer of a top-up made on a goroutine of its own.
type reserved struct {
	res        bucket.Reservation
	sent, recv time.Time
	err        error
}

// New checks cfg and returns a Drain. It starts nothing.
func New[T any](cfg Config[T]) (*Drain[T], error) {
	// An if chain rather than a switch: a mutation run sees if conditions,
	// not case expressions (docs/MUTATION.md).
	if cfg.Source == nil {
		return nil, errors.New("leaky: Config.Source is nil")
	}
	if cfg.Pacer == nil {
		return nil, errors.New("leaky: Config.Pacer is nil")
	}
	if cfg.Start == nil {
		return nil, errors.New("leaky: Config.Start is nil")
	}
	if cfg.MaxInflight < 1 {
		return nil, fmt.Errorf("leaky: MaxInflight %d must be at least 1", cfg.MaxInflight)
	}
	cfg.Batch = min(max(cfg.Batch, 1), cfg.MaxInflight)
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = 100 * time.Millisecond
	}
	if cfg.GiveBackAfter <= 0 {
		cfg.GiveBackAfter = 5 * time.Second
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
	return &Drain[T]{cfg: cfg, permits: make(chan struct{}, cfg.MaxInflight)}, nil
}

// Missed reports how many reserved slots were given up because no item
// could start in them by their deadline (the drain woke late, no job or permit
// was there in time, an admitted job came late). Safe for concurrent use.
func (d *Drain[T]) Missed() uint64 { return d.missed.Load() }

// fetched is one answer of Source.Next, handed from the fetcher to Run.
type fetched[T any] struct {
	items []T
	err   error
}

// Run drains until ctx ends, then waits for every dispatch it started to call
// done and returns ctx's error. Items it holds unstarted go back to the Source.
//
// The Source is read ahead on a goroutine of its own: while the drain starts
// one batch at its slots, the next one is already being fetched, so a
// queue's round trip never sits between the last slot of a batch and the
// first of the next (no batch boundaries). At most one fetched batch waits
// beside the one being started; both count in the queue's in-flight bound.
func (d *Drain[T]) Run(ctx context.Context) error { return d.RunWith(ctx, ctx) }

// RunWith is Run, with the dispatch context handed to each Start: Run's
// ctx stops the drain, dispatch bounds the dispatches it started.
func (d *Drain[T]) RunWith(ctx, dispatch context.Context) error {
	err := d.run(ctx, dispatch)
	// Wait for running dispatches: fill every permit. Not when run panics
	// (the permits of the items it held are not given back then): a crash
	// must not become a hang.
	for range d.cfg.MaxInflight {
		d.permits <- struct{}{}
	}
	return err
}

// run is Run until the dispatches it started are waited for; every path
// out of it has given back the permits of the items it did not start.
func (d *Drain[T]) run(ctx, dispatch context.Context) error {
	var held []T
	// Unbuffered: the fetcher holds the one batch read ahead until the drain
	// takes it, and reads no further. A job read and not yet given a slot
	// is in no count the answers' eta_ms see (it is neither pending in the
	// queue nor in the bucket's state), so the read-ahead is kept to one
	// batch.
	ahead := make(chan fetched[T])
	fetchCtx, stopFetch := context.WithCancel(ctx)
	fetcherDone := make(chan struct{})
	go d.fetch(fetchCtx, ahead, fetcherDone)
	// giveBackAhead hands a batch fetched ahead back to the queue.
	giveBackAhead := func() {
		select {
		case f := <-ahead:
			d.cfg.Source.Release(f.items)
		default:
		}
	}
	defer func() {
		stopFetch()
		<-fetcherDone
		giveBackAhead()
		d.cfg.Source.Release(held)
		if d.pending != nil {
			// A top-up under way ends with ctx; its slots are lost
			// capacity.
			<-d.pending
			d.pending = nil
		}
	}()
	for {
		if len(held) == 0 {
			var f fetched[T]
			select {
			case f = <-ahead:
			case <-ctx.Done():
				return ctx.Err()
			}
			if f.err != nil {
				d.cfg.Logger.Warn("queue fetch failed", "err", f.err)
				continue // the fetcher backs off before its next try
			}
			held = f.items
			if len(held) == 0 {
				continue
			}
		}
		if d.cfg.Held != nil {
			if wait := d.cfg.Held(); wait != nil {
				// Held by an operator: no slot is reserved, none kept.
				d.dropSlots()
				select {
				case <-wait:
				case <-ctx.Done():
					return ctx.Err()
				}
				continue
			}
		}
		// Permits: wait for one, then take what is free, up to len(held).
		select {
		case d.permits <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		n := 1
		for n < len(held) {
			select {
			case d.permits <- struct{}{}:
				n++
				continue
			default:
			}
			break
		}
		batch := held[:n]
		rest, err := d.startBatch(ctx, dispatch, batch)
		if errors.Is(err, errPaused) || errors.Is(err, errLate) || errors.Is(err, errTightened) {
			// The pause is over, the slots were missed or the limit was
			// lowered: reserve fresh slots for the rest.
			for range rest {
				<-d.permits
			}
			held = append(rest, held[n:]...)
			continue
		}
		if err != nil {
			// ctx ended or the pacer stayed down: rest holds unstarted items.
			for range rest {
				<-d.permits
			}
			if ctx.Err() != nil {
				held = append(rest, held[n:]...)
				return ctx.Err()
			}
			// Everything this drain holds goes back, so that another
			// instance may take it.
			d.cfg.Source.Release(append(rest, held[n:]...))
			giveBackAhead()
			held = nil
			continue
		}
		held = held[n:]
	}
}

// fetch reads the Source ahead of the drain until ctx ends, one answer at a
// time into ahead; a failed read is passed on and retried after
// RetryBackoff. Items read when ctx ends go back to the Source.
func (d *Drain[T]) fetch(ctx context.Context, ahead chan<- fetched[T], done chan<- struct{}) {
	defer close(done)
	for ctx.Err() == nil {
		items, err := d.cfg.Source.Next(ctx, d.cfg.Batch)
		if ctx.Err() != nil {
			d.cfg.Source.Release(items)
			return
		}
		select {
		case ahead <- fetched[T]{items: items, err: err}:
		case <-ctx.Done():
			d.cfg.Source.Release(items)
			return
		}
		if err != nil && d.cfg.Clock.Sleep(ctx, d.cfg.RetryBackoff) != nil {
			return
		}
	}
}

// startBatch reserves slots for batch and starts every item at its slot.
// Each item holds a permit. On error it returns the items it did not start
// (their permits still held).
func (d *Drain[T]) startBatch(ctx, dispatch context.Context, batch []T) ([]T, error) {
	d.collect(false)
	if len(d.slots) == 0 && d.pending != nil {
		d.collect(true)
	}
	inLine := len(batch)+d.cfg.Batch/2 > len(d.slots)
	if d.async() || d.pending != nil {
		// Topped up ahead (prefetch, below) while the slots in hand
		// start; in line only when none are left, and never beside a
		// top-up under way.
		inLine = len(d.slots) == 0 && d.pending == nil
	}
	if inLine {
		// Reserve a whole batch, not just what is held, and before the slots
		// in hand run out: a queue that hands out jobs a few at a time then
		// still costs one call per Batch jobs, the jobs fetched next take
		// the slots left over, and the state's tat stays ahead of now, so no
		// time is lost between batches. Slots nobody takes in time are given
		// up below: capacity lost, never overshoot.
		res, sent, t0, err := d.reserve(ctx, max(len(batch), d.cfg.Batch))
		if err != nil {
			return batch, err
		}
		d.addSlots(res, sent, t0)
	}
	for i, it := range batch {
		var due time.Time
		var late time.Duration
		// retold: the item starts in a later slot than it was told (see
		// below); it is told again once it started.
		var retold *Slot
		for {
			// Slots already too late are given up before the item is told
			// one: an item told a slot due at once does start at once.
			for len(d.slots) > 0 && d.cfg.Clock.Now().After(d.slots[0].deadline) {
				d.slots = d.slots[1:]
				d.missed.Add(1)
			}
			d.prefetch(ctx, len(batch)-i)
			if len(d.slots) == 0 {
				if d.pending != nil {
					d.collect(true)
					continue
				}
				// Every slot left was missed.
				return batch[i:], errLate
			}
			slot := d.slots[0]
			due = slot.Due
			d.slots = d.slots[1:]
			if d.cfg.Assigned != nil {
				d.cfg.Assigned(it, slot.Slot)
			}
			if now := d.cfg.Clock.Now(); due.After(now) {
				if err := d.cfg.Clock.Sleep(ctx, due.Sub(now)); err != nil {
					// Reserved slots of unstarted items are lost capacity,
					// never overshoot.
					return batch[i:], err
				}
			}
			if d.cfg.Held != nil && d.cfg.Held() != nil {
				// Held since the slots were reserved: give them up; run
				// waits for the release before reserving again.
				d.dropSlots()
				return batch[i:], errPaused
			}
			if d.cfg.PausedUntil != nil {
				if until := d.cfg.PausedUntil(); until.After(d.cfg.Clock.Now()) {
					// Give up the reserved slots; wait out the pause.
					d.dropSlots()
					if err := d.cfg.Clock.Sleep(ctx, until.Sub(d.cfg.Clock.Now())); err != nil {
						return batch[i:], err
					}
					return batch[i:], errPaused
				}
			}
			if slot.tighter(d.cfg.Pacer.Current()) {
				// Reserved at a faster rate or a larger burst than the
				// limit now: give them all up; run reserves fresh ones,
				// which follow the given-up ones in the state.
				d.dropSlots()
				return batch[i:], errTightened
			}
			// The deadline is checked last, right before the start: what
			// runs between the two may only make a start later than the
			// check saw it.
			now := d.cfg.Clock.Now()
			if !now.After(slot.deadline) {
				late = now.Sub(due)
				break
			}
			// Too late for this slot: starting in it would clump with the
			// slots after it beyond what the limit allows. Give it up. A
			// later slot in hand whose window holds now takes the item at
			// once, the ones before it given up too; the checks above
			// are not run again for it, since at a rate whose period is
			// shorter than they take (a loaded machine, the race
			// detector, bucket.MaxRate) every slot they wait for would be
			// missed by them in turn, and the drain would start nothing
			// while it gave up slot after slot.
			d.missed.Add(1)
			if k := d.slotAt(now); k >= 0 {
				d.missed.Add(uint64(k))
				slot = d.slots[k]
				d.slots = d.slots[k+1:]
				late, retold = now.Sub(slot.Due), &slot.Slot
				break
			}
			// None: the item takes the next slot, after the checks.
		}
		d.cfg.Observer.Started(late)
		d.cfg.Start(dispatch, it, d.done)
		if retold != nil && d.cfg.Assigned != nil {
			// After the start, so that nothing runs between the deadline's
			// check and the start.
			d.cfg.Assigned(it, *retold)
		}
	}
	return nil, nil
}

// slotAt returns the index of the first slot in hand whose window holds
// now (due at or before it, deadline not passed), or -1 when the first
// slot not yet passed is due later (or none is left).
func (d *Drain[T]) slotAt(now time.Time) int {
	for k, s := range d.slots {
		if now.After(s.deadline) {
			continue
		}
		if s.Due.After(now) {
			return -1
		}
		return k
	}
	return -1
}

func (d *Drain[T]) done() { <-d.permits }

// addSlots appends the slots of res, a reservation sent at sent and
// answered at recv, to the slots in hand, each with its deadline.
//
// The store decided them at its own now (res.At), somewhere between sent
// and recv; the slots are placed on its time line: At mapped onto the
// local clock (storeClock: the clocks as they read, unless the fastest
// recent round trip proves them apart), so that every slot starts where
// the store put it, whichever call brought it and however long that call's
// answer took. Starts then keep their theoretical times' order and spacing
// across calls and across instances (up to what the instances' clocks
// disagree by within that bound), and a store farther away than τ costs no
// exactness: a slot answered after its deadline is given up like one
// overslept. A store that
// does not tell At has its delays counted from the answer and its
// theoretical times from the call, the deadline from the answer when that
// came later (DESIGN.md: a window may then hold one start more).
func (d *Drain[T]) addSlots(res bucket.Reservation, sent, recv time.Time) {
	d.period = res.Period
	slack := max(res.Period-1, 0) // under one period: see heldSlot
	if d.cfg.MaxLate > 0 {
		slack = min(slack, d.cfg.MaxLate)
	}
	dueFrom, theoFrom, known := recv, sent, !res.At.IsZero()
	if known {
		d.clk.add(sent, recv, res.At)
		dueFrom = d.clk.local(sent, recv, res.At)
		theoFrom = dueFrom
	}
	burst := 1
	if res.Period > 0 {
		burst = int(res.Tolerance/res.Period) + 1
	}
	for j := range res.N {
		delay := res.Delay(j)
		due := dueFrom.Add(delay)
		theo := theoFrom.Add(res.Latest(j))
		if due.After(theo) {
			// Only without At: the answer came after the slot's
			// theoretical time, and the deadline counts from the answer
			// so that every slot is not given up.
			theo = due
		}
		d.slots = append(d.slots, heldSlot{Slot: Slot{Due: due, Free: delay == 0}, deadline: theo.Add(slack), period: res.Period, burst: burst})
	}
}

// async reports whether top-ups are made ahead, on a goroutine of their
// own, while the slots in hand start: when the store's answers take time
// on the drain's clock. A call in line would hold every start due during
// its round trip (a store 1 ms away made a burst-1 lane at 1,000/s give
// up slots). A store that answers in no time on the drain's clock (in
// process, on a virtual clock) is called in line.
func (d *Drain[T]) async() bool { return d.clk.maxRTT() > 0 }

// prefetch sends a top-up of Batch slots ahead when the slots in hand no
// longer cover the items left of the batch (want) and half a batch more
// (the rule of the in-line top-up), or twice the slowest recent round trip
// more, so that its answer comes before they run out; never more than
// MaxHeld slots in hand and under way.
func (d *Drain[T]) prefetch(ctx context.Context, want int) {
	if d.pending != nil || !d.async() || d.period <= 0 {
		return
	}
	if len(d.slots) >= want+max(d.cfg.Batch/2, int(2*d.clk.maxRTT()/d.period)) || len(d.slots)+d.cfg.Batch > MaxHeld(d.cfg.Batch) {
		return
	}
	ch := make(chan reserved, 1)
	d.pending, d.stale = ch, false
	n := d.cfg.Batch
	go func() {
		sent := d.cfg.Clock.Now()
		res, err := d.cfg.Pacer.Reserve(ctx, n)
		ch <- reserved{res: res, sent: sent, recv: d.cfg.Clock.Now(), err: err}
	}()
}

// collect takes the answer of the top-up under way, waiting for it when
// wait is set, and adds its slots. A failed top-up is dropped: the drain
// reserves in line once its slots run out, and reports the pacer down
// there.
func (d *Drain[T]) collect(wait bool) {
	if d.pending == nil {
		return
	}
	var r reserved
	if wait {
		r = <-d.pending
	} else {
		select {
		case r = <-d.pending:
		default:
			return
		}
	}
	d.pending = nil
	if r.err != nil {
		return
	}
	d.cfg.Observer.Reserved(r.res.N)
	if d.stale {
		// Reserved before a pause or hold: given up like the others.
		return
	}
	d.addSlots(r.res, r.sent, r.recv)
}

// dropSlots gives up the slots in hand and those of a top-up under way.
func (d *Drain[T]) dropSlots() {
	d.slots = nil
	d.stale = true
}

// storeClock maps the clock of the store that decides the slots onto the
// drain's. Each answer with the store's reading At is a sample: the call
// was sent at sent and answered at recv, so At was read somewhere in
// between, and the store's clock is ahead of the local one by At − (sent +
// rtt/2), give or take rtt/2 (the difference of the call's two legs). The
// sample of the fastest round trip among the last clockSamples bounds the
// offset the most tightly; queueing on a slow call does not widen it.
//
// Within that bound the clocks are believed: hosts kept in step by NTP
// read the same time to far better than a round trip's asymmetry, and on
// one host they are one clock. Only clocks that the round trips prove
// apart are corrected, by the least the bound requires. So a fleet whose
// clocks agree places every slot exactly where the store put it, and one
// with a clock gone astray still places its slots within half its fastest
// round trip of their place, never outside the call that brought them.
// The zero value has no sample.
type storeClock struct {
	samples [clockSamples]offsetSample
	n, next int
}

// clockSamples is how many recent answers storeClock keeps: about a
// second of calls at 1,000 jobs/s, so a clock step is followed soon.
const clockSamples = 64

type offsetSample struct {
	offset, rtt time.Duration
}

func (c *storeClock) add(sent, recv, at time.Time) {
	rtt := recv.Sub(sent)
	c.samples[c.next] = offsetSample{offset: at.Sub(sent.Add(rtt / 2)), rtt: rtt}
	c.next = (c.next + 1) % clockSamples
	c.n = min(c.n+1, clockSamples)
}

// local is the store's reading at, of a call sent at sent and answered at
// recv, on the local clock: at less the offset (see storeClock), kept
// within [sent, recv], where the store's now must lie whatever the clocks
// say.
func (c *storeClock) local(sent, recv, at time.Time) time.Time {
	best := -1
	for i := range c.n {
		if best < 0 || c.samples[i].rtt < c.samples[best].rtt {
			best = i
		}
	}
	t := at
	if best >= 0 {
		// The offset lies in [est − rtt/2, est + rtt/2]: zero if it can,
		// else the end nearest zero.
		s := c.samples[best]
		half := s.rtt / 2
		t = at.Add(-min(max(0, s.offset-half), s.offset+half))
	}
	if t.Before(sent) {
		return sent
	}
	if t.After(recv) {
		return recv
	}
	return t
}

// maxRTT is the slowest round trip among the recent samples.
func (c *storeClock) maxRTT() time.Duration {
	var m time.Duration
	for i := range c.n {
		m = max(m, c.samples[i].rtt)
	}
	return m
}

// reserve calls the Pacer until it answers, ctx ends, or it has failed for
// GiveBackAfter. t0 is when the answer came and sent when the answering
// call was made: the store's now lies between the two (see addSlots).
func (d *Drain[T]) reserve(ctx context.Context, n int) (res bucket.Reservation, sent, t0 time.Time, err error) {
	var firstFail time.Time
	for {
		sent = d.cfg.Clock.Now()
		res, err = d.cfg.Pacer.Reserve(ctx, n)
		now := d.cfg.Clock.Now()
		if err == nil {
			if !d.downSince.IsZero() {
				d.cfg.Observer.PacerDown(false, nil)
				d.cfg.Logger.Info("pacer is back, drain resumes", "down_for", now.Sub(d.downSince).String())
				d.downSince = time.Time{}
			}
			d.cfg.Observer.Reserved(res.N)
			return res, sent, now, nil
		}
		if ctx.Err() != nil {
			return res, sent, now, ctx.Err()
		}
		if d.downSince.IsZero() {
			d.downSince = now
			d.cfg.Observer.PacerDown(true, err)
			d.cfg.Logger.Warn("pacer unavailable, drain paused", "err", err)
		}
		if firstFail.IsZero() {
			firstFail = now
		}
		if now.Sub(firstFail) >= d.cfg.GiveBackAfter {
			return res, sent, now, fmt.Errorf("leaky: pacer down for %v: %w", now.Sub(firstFail), err)
		}
		if d.cfg.Clock.Sleep(ctx, d.cfg.RetryBackoff) != nil {
			return res, sent, now, ctx.Err()
		}
	}
}

// StorePacer adapts a bucket.Store to a Pacer for one key and limit. The limit
// is read on every call through Limit so that it can change at runtime.
type StorePacer struct {
	Store bucket.Store
	Key   bucket.Key
	Limit func() bucket.Limit
}

// Reserve implements Pacer.
func (p StorePacer) Reserve(ctx context.Context, n int) (bucket.Reservation, error) {
	return p.Store.Reserve(ctx, p.Key, p.Limit(), n)
}

// Current implements Pacer: the limit Limit gives now.
func (p StorePacer) Current() bucket.Limit {
	return p.Limit()
}
