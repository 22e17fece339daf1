package lane

import (
	"context"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/metrics"
)

// CountCalls wraps the lane state stores so that every call is counted in
// throttler_pacer_calls_total per lane and operation.
func CountCalls(s bucket.Store, p bucket.PairStore, m *metrics.Metrics) (bucket.Store, bucket.PairStore) {
	return counting{s, m}, countingPair{p, m}
}

// counting counts calls to the state store per lane and operation.
type counting struct {
	bucket.Store
	m *metrics.Metrics
}

func (c counting) count(k bucket.Key, op string) {
	c.m.PacerCalls.WithLabelValues(k.Lane, op).Inc()
}

func (c counting) Admit(ctx context.Context, k bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	c.count(k, "admit")
	return c.Store.Admit(ctx, k, l)
}

func (c counting) Reserve(ctx context.Context, k bucket.Key, l bucket.Limit, n int) (bucket.Reservation, error) {
	c.count(k, "reserve")
	return c.Store.Reserve(ctx, k, l, n)
}

func (c counting) Pause(ctx context.Context, k bucket.Key, l bucket.Limit, d time.Duration) error {
	c.count(k, "pause")
	return c.Store.Pause(ctx, k, l, d)
}

// countingPair counts keyed lanes' slot reservations like counting.
type countingPair struct {
	bucket.PairStore
	m *metrics.Metrics
}

func (c countingPair) ReservePair(ctx context.Context, k bucket.Key, ll, kl bucket.Limit, ahead, carry time.Duration) (bucket.PairReservation, error) {
	c.m.PacerCalls.WithLabelValues(k.Lane, "reserve_pair").Inc()
	return c.PairStore.ReservePair(ctx, k, ll, kl, ahead, carry)
}
