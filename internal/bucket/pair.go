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
}

// PairSlack is the least lead ReservePair allows a key's slot over the
// lane's (a smaller ahead counts as this).
const PairSlack = time.Millisecond

// PairStore takes slots of a keyed lane: the lane-wide limit and one key's
// limit in one atomic step, so that a start counts against both or neither.
type PairStore interface {
	// ReservePair reserves one slot of key k (k.Sub not empty) under its
	// limit kl and the lane-wide limit ll of Key{Lane: k.Lane}; the key's
	// own next slot may come at most ahead after the lane's.
	ReservePair(ctx context.Context, k Key, ll, kl Limit, ahead time.Duration) (PairReservation, error)
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
// slot so that the slot starts on time. It returns the reservation and the
// new states.
func ReservePair(now, laneTat, keyTat time.Time, ll, kl Limit, ahead time.Duration) (PairReservation, time.Time, time.Time) {
	el := laneTat.Add(-ll.Tolerance())
	if el.Before(now) {
		el = now
	}
	ek := keyTat.Add(-kl.Tolerance())
	if ek.Before(now) {
		ek = now
	}
	if ek.Sub(el) > max(ahead, PairSlack) {
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
func (m *Memory) ReservePair(_ context.Context, k Key, ll, kl Limit, ahead time.Duration) (PairReservation, error) {
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
		r, next, m.states[k] = ReservePair(now, laneTat, m.states[k], ll, kl, ahead)
		return next
	})
	return r, nil
}

var _ PairStore = (*Memory)(nil)
