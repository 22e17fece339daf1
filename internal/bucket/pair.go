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
	// than PairSlack after the lane's: nothing was taken, and KeyNext says
	// when the key may ask again.
	OK bool
	// Due is when the job may start (0: at once).
	Due time.Duration
	// Free: both buckets had room; the job does not wait for either rate.
	Free bool
	// KeyNext and LaneNext are the earliest starts the key's and the lane's
	// state would grant next (after this reservation, when OK).
	KeyNext, LaneNext time.Duration
}

// PairSlack is how much later than the lane's next slot a key's own next
// slot may be and still take the pair: the lane then loses that much
// capacity, never more.
const PairSlack = time.Millisecond

// PairStore takes slots of a keyed lane: the lane-wide limit and one key's
// limit in one atomic step, so that a start counts against both or neither.
type PairStore interface {
	// ReservePair reserves one slot of key k (k.Sub not empty) under its
	// limit kl and the lane-wide limit ll of Key{Lane: k.Lane}.
	ReservePair(ctx context.Context, k Key, ll, kl Limit) (PairReservation, error)
}

// ReservePair applies one pair reservation at now to the lane's state laneTat
// and the key's state keyTat (zero time: a full bucket). The job is treated
// as arriving at due, the first instant both states conform; both advance as
// for an arrival then: tat = max(tat, due) + T. Each state alone therefore
// keeps its bound (burst + rate·W starts in any window W), whatever the
// order in which keys ask. A key that would only conform more than
// PairSlack after the lane takes nothing (OK false), so a key that is not
// ready never holds lane capacity. It returns the reservation and the new
// states.
func ReservePair(now, laneTat, keyTat time.Time, ll, kl Limit) (PairReservation, time.Time, time.Time) {
	el := laneTat.Add(-ll.Tolerance())
	if el.Before(now) {
		el = now
	}
	ek := keyTat.Add(-kl.Tolerance())
	if ek.Before(now) {
		ek = now
	}
	if ek.Sub(el) > PairSlack {
		return PairReservation{KeyNext: ek.Sub(now), LaneNext: el.Sub(now)}, laneTat, keyTat
	}
	due := el
	if ek.After(due) {
		due = ek
	}
	laneTat = later(laneTat, due).Add(ll.Period())
	keyTat = later(keyTat, due).Add(kl.Period())
	return PairReservation{
		OK: true, Due: due.Sub(now), Free: due.Equal(now),
		KeyNext:  max(keyTat.Add(-kl.Tolerance()).Sub(now), 0),
		LaneNext: max(laneTat.Add(-ll.Tolerance()).Sub(now), 0),
	}, laneTat, keyTat
}

func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// ReservePair implements PairStore.
func (m *Memory) ReservePair(_ context.Context, k Key, ll, kl Limit) (PairReservation, error) {
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
		r, next, m.states[k] = ReservePair(now, laneTat, m.states[k], ll, kl)
		return next
	})
	return r, nil
}

var _ PairStore = (*Memory)(nil)
