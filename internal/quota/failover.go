package quota

import (
	"context"
	"errors"

	"github.com/throttler/throttler/internal/bucket"
)

// Failover asks Primary (the fleet's shared state, Redis) and, when it
// cannot answer (an error wrapping bucket.ErrUnavailable), Local (this
// instance's memory). While Redis is away each instance then enforces the
// quotas on its own: a caller spread over n instances gets up to n times
// its quota, and nobody is refused for want of Redis (fail open per
// instance, never closed for everyone). Safe for concurrent use.
type Failover struct {
	Primary Limiter
	Local   Limiter
	// OnFallback, when set, hears every check answered by Local, with the
	// primary's error (for a log and a counter).
	OnFallback func(err error)
}

var _ Limiter = (*Failover)(nil)

// Check implements Limiter.
func (f *Failover) Check(ctx context.Context, r Request) (Result, error) {
	res, err := f.Primary.Check(ctx, r)
	if err == nil || !errors.Is(err, bucket.ErrUnavailable) {
		return res, err
	}
	if f.OnFallback != nil {
		f.OnFallback(err)
	}
	return f.Local.Check(ctx, r)
}
