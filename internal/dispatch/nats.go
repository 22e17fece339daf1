package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of NATS deliveries and replies.
const (
	// HeaderLane carries Job.Lane to a NATS worker.
	HeaderLane = "Throttler-Lane"
	// HeaderKey carries Job.Key to a NATS worker (only when not empty),
	// beside HeaderThrottleKey.
	HeaderKey = "Throttler-Key"
	// HeaderAttempt carries Job.Attempt to a NATS worker.
	HeaderAttempt = "Throttler-Attempt"
	// HeaderStatus is the worker's verdict in its reply: "done" (or
	// absent), "retry" or "dead".
	HeaderStatus = "Throttler-Status"
	// HeaderError is an optional reason in a worker's reply; it becomes
	// Result.Err for retry and dead replies.
	HeaderError = "Throttler-Error"
	// HeaderRetryAfter in a "retry" reply is the wait in seconds before
	// the job is tried again.
	HeaderRetryAfter = "Retry-After"

	// DefaultNATSTimeout bounds one request when NATSConfig.Timeout is 0.
	DefaultNATSTimeout = 10 * time.Second
)

// ErrWorker is the error of a worker reply with status "retry" or "dead";
// the wrapping error carries the worker's Throttler-Error text.
var ErrWorker = errors.New("dispatch: worker refused the job")

// NATSConfig configures a NATS target. Subject is required.
type NATSConfig struct {
	// Subject is where jobs are sent: the subject a worker pool
	// queue-subscribes to, or, with JetStream, a subject bound to a
	// stream. No wildcards.
	Subject string
	// Timeout bounds one request (or one JetStream publish and its ack);
	// 0 means DefaultNATSTimeout.
	Timeout time.Duration
	// JetStream publishes the job to a stream (the stream's ack is Done)
	// instead of a request to a worker. The job id becomes Nats-Msg-Id,
	// so the stream drops duplicates within its duplicate window.
	JetStream bool
}

// subjectForm says what ValidSubject accepts.
const subjectForm = "non-empty tokens separated by '.', no spaces, control characters, '*' or '>'"

// ValidSubject reports whether s is a literal NATS subject, one a job can
// be published to: non-empty tokens separated by '.', with no whitespace
// or other control character and no wildcard ('*' and '>' are refused
// anywhere, not only as whole tokens, so that a subject never reads like
// a pattern).
func ValidSubject(s string) bool {
	if s == "" {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return false
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c <= ' ' || c == 0x7f || c == '*' || c == '>' {
				return false
			}
		}
	}
	return true
}

// Validate returns an error naming the first bad field, or nil.
func (c NATSConfig) Validate() error {
	return validateNATSTarget("nats", c.Subject, "Timeout", c.Timeout)
}

// validateNATSTarget checks what a request target (NATSConfig) and a pull
// target (PullConfig) share: a literal subject and a duration that may not
// be negative (the request's Timeout, the pull's Lease). mode names the
// target in the error ("dispatch: <mode>: <field>: ...").
func validateNATSTarget(mode, subject, durField string, d time.Duration) error {
	if subject == "" {
		return fmt.Errorf("dispatch: %s: Subject: required", mode)
	}
	if !ValidSubject(subject) {
		return fmt.Errorf("dispatch: %s: Subject: %q is not a literal subject (%s)", mode, subject, subjectForm)
	}
	if d < 0 {
		return fmt.Errorf("dispatch: %s: %s: %v is negative", mode, durField, d)
	}
	return nil
}

var _ Target = (*NATS)(nil)

// NATS delivers jobs to a worker pool over NATS request/reply, or into a
// JetStream stream. It is safe for concurrent use; it does not own the
// connection.
//
// A request carries the payload and the headers Idempotency-Key,
// Content-Type, Throttler-Lane, Throttler-Key (if any) and
// Throttler-Attempt. The reply's Throttler-Status decides: absent or
// "done" is Done, "retry" is Retry (with Retry-After seconds as
// Result.RetryAfter), "dead" is Dead; any other value is Retry with an
// error. No responders, a timeout or a connection error is Retry; a
// payload over the server's limit is Dead.
type NATS struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	subject string
	timeout time.Duration
}

// NewNATS validates cfg and returns a NATS target on nc.
func NewNATS(nc *nats.Conn, cfg NATSConfig) (*NATS, error) {
	if nc == nil {
		return nil, errors.New("dispatch: nats: nil connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &NATS{nc: nc, subject: cfg.Subject, timeout: cfg.Timeout}
	if n.timeout == 0 {
		n.timeout = DefaultNATSTimeout
	}
	if cfg.JetStream {
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, fmt.Errorf("dispatch: nats: jetstream: %w", err)
		}
		n.js = js
	}
	return n, nil
}

// Deliver sends job to the subject and waits for the worker's reply (or
// the stream's ack), bounded by the configured Timeout and by ctx.
func (n *NATS) Deliver(ctx context.Context, job Job) Result {
	return timed(func() Result { return n.deliver(ctx, job) })
}

func (n *NATS) deliver(ctx context.Context, job Job) Result {
	ctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	msg := nats.NewMsg(n.subject)
	msg.Data = job.Payload
	msg.Header.Set(HeaderIdempotencyKey, job.ID)
	ct := job.ContentType
	if ct == "" {
		ct = DefaultContentType
	}
	msg.Header.Set("Content-Type", ct)
	msg.Header.Set(HeaderLane, job.Lane)
	if job.Key != "" {
		msg.Header.Set(HeaderThrottleKey, job.Key)
		msg.Header.Set(HeaderKey, job.Key) // its name before keyed lanes
	}
	msg.Header.Set(HeaderAttempt, strconv.Itoa(job.Attempt))
	setTraceNATS(msg.Header, job.Trace)

	if n.js != nil {
		if _, err := n.js.PublishMsg(ctx, msg, jetstream.WithMsgID(job.ID)); err != nil {
			return n.failure("publish", err)
		}
		return Result{Verdict: Done}
	}
	reply, err := n.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return n.failure("request", err)
	}
	return n.classify(reply)
}

// failure classifies a failed request or publish.
func (n *NATS) failure(op string, err error) Result {
	err = fmt.Errorf("dispatch: nats %s %s: %w", op, n.subject, err)
	if errors.Is(err, nats.ErrMaxPayload) {
		return Result{Verdict: Dead, Err: err}
	}
	return Result{Verdict: Retry, Err: err}
}

// classify reads a worker's reply.
func (n *NATS) classify(reply *nats.Msg) Result {
	status := strings.ToLower(strings.TrimSpace(reply.Header.Get(HeaderStatus)))
	reason := reply.Header.Get(HeaderError)
	workerErr := func() error {
		if reason == "" {
			return fmt.Errorf("%w: %s: status %q", ErrWorker, n.subject, status)
		}
		return fmt.Errorf("%w: %s: status %q: %s", ErrWorker, n.subject, status, reason)
	}
	switch status {
	case "", "done":
		return Result{Verdict: Done}
	case "retry":
		res := Result{Verdict: Retry, Err: workerErr()}
		if d, ok := parseDeltaSeconds(reply.Header.Get(HeaderRetryAfter)); ok {
			res.RetryAfter = d
		}
		return res
	case "dead":
		return Result{Verdict: Dead, Err: workerErr()}
	}
	return Result{Verdict: Retry, Err: fmt.Errorf("dispatch: nats %s: unknown %s %q in reply", n.subject, HeaderStatus, status)}
}
