package lane

import (
	"fmt"
	"net/http"
	"time"

	"github.com/throttler/throttler/internal/dispatch"
)

// Outcome is what settling a delivery depends on.
type Outcome struct {
	Result dispatch.Result
	// Attempt is this delivery's attempt number, 1 for the first.
	Attempt int
	// MaxAttempts is the lane's retry.max_attempts.
	MaxAttempts int
	// Stopping: the delivery was cut short by a stop (shutdown_timeout),
	// not by the target.
	Stopping bool
}

// Kind is what happens to a delivered job's message.
type Kind int

const (
	// Ack: done; the job leaves the queue.
	Ack Kind = iota
	// Release: back to the queue at once, unstarted in effect (a stop cut
	// the delivery short); no attempt is counted.
	Release
	// Wait: back to the queue in its place after Action.Delay, without
	// counting an attempt (the target asked the lane to slow down).
	Wait
	// Retry: a copy with one more attempt waits Action.Delay, then queues
	// behind the backlog.
	Retry
	// Dead: to the dead-letter stream.
	Dead
)

func (k Kind) String() string {
	switch k {
	case Ack:
		return "ack"
	case Release:
		return "release"
	case Wait:
		return "wait"
	case Retry:
		return "retry"
	case Dead:
		return "dead"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Action is the decision for one delivered job.
type Action struct {
	Kind Kind
	// Delay is how long a Wait or a Retry waits.
	Delay time.Duration
	// Reason says why a job is Dead.
	Reason string
	// RateLimited: the target asked the lane to slow down (adaptive mode
	// lowers the rate).
	RateLimited bool
}

// minWait is the shortest wait in place after a rate-limit answer without
// a usable delay.
const minWait = time.Second

// Settle decides what happens to a delivered job, by the table in
// docs/DESIGN.md ("Retries and dead letters"):
//
//   - done → Ack;
//   - cut short by a stop, or never started (a pull-mode worker handed it
//     back) → Release (not the target's fault);
//   - 429, or 503 with a wait → Wait in place for the longest of the asked
//     delay, the lane pause and minWait, without counting an attempt;
//   - another failure before the last attempt → Retry after the target's
//     Retry-After, else backoff(attempt);
//   - a failure on the last attempt, or a refusal → Dead.
//
// It is pure: the caller applies the action.
func Settle(o Outcome, backoff func(attempt int) time.Duration) Action {
	// An if chain rather than a switch: the coverage profile (and so a
	// mutation run over it) sees if conditions, not case expressions.
	res := o.Result
	if res.Verdict == dispatch.Done {
		return Action{Kind: Ack}
	}
	if o.Stopping || res.Unstarted {
		return Action{Kind: Release}
	}
	if res.Verdict != dispatch.Retry {
		return Action{Kind: Dead, Reason: "rejected by target"}
	}
	if rateLimited(res) {
		return Action{Kind: Wait, Delay: max(res.RetryAfter, res.PauseLane, minWait), RateLimited: true}
	}
	if o.Attempt < o.MaxAttempts {
		delay := res.RetryAfter
		if delay <= 0 {
			delay = backoff(o.Attempt)
		}
		return Action{Kind: Retry, Delay: delay}
	}
	return Action{Kind: Dead, Reason: fmt.Sprintf("failed %d attempts", o.Attempt)}
}

// rateLimited reports an answer that asks the lane to slow down rather than
// saying the job failed.
func rateLimited(res dispatch.Result) bool {
	return res.Status == http.StatusTooManyRequests || (res.Status == http.StatusServiceUnavailable && res.PauseLane > 0)
}
