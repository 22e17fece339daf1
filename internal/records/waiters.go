package records

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
)

// WaitPrefix starts the subject on which an instance hears the records of
// the jobs its callers wait for (WaitSubject): the drain that settles such
// a job publishes the record there, whichever instance it runs on. Only
// the throttler may publish under throttler.> (docs/OPERATIONS.md).
const WaitPrefix = "throttler.records."

// WaitSubject is instance's wait subject.
func WaitSubject(instance string) string { return WaitPrefix + instance }

// WaitAddress keeps a stored job's wait address only when it is a wait
// subject: a message can never make the throttler publish anywhere else.
func WaitAddress(v string) string {
	id, ok := strings.CutPrefix(v, WaitPrefix)
	if !ok || id == "" || len(id) > 64 {
		return ""
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return ""
		}
	}
	return v
}

// ErrTooManyWaiters: the instance holds its most waiting callers.
var ErrTooManyWaiters = errors.New("records: too many callers wait on this instance")

// ErrCallerWaits: the caller holds its share of the instance's waits
// (a quarter of them, at least one).
var ErrCallerWaits = errors.New("records: this caller holds its most waiting requests on this instance")

// DefaultMaxWaiters bounds the callers one instance holds waiting.
const DefaultMaxWaiters = 10_000

// Waiters holds the callers of one instance that wait for their jobs to
// settle: one subscription to the instance's wait subject and a map of
// waiters, not a subscription per request. Safe for concurrent use.
type Waiters struct {
	nc      *nats.Conn
	address string
	max     int
	log     *slog.Logger
	sub     *nats.Subscription

	mu      sync.Mutex
	waiting map[waitKey][]chan api.JobRecord
	n       int
	// share bounds the waits of one caller; byCaller counts them.
	share    int
	byCaller map[string]int
}

type waitKey struct{ lane, id string }

// NewWaiters returns the waiters of instance, at most most at once (0:
// DefaultMaxWaiters), of which one caller holds at most a quarter (at
// least one). It starts nothing: Listen subscribes.
func NewWaiters(nc *nats.Conn, instance string, most int, logger *slog.Logger) *Waiters {
	if most <= 0 {
		most = DefaultMaxWaiters
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Waiters{nc: nc, address: WaitSubject(instance), max: most, log: logger.With("component", "waiters"),
		waiting: map[waitKey][]chan api.JobRecord{}, share: max(1, most/4), byCaller: map[string]int{}}
}

// Listen subscribes to the instance's wait subject.
func (w *Waiters) Listen() error {
	sub, err := w.nc.Subscribe(w.address, w.onRecord)
	if err != nil {
		return fmt.Errorf("records: subscribe %s: %w", w.address, err)
	}
	w.sub = sub
	return nil
}

// Close ends the subscription; waits in progress run out.
func (w *Waiters) Close() {
	if w.sub != nil {
		_ = w.sub.Unsubscribe()
	}
}

// Address goes into a stored job whose caller waits for it.
func (w *Waiters) Address() string { return w.address }

// Waiting is how many callers wait now.
func (w *Waiters) Waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Expect registers a wait of caller (who waits: an API key, else a client
// address) for the settled record of lane's job id. Call it before the job
// is stored; then wait, and call cancel when done. ErrTooManyWaiters: the
// instance holds its most waits; ErrCallerWaits: caller holds its share.
func (w *Waiters) Expect(lane, id, caller string) (ch <-chan api.JobRecord, cancel func(), err error) {
	k := waitKey{lane, id}
	c := make(chan api.JobRecord, 1)
	w.mu.Lock()
	switch {
	case w.n >= w.max:
		w.mu.Unlock()
		return nil, nil, ErrTooManyWaiters
	case w.byCaller[caller] >= w.share:
		w.mu.Unlock()
		return nil, nil, fmt.Errorf("%w (%d)", ErrCallerWaits, w.share)
	}
	w.waiting[k] = append(w.waiting[k], c)
	w.n++
	w.byCaller[caller]++
	w.mu.Unlock()
	var once sync.Once
	return c, func() { once.Do(func() { w.remove(k, c, caller) }) }, nil
}

func (w *Waiters) remove(k waitKey, c chan api.JobRecord, caller string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byCaller[caller]--; w.byCaller[caller] <= 0 {
		delete(w.byCaller, caller)
	}
	cs := w.waiting[k]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i], cs[i+1:]...)
			w.n--
			break
		}
	}
	if len(cs) == 0 {
		delete(w.waiting, k)
	} else {
		w.waiting[k] = cs
	}
}

// Tell hands a settled record to the callers waiting on this instance.
func (w *Waiters) Tell(rec api.JobRecord) {
	w.mu.Lock()
	cs := w.waiting[waitKey{rec.Lane, rec.ID}]
	for _, c := range cs {
		select {
		case c <- rec:
		default:
		}
	}
	w.mu.Unlock()
}

func (w *Waiters) onRecord(m *nats.Msg) {
	rec, err := decode(m.Data)
	if err != nil {
		w.log.Warn("record on the wait subject dropped", "err", err)
		return
	}
	w.Tell(rec)
}

// Settled sends a settled record to the instance waiting at address (a
// WaitAddress), whichever instance that is; a failure is logged (the
// waiting caller reads the record at its next poll).
func (s *Store) Settled(address string, rec api.JobRecord) {
	if WaitAddress(address) == "" {
		s.log.Warn("wait address refused", "address", address)
		return
	}
	b, err := encode(rec)
	if err == nil {
		err = s.nc.Publish(address, b)
	}
	if err != nil {
		s.log.Warn("telling a waiting caller failed", "lane", rec.Lane, "id", rec.ID, "err", err)
	}
}

// Wait waits for the record of a job to settle: from the waiters' channel,
// or by reading the store every poll (a job whose stored copy does not
// name this instance, as a resubmission's). It returns the last record
// read and whether it is settled when ctx ends.
//
// Only records v sees count: the waited job's record can go (keep passes
// while the job still waits in its lane) and another caller's job take its
// id, and its record must not answer this wait.
func (s *Store) Wait(ctx context.Context, ch <-chan api.JobRecord, lane, id string, v Viewer, poll time.Duration) (api.JobRecord, bool) {
	var last api.JobRecord
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case rec := <-ch:
			if v.Sees(rec) {
				return rec, true
			}
		case <-t.C:
			rec, _, err := s.Get(ctx, lane, id)
			if err == nil && v.Sees(rec) {
				last = rec
				if rec.State.Settled() {
					return rec, true
				}
			}
		case <-ctx.Done():
			return last, false
		}
	}
}
