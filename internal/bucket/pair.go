package bucket

import (
	"context"
	"time"
)

// PairReservation is one dispatch slot taken from a keyed lane's lane-wide
// state and from one key's state at once (ReservePair). Durations are
// measured from the store's now.
type PairReservation struct {
	// OK: the slot was reserved. False when the key's own next slot is more
	// than the allowed lead (ahead) after the lane's: nothing was taken,
	// and KeyNext says when the key may ask again.
	OK bool
	// Due is when the job may start (0: at once).
	Due time.Duration
	// Free: both buckets had room; the job does not wait for either rate.
	Free bool
	// KeyNext and LaneNext are the earliest starts the key's and the lane's
	// state would grant next (after this reservation, when OK).
	KeyNext, LaneNext time.Duration
	// KeyLatest is the slot's theoretical time in the key's state (its tat
	// less one period; at or after Due when OK): a start after it counts
	// where it happened only when the key's next reservation carries the
	// difference (ReservePair's carry).
	KeyLatest time.Duration
}

// PairSlack is the least lead ReservePair allows a key's slot over the
// lane's (a smaller ahead counts as this).
const PairSlack = time.Millisecond

// PairStore takes slots of a keyed lane: the lane-wide limit and one key's
// limit in one atomic step, so that a start counts against both or neither.
type PairStore interface {
	// ReservePair reserves one slot of key k (k.Sub not empty) under its
	// limit kl and the lane-wide limit ll of Key{Lane: k.Lane}; the key's
	// own next slot may come at most ahead after the lane's. carry is how
	// long after their theoretical times (KeyLatest) the key's earlier
	// slots started, not carried yet: the key's state first moves on by
	// that much, so that it counts those starts where they happened (a
	// refused reservation stores nothing: the caller carries it again).
	ReservePair(ctx context.Context, k Key, ll, kl Limit, ahead, carry time.Duration) (PairReservation, error)
}

// ReservePair applies one pair reservation at now to the lane's state laneTat
// and the key's state keyTat (zero time: a full bucket). The job is treated
// as arriving at due, the first instant both states conform; both advance as
// for an arrival then: tat = max(tat, due) + T. Each state alone therefore
// keeps its bound (burst + rate·W starts in any window W), whatever the
// order in which keys ask. A key that would only conform more than ahead
// (at least PairSlack) after the lane takes nothing (OK false), so a key
// that is not nearly ready never holds lane capacity; one that is takes the
// lane's slot at its own, later time (the lane's state then counts the job
// there: the lane may lose up to ahead of capacity when its burst is
// shorter, never overshoot). A caller reserves a little ahead of a key's
// slot so that the slot starts on time. carry first moves the key's state
// on (a start later than its theoretical time counts where it happened:
// the key's next start then comes a period after it, G1 per key in every
// window); an empty state (a full bucket) has nothing to move. It returns
// the reservation and the new states; a refusal returns them unchanged.
func ReservePair(now, laneTat, keyTat time.Time, ll, kl Limit, ahead, carry time.Duration) (PairReservation, time.Time, time.Time) {
	kt := keyTat
	if carry > 0 && !kt.IsZero() {
		kt = kt.Add(carry)
	}
	el, ek := nextStart(now, laneTat, ll), nextStart(now, kt, kl)
	if ek.Sub(el) > max(ahead, PairSlack) {
		return PairReservation{KeyNext: ek.Sub(now), LaneNext: el.Sub(now)}, laneTat, keyTat
	}
	due := el
	if ek.After(due) {
		due = ek
	}
	// Each state takes its one slot as an arrival at due: Reserve's step.
	_, laneTat = Reserve(due, laneTat, ll, 1)
	_, keyTat = Reserve(due, kt, kl, 1)
	return PairReservation{
		OK: true, Due: due.Sub(now), Free: due.Equal(now),
		KeyNext:   nextStart(now, keyTat, kl).Sub(now),
		LaneNext:  nextStart(now, laneTat, ll).Sub(now),
		KeyLatest: keyTat.Add(-kl.Period()).Sub(now),
	}, laneTat, keyTat
}

// nextStart is the earliest instant at or after now that a slot of the state
// tat may start, max(now, tat − τ): where Reserve puts slot 0.
func nextStart(now, tat time.Time, l Limit) time.Time {
	r, _ := Reserve(now, tat, l, 1)
	return now.Add(r.Delay(0))
}

// ReservePair implements PairStore.
func (m *Memory) ReservePair(_ context.Context, k Key, ll, kl Limit, ahead, carry time.Duration) (PairReservation, error) {
	if err := ll.Validate(); err != nil {
		return PairReservation{}, err
	}
	if err := kl.Validate(); err != nil {
		return PairReservation{}, err
	}
	lk := Key{Lane: k.Lane}
	var r PairReservation
	m.update(lk, func(now, laneTat time.Time) time.Time {
		var next time.Time
		r, next, m.states[k] = ReservePair(now, laneTat, m.states[k], ll, kl, ahead, carry)
		return next
	})
	return r, nil
}

var _ PairStore = (*Memory)(nil)
